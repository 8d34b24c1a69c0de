"""16-bit float tables (float16, bfloat16) against a float32 oracle.

The oracle is a dict of float32 rows plus a float32 table of the same initializer;
every value the 16-bit table holds is the oracle's value rounded once to the
16-bit format (NumPy's / ml_dtypes' round-to-nearest-even cast).  Optimizer steps
run on a float32 twin whose rows are first set to the 16-bit table's (so both
compute from the same numbers) and rounded once after the step: the 16-bit table
must give the same bits.  A hypothesis state machine drives upsert / lookup /
find_or_insert / remove / accum / optimizer steps / export / save + load into
another shard count, extreme keys always in play.
"""
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import numbaemb as ne
from numbaemb import _checks
from numbaemb import initializers as I
from numbaemb import optimizers as O
from tests.sizing import examples

DIM = 3
I64 = np.iinfo(np.int64)
EXTREME = [int(I64.min), int(I64.max), -1, 0]
DTYPES = [np.dtype(np.float16)] + ([_checks.BFLOAT16] if _checks.BFLOAT16 is not None else [])
keys_st = st.lists(st.sampled_from(EXTREME) | st.integers(-20, 20), min_size=1, max_size=6)
# values that exercise rounding, overflow to inf, subnormals and signed zeros
value_st = st.sampled_from([0.0, -0.0, 1.0, 1.0009765625, 1.00048828125, 3.14159, -2.5e-7,
                            6.1e-5, 65504.0, 65520.0, 1e30, -1e-30, 123.456])
OPTIMIZERS = [O.SGD(0.1, momentum=0.9, nesterov=True), O.Adam(0.01, amsgrad=True),
              O.Adagrad(0.1), O.Ftrl(0.1, l1_regularization_strength=0.01), O.RMSprop(0.01, momentum=0.5, centered=True)]


def bits(a):
    return np.asarray(a).view(f"u{np.asarray(a).dtype.itemsize}")


