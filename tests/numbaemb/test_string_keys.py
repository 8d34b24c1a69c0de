"""String keys (``key_dtype="string"``) against a dict oracle.

A hypothesis state machine drives upsert / lookup / find_or_insert / remove / accum /
export / clear / optimizer steps / save + load (into another shard count) with keys
drawn from a pool that always holds the awkward ones (empty, NUL bytes, a
string that is a prefix of another, 64- and 65-byte strings, non-ASCII) plus
arbitrary bytes.  Two machines: real fingerprints, and fingerprints forced to
collide (``level0_ids`` mod 3), which drives every string past level 0 and the
byte comparison that tells colliding strings apart.
"""
import os
import shutil
import tempfile
from unittest import mock

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import numbaemb as ne
from jit_kernels import strings as ks
from numbaemb import initializers as I
from numbaemb import optimizers as O
from numbaemb import string_keys
from tests.cuda_support import needs_cuda
from tests.sizing import examples

DIM = 2
POOL = [b"", b"\x00", b"\x00\x00", b"a", b"a\x00", b"ab", "héllo".encode(), b"x" * 64,
        b"x" * 65, b"y" * 200, b"user:1", b"user:10", bytes(range(256))]


def colliding_level0(buf, starts):
    return ks.level0_ids(buf, starts) % 3


def as_obj(items):
    out = np.empty(len(items), object)
    out[:] = items
    return out


def host(a):
    """numpy of a result (a GPU table's are device arrays)."""
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


