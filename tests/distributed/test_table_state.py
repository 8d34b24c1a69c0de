"""Random sequences of collective table ops against one process fed the concatenation.

A hypothesis state machine drives find_or_insert / lookup (with and without
``return_exists``) / upsert / accum / remove / apply_gradients (Adam, Adagrad) /
clear / save + load (into this world, into one process) on a table split across
the ranks, and the same ops on a one-process table fed the ranks' batches
concatenated in rank order.  Every result, every rank's rows after each step
(exported and merged), the global size and the optimizer slots must be equal bit
for bit: keys come from a pool that always holds the extremes (INT64_MIN,
INT64_MAX, -1, 0), values and gradients are small integers, so every sum is
exact whatever the order.  Two machines: int64 keys, one local shard, SOK's
owner rule; int32 keys, two local shards, a custom partitioner.
"""
import shutil

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

import numbaemb as ne
from tests.cuda_support import float_gap

from .conftest import COMM, RANK, WORLD, agree, multi_rank

pytestmark = multi_rank
DIM = 3
OPTS = [ne.optimizers.Adam(learning_rate=0.5), ne.optimizers.Adagrad(learning_rate=0.25)]


def pool(dtype):
    info = np.iinfo(dtype)
    return [int(info.min), int(info.max), -1, 0, 1, 2, 3, 7, int(info.min) + 1,
            int(info.max) - 1, 1 << 20, -(1 << 20), 12345]