class HalfMachine(RuleBasedStateMachine):
    DTYPE = DTYPES[0]

    def __init__(self):
        super().__init__()
        self.init = I.RandomNormal(mean=0.5, stddev=2.0, seed=11)
        self.var = ne.Variable(DIM, value_dtype=self.DTYPE, initializer=self.init, num_shards=2)
        self.twin = ne.Variable(DIM, initializer=self.init)          # float32: the math
        self.fresh = ne.Variable(DIM, initializer=self.init)         # never written: initials
        self.oracle = {}                                              # key -> float32 row
        self.opt = OPTIMIZERS[0]
        self.step = 0
        self.tmp = tempfile.mkdtemp(prefix="numbaemb_half_")

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def rounded(self, rows):
        return np.asarray(rows, np.float32).astype(self.DTYPE)

    def initial(self, keys):
        return self.rounded(self.fresh.lookup(np.array(keys, np.int64)))

    def expected(self, keys):
        init = self.initial(keys)
        return np.stack([self.rounded(self.oracle[k]) if k in self.oracle else init[i]
                         for i, k in enumerate(keys)])

    @rule(keys=keys_st, data=st.data())
    def upsert(self, keys, data):
        vals = np.array([[data.draw(value_st) for _ in range(DIM)] for _ in keys], np.float32)
        self.var.upsert(np.array(keys), vals)
        for k, row in zip(keys, self.rounded(vals).astype(np.float32)):
            self.oracle[k] = row

    @rule(keys=keys_st)
    def lookup(self, keys):
        got, exists = self.var.lookup(np.array(keys), return_exists=True)
        assert got.dtype == self.DTYPE
        assert np.array_equal(bits(got), bits(self.expected(keys)))
        assert exists.tolist() == [k in self.oracle for k in keys]

    @rule(keys=keys_st)
    def find_or_insert(self, keys):
        want = self.expected(keys)
        got = self.var.find_or_insert(np.array(keys))
        assert np.array_equal(bits(got), bits(want))
        for k, row in zip(keys, want.astype(np.float32)):
            self.oracle.setdefault(k, row)

    @rule(keys=keys_st)
    def remove(self, keys):
        self.var.remove(np.array(keys))
        self.twin.remove(np.array(keys))                 # its slots go too
        for k in keys:
            self.oracle.pop(k, None)

    @rule(keys=keys_st, delta=value_st, flags=st.lists(st.booleans(), min_size=6, max_size=6))
    def accum(self, keys, delta, flags):
        old = self.var.lookup(np.array(keys))
        new = old.astype(np.float32) + np.float32(delta)
        exists = np.array(flags[:len(keys)])
        self.var.accum(np.array(keys), old, new, exists)
        new16 = self.rounded(new).astype(np.float32)                 # inputs as the table holds
        old32 = old.astype(np.float32)
        for i, k in enumerate(keys):                                 # TFRA's rule, in order
            if exists[i] and k in self.oracle:
                row = self.oracle[k] + (new16[i] - old32[i])
                self.oracle[k] = self.rounded(row).astype(np.float32)
            elif not exists[i] and k not in self.oracle:
                self.oracle[k] = new16[i]

    @rule(keys=keys_st, which=st.integers(0, len(OPTIMIZERS) - 1), data=st.data())
    def train(self, keys, which, data):
        if self.step == 0:
            self.opt = OPTIMIZERS[which]                # one optimizer a table (its slots)
        self.step += 1
        grads = np.array([[data.draw(st.floats(-4, 4, width=32)) for _ in range(DIM)]
                          for _ in keys], np.float32)
        ids = np.array(keys)
        self.twin.upsert(ids, self.var.lookup(ids).astype(np.float32))   # same start rows
        O.apply_gradients(self.var, self.opt, ids, grads, step=self.step)
        O.apply_gradients(self.twin, self.opt, ids, grads, step=self.step)
        after = self.twin.lookup(ids)
        for k, row in zip(keys, after):
            self.oracle[k] = self.rounded(row).astype(np.float32)
        self.twin.upsert(ids, np.stack([self.oracle[k] for k in keys]))
        slots = O.slot_values(self.var, self.opt, self.opt.slots()[0][0], ids)
        assert slots.dtype == np.float32                             # slots stay float32
        assert np.array_equal(slots, O.slot_values(self.twin, self.opt,
                                                   self.opt.slots()[0][0], ids))

    @rule(shards=st.integers(1, 3))
    def save_load(self, shards):
        path = f"{self.tmp}/t.nbe"
        self.var.save(path)
        self.var = ne.Variable.load(path, num_shards=shards)
        assert self.var.value_dtype == self.DTYPE

    @invariant()
    def export_matches(self):
        keys, rows = self.var.export()
        assert rows.dtype == self.DTYPE
        assert sorted(int(k) for k in keys) == sorted(self.oracle)
        if keys.size:
            assert np.array_equal(bits(rows), bits(self.expected([int(k) for k in keys])))


def machine(dtype):
    cls = type(f"Half_{dtype.name}", (HalfMachine,), {"DTYPE": dtype})
    test = cls.TestCase
    test.settings = settings(max_examples=examples(25), stateful_step_count=15, deadline=None)
    return test


TestFloat16 = machine(DTYPES[0])
if len(DTYPES) > 1:
    TestBfloat16 = machine(DTYPES[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_half_tables_take_half_the_memory(dtype):
    v = ne.Variable(64, value_dtype=dtype, init_size=1000)
    w = ne.Variable(64, init_size=1000)
    assert v.shards[0].values.nbytes * 2 == w.shards[0].values.nbytes


def test_bfloat16_without_ml_dtypes_says_so(monkeypatch):
    monkeypatch.setattr(_checks, "BFLOAT16", None)
    with pytest.raises(ne.DtypeError, match="ml_dtypes"):
        ne.Variable(2, value_dtype="bfloat16")