class StringMachine(RuleBasedStateMachine):
    NUM_SHARDS = 1
    COLLIDE = False
    DEVICE = "cpu"

    def __init__(self):
        super().__init__()
        self._patch = None
        if self.COLLIDE:
            self._patch = mock.patch.object(string_keys, "level0_ids", colliding_level0)
            self._patch.start()
        self.init = I.Constant(0.5) if self.COLLIDE else I.RandomNormal(seed=5)
        self.var = ne.Variable(DIM, key_dtype="string", num_shards=self.NUM_SHARDS,
                               initializer=self.init, device=self.DEVICE)
        self.ref = ne.Variable(DIM, initializer=self.init)     # initial rows by id
        self.oracle = {}
        self.tmp = tempfile.mkdtemp(prefix="numbaemb_str_")

    def teardown(self):
        try:
            self.check_export()
        finally:
            if self._patch is not None:
                self._patch.stop()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def draw_keys(self, data, max_size=8):
        elem = st.one_of(st.sampled_from(POOL), st.binary(max_size=70))
        return as_obj(data.draw(st.lists(elem, max_size=max_size), label="keys"))

    def draw_values(self, data, n, label="values"):
        xs = data.draw(st.lists(st.integers(-8, 8), min_size=n * DIM, max_size=n * DIM),
                       label=label)
        return np.array(xs, np.float32).reshape(n, DIM)

    def initial(self, keys):
        if self.COLLIDE:
            return np.full((len(keys), DIM), 0.5, np.float32)
        buf, starts = ks.pack(keys)
        return self.ref.lookup(ks.level0_ids(buf, starts))    # ids: fingerprints (no clashes)

    def expected(self, keys):
        out = self.initial(keys)
        exists = np.array([k in self.oracle for k in keys.tolist()], bool)
        for i, k in enumerate(keys.tolist()):
            if exists[i]:
                out[i] = self.oracle[k]
        return out, exists

    def check_export(self):
        keys, vals = self.var.export()
        vals = host(vals)
        assert keys.dtype == object and all(type(k) is bytes for k in keys.tolist())
        got = dict(zip(keys.tolist(), map(tuple, vals.tolist())))
        assert len(got) == len(keys) == len(self.oracle)
        assert got == {k: tuple(v.tolist()) for k, v in self.oracle.items()}

    @initialize()
    def start(self):
        keys = as_obj(POOL[:4])
        vals = np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM)
        self.var.upsert(keys, vals)
        self.oracle.update(zip(POOL[:4], vals))

    @rule(data=st.data())
    def upsert(self, data):
        keys = self.draw_keys(data)
        vals = self.draw_values(data, len(keys))
        self.var.upsert(keys, vals)
        self.oracle.update(zip(keys.tolist(), vals))

    @rule(data=st.data(), as_str=st.booleans())
    def lookup(self, data, as_str):
        keys = self.draw_keys(data)
        want, want_exists = self.expected(keys)
        query = keys
        if as_str and all(self._utf8(k) for k in keys.tolist()):
            query = np.array([k.decode() for k in keys.tolist()], object)   # str: UTF-8
        got, exists = (host(a) for a in self.var.lookup(query, return_exists=True))
        np.testing.assert_array_equal(exists, want_exists)
        np.testing.assert_array_equal(got, want)
        assert self.var.size() == len(self.oracle)

    @staticmethod
    def _utf8(b):
        try:
            b.decode()
            return True
        except UnicodeDecodeError:
            return False

    @rule(data=st.data())
    def find_or_insert(self, data):
        keys = self.draw_keys(data)
        want, _ = self.expected(keys)
        np.testing.assert_array_equal(host(self.var.find_or_insert(keys)), want)
        for k, row in zip(keys.tolist(), want):
            self.oracle.setdefault(k, row.copy())

    @rule(data=st.data())
    def remove(self, data):
        keys = self.draw_keys(data)
        if self.oracle and data.draw(st.booleans(), label="present ones"):
            keys = as_obj(list(self.oracle)[: len(keys) + 1])
        self.var.remove(keys)
        for k in keys.tolist():
            self.oracle.pop(k, None)

    @rule(data=st.data())
    def accum(self, data):
        keys = self.draw_keys(data)
        old, new = self.draw_values(data, len(keys), "old"), self.draw_values(data, len(keys), "new")
        ex = np.array(data.draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)),
                                label="exists"), bool)
        self.var.accum(keys, old, new, ex)
        for p, (k, e) in enumerate(zip(keys.tolist(), ex)):
            if e and k in self.oracle:
                self.oracle[k] = self.oracle[k] + (new[p] - old[p])
            elif not e and k not in self.oracle:
                self.oracle[k] = new[p].copy()

    @rule(data=st.data())
    def sgd_step(self, data):
        keys = self.draw_keys(data)
        grads = self.draw_values(data, len(keys), "grads")
        want, _ = self.expected(keys)
        sums = {}
        for k, g in zip(keys.tolist(), grads):
            sums[k] = sums.get(k, 0) + g
        O.apply_gradients(self.var, O.SGD(), keys, grads, step=1, learning_rate=1.0)
        for k, g in sums.items():
            base = self.oracle.get(k)
            if base is None:
                base = want[keys.tolist().index(k)]
            self.oracle[k] = (base - g).astype(np.float32)

    @rule()
    def export(self):
        self.check_export()

    @rule(go=st.integers(0, 3))
    def clear(self, go):
        if go == 0:
            self.var.clear()
            self.oracle.clear()

    @rule(seed=st.integers(0, 2 ** 32 - 1), n=st.sampled_from([300, 2000]))
    def bulk(self, seed, n):
        rng = np.random.default_rng(seed)
        lens = rng.integers(0, 40, n)
        keys = as_obj([rng.bytes(int(m)) for m in lens])
        vals = rng.integers(-9, 9, (n, DIM)).astype(np.float32)
        self.var.upsert(keys, vals)
        self.oracle.update(zip(keys.tolist(), vals))
        gone = keys[rng.permutation(n)[: n // 2]]
        self.var.remove(gone)
        for k in gone.tolist():
            self.oracle.pop(k, None)

    @rule(n=st.sampled_from([None, 1, 3]), go=st.integers(0, 2))
    def save_load(self, n, go):
        if go:
            return
        path = os.path.join(self.tmp, "t.nbe")
        self.var.save(path)
        loaded = ne.Variable.load(path, num_shards=n)
        assert isinstance(loaded, string_keys.StringVariable) and loaded.device == self.var.device
        assert loaded.key_dtype == np.dtype(object)
        self.var = loaded
        self.check_export()

    @invariant()
    def sizes_agree(self):
        assert self.var.size() == len(self.oracle)
        # every row has its name; an accum that inserted nothing may leave extra names
        assert len(self.var.names) >= self.var.size()


def make(num_shards, collide, device="cpu"):
    m = type(f"Strings_{num_shards}_{'collide' if collide else 'real'}_{device}",
             (StringMachine,), dict(NUM_SHARDS=num_shards, COLLIDE=collide, DEVICE=device))
    case = m.TestCase
    case.settings = settings(stateful_step_count=20)
    if device != "cpu":     # the simulator runs a Python thread a CUDA thread: fewer, shorter
        case.settings = settings(max_examples=examples(4), stateful_step_count=10)
        case.pytestmark = [pytest.mark.cuda, needs_cuda]
    return case


TestStringsReal = make(1, False)
TestStringsColliding = make(3, True)
TestStringsOnGpu = make(2, True, "cuda")      # string keys on a GPU table: ids on the device


# ---- fixed cases -------------------------------------------------------------------------
def test_fingerprint_is_tensorflows():
    """Level-0 ids are TF's ``to_hash_bucket_fast(s, 2**63 - 1)`` (FarmHash Fingerprint64)
    at every length band of FarmHash (0-3, 4-7, 8-16, 17-32, 33-64, 65+ bytes)."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(1)
    strs = [rng.bytes(n) for n in list(range(0, 200)) * 2] + [b"", b"\x00", "é".encode()]
    buf, starts = ks.pack(strs)
    want = tf.strings.to_hash_bucket_fast(tf.constant(strs), 2 ** 63 - 1).numpy()
    np.testing.assert_array_equal(ks.level0_ids(buf, starts), want)


def test_colliding_strings_keep_their_own_rows():
    with mock.patch.object(string_keys, "level0_ids",
                           lambda buf, starts: np.zeros(starts.shape[0] - 1, np.int64)):
        v = ne.Variable(1, key_dtype="string")
        keys = as_obj([b"a", b"b", b"c"])          # one fingerprint for all three
        v.upsert(keys, np.array([[1.0], [2.0], [3.0]]))
        assert v.lookup(keys).ravel().tolist() == [1.0, 2.0, 3.0]
        ids = v.ids(keys)
        assert ids[0] == 0 and (ids[1:] < 0).all() and len(set(ids.tolist())) == 3
        v.remove(as_obj([b"a"]))                   # level 0 frees: b and c stay reachable
        assert v.lookup(keys, return_exists=True)[1].tolist() == [False, True, True]
        v.upsert(as_obj([b"c"]), np.array([[9.0]]))  # c is found deep, not re-added at level 0
        assert v.size() == 2 and v.lookup(as_obj([b"c"])).ravel().tolist() == [9.0]
        assert sorted(v.export()[0].tolist()) == [b"b", b"c"]


def test_all_candidates_taken_raises_and_changes_nothing():
    def level0(buf, starts):
        return np.zeros(starts.shape[0] - 1, np.int64)

    def deep(buf, starts, which, level):
        return np.full(which.shape[0], -1, np.int64)        # one id for every level

    with mock.patch.object(string_keys, "level0_ids", level0), \
            mock.patch.object(string_keys, "deep_ids", deep):
        v = ne.Variable(1, key_dtype="string")
        v.upsert(as_obj([b"a", b"b"]), np.ones((2, 1)))   # b: level 0 taken, level 1 free
        with pytest.raises(ValueError, match="candidate ids"):
            v.upsert(as_obj([b"c"]), np.ones((1, 1)))
        assert v.size() == 2 and len(v.names) == 2


def test_bad_string_keys_raise_dtype_errors():
    v = ne.Variable(2, key_dtype="string")
    with pytest.raises(ne.DtypeError, match="keys must hold strings"):
        v.lookup(np.array([1.5]))
    with pytest.raises(ne.DtypeError, match="bytes or str, got int"):
        v.upsert(as_obj([b"a", 3]), np.ones((2, 2)))
    for lone in (as_obj(["ok", "a\ud800"]), np.array(["\udfff"])):   # no UTF-8 for these
        with pytest.raises(ValueError, match="keys: strings must be bytes or str that UTF-8"):
            v.find_or_insert(lone)
    assert v.size() == 0 and len(v.names) == 0
    with pytest.raises(ValueError, match="string keys"):
        ne.Variable(2, key_dtype="string", comm=_FakeComm())


class _FakeComm:            # a two-rank communicator, as far as the check looks
    Alltoallv = None

    def Get_size(self):
        return 2


def test_arena_is_compacted_after_removals():
    v = ne.Variable(1, key_dtype="string")
    keys = as_obj([b"k%07d" % i + b"." * 100 for i in range(20000)])
    v.upsert(keys, np.zeros((20000, 1)))
    used = v.names._used
    v.remove(keys[:15000])
    assert v.names._used < used / 2 and v.names._garbage < used / 2
    assert sorted(v.export()[0].tolist()) == sorted(keys[15000:].tolist())


def test_corrupt_names_in_a_checkpoint_are_refused(tmp_path):
    import zipfile
    v = ne.Variable(1, key_dtype="string")
    v.upsert(as_obj([b"a", b"bc"]), np.ones((2, 1)))
    path = tmp_path / "s.nbe"
    v.save(path)
    bad = tmp_path / "bad.nbe"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "names/bytes.npy":
                data = data[:-1] + b"z"                  # a byte of a key changed
            dst.writestr(item, data)
    with pytest.raises(ValueError):
        ne.Variable.load(bad)


def test_rows_by_id_need_a_registered_string():
    v = ne.Variable(DIM, key_dtype="string")
    stray = np.array([12345], np.int64)
    with pytest.raises(ValueError, match="belong to no string"):
        v.upsert(stray, np.ones((1, DIM), np.float32))
    assert v.size() == 0
    ids = v.ids(as_obj([b"kept", b"gone"]), insert=True)        # registers both
    v.upsert(ids, np.full((2, DIM), 3.0, np.float32))           # rows by id
    assert sorted(v.export()[0].tolist()) == [b"gone", b"kept"]
    v.remove(as_obj([b"gone"]))
    with pytest.raises(ValueError, match="belong to no string"):   # its id went with it
            O.apply_gradients(v, O.SGD(), ids, np.ones((2, DIM), np.float32), step=1,
                              learning_rate=0.1)
    np.testing.assert_array_equal(v.lookup(as_obj([b"kept"])), [[3.0, 3.0]])
    assert v.export()[0].tolist() == [b"kept"]