def by_seven(keys, n):
    return (keys.astype(np.int64) // 7) % n


class DistributedTable(RuleBasedStateMachine):
    key_dtype, num_shards, partitioner = np.int64, 1, None
    checks = 0          # invariant checks run (the test asserts the machine did run)
    same = staticmethod(np.array_equal)     # rows and slots: bit for bit

    def __init__(self):
        super().__init__()
        kw = dict(key_dtype=self.key_dtype, name="state",
                  initializer=ne.initializers.RandomNormal(stddev=1.0, seed=11))
        self.v = self.make(kw)
        self.ref = ne.Variable(DIM, **kw)
        self.step = 0
        self.used = set()
        self.dirs = []

    def make(self, kw):
        """The split table under test."""
        return ne.Variable(DIM, comm=COMM, num_shards=self.num_shards,
                           partitioner=self.partitioner, **kw)

    @staticmethod
    def host(a):
        """A result of the split table as a NumPy array."""
        return a

    def teardown(self):
        if RANK == 0:
            for d in self.dirs:
                shutil.rmtree(d, ignore_errors=True)

    keys = st.lists(st.sampled_from(pool(np.int32)) | st.sampled_from(pool(np.int64)),
                    max_size=7)

    def batches(self, draw_keys):
        mine = np.array(draw_keys[RANK], np.int64).astype(self.key_dtype)
        every = np.concatenate([np.array(b, np.int64) for b in draw_keys]).astype(self.key_dtype)
        lo = sum(len(b) for b in draw_keys[:RANK])
        return mine, every, slice(lo, lo + len(draw_keys[RANK]))

    def fit(self, b):
        """Keys of the pool that fit the key dtype (int32 tables drop the others)."""
        info = np.iinfo(self.key_dtype)
        return [[k for k in keys if info.min <= k <= info.max] for keys in b]

    @rule(b=st.lists(keys, min_size=WORLD, max_size=WORLD), exists=st.booleans(),
          op=st.sampled_from(["find_or_insert", "lookup"]))
    def read(self, b, exists, op):
        mine, every, part = self.batches(self.fit(b))
        got = getattr(self.v, op)(mine, return_exists=exists)
        want = getattr(self.ref, op)(every, return_exists=exists)
        if exists:
            agree(np.array_equal(self.host(got[1]), want[1][part]), f"exists of {op}")
            got, want = got[0], want[0]
        got = self.host(got)
        agree(self.same(got, want[part]), lambda: f"rows of {op}: {float_gap(got, want[part])}")

    @rule(b=st.lists(keys, min_size=WORLD, max_size=WORLD), seed=st.integers(0, 99))
    def upsert(self, b, seed):
        mine, every, part = self.batches(self.fit(b))
        vals = np.random.default_rng(seed).integers(-9, 9, (every.shape[0], DIM)).astype(np.float32)
        self.v.upsert(mine, vals[part])
        self.ref.upsert(every, vals)

    @rule(b=st.lists(keys, min_size=WORLD, max_size=WORLD), seed=st.integers(0, 99))
    def accum(self, b, seed):
        mine, every, part = self.batches(self.fit(b))
        rng = np.random.default_rng(seed)
        old, new = (rng.integers(-9, 9, (every.shape[0], DIM)).astype(np.float32) for _ in "on")
        flags = rng.random(every.shape[0]) < 0.5
        self.v.accum(mine, old[part], new[part], flags[part])
        self.ref.accum(every, old, new, flags)

    @rule(b=st.lists(keys, min_size=WORLD, max_size=WORLD))
    def remove(self, b):
        mine, every, _ = self.batches(self.fit(b))
        self.v.remove(mine)
        self.ref.remove(every)

    @rule(b=st.lists(keys, min_size=WORLD, max_size=WORLD), seed=st.integers(0, 99),
          which=st.sampled_from([0, 1]))
    def apply_gradients(self, b, seed, which):
        mine, every, part = self.batches(self.fit(b))
        grads = np.random.default_rng(seed).integers(-3, 4, (every.shape[0], DIM)).astype(np.float32)
        self.step += 1
        opt = OPTS[which]
        self.used.add(which)
        ne.optimizers.apply_gradients(self.v, opt, mine, grads[part], step=self.step)
        ne.optimizers.apply_gradients(self.ref, opt, every, grads, step=self.step)

    @rule()
    def clear(self):
        self.v.clear()
        self.ref.clear()

    @precondition(lambda self: len(self.dirs) < 3)
    @rule(one_process=st.booleans())
    def save_and_load(self, one_process):
        import tempfile
        d = COMM.bcast(tempfile.mkdtemp() if RANK == 0 else None)
        self.dirs.append(d)
        self.v.save(d)
        if one_process:          # every rank reads every part into one plain table
            w = ne.Variable.load(d, partitioner=self.partitioner and by_seven)
            agree(type(w) is ne.Variable and w.size() == self.ref.size(), "one-process load")
            self.check_rows(w.export(), self.ref.export())
        else:
            self.v = ne.Variable.load(d, comm=COMM, partitioner=self.partitioner)

    def check_rows(self, got, want):
        gk, gv = got
        wk, wv = want
        go, wo = np.argsort(gk, kind="stable"), np.argsort(wk, kind="stable")
        agree(np.array_equal(gk[go], wk[wo]) and self.same(gv[go], wv[wo]),
              lambda: f"rows: {float_gap(gv[go], wv[wo])}")

    @invariant()
    def same_table(self):
        type(self).checks += 1
        agree(self.v.size() == self.ref.size(), "global size")
        keys, vals = (self.host(a) for a in self.v.export())
        owner = (self.partitioner or ne.default_partitioner)(keys, WORLD)
        agree((owner == RANK).all(), "a rank holds keys it does not own")
        parts = COMM.allgather((keys, vals))
        self.check_rows((np.concatenate([p[0] for p in parts]),
                         np.concatenate([p[1] for p in parts])), self.ref.export())
        every = np.array(pool(self.key_dtype), self.key_dtype)
        for which in sorted(self.used):
            opt = OPTS[which]
            for slot, _ in opt.slots():
                got = self.host(ne.optimizers.slot_values(self.v, opt, slot, every))
                want = ne.optimizers.slot_values(self.ref, opt, slot, every)
                agree(self.same(got, want), lambda: f"slot {slot}: {float_gap(got, want)}")


class Int32TwoShardsCustomPartitioner(DistributedTable):
    key_dtype, num_shards = np.int32, 2
    partitioner = staticmethod(by_seven)


@pytest.mark.parametrize("machine", [DistributedTable, Int32TwoShardsCustomPartitioner])
def test_equals_one_process(machine):
    machine.checks = 0
    run_state_machine_as_test(machine, settings=settings.get_profile("mpi"))
    ran = COMM.allgather(machine.checks)
    assert len(set(ran)) == 1 and ran[0] >= settings.get_profile("mpi").max_examples, ran
