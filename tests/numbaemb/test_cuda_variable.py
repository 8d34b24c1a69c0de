"""``Variable(device="cuda")`` against a CPU Variable and a dict oracle.

Runs on a GPU or under the simulator (``NUMBA_ENABLE_CUDASIM=1``); batches stay
small because the simulator runs every CUDA thread as a Python thread.
Initial values are a pure function of (seed, key, column), so a CUDA table and
a CPU table built alike must agree exactly.
"""
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import numbaemb as ne
from numbaemb import initializers as I
from tests.cuda_support import SIMULATOR, needs_cuda
from tests.sizing import examples

pytestmark = [pytest.mark.cuda, needs_cuda]

DIM = 3
INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
EXTREMES = [INT64_MIN, INT64_MAX, -1, 0]


@pytest.fixture(scope="module")
def cuda():
    from jit_kernels import cuda_table
    return cuda_table.cuda_api()


def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def is_device_array(a):
    return bool(getattr(a, "__cuda_ndarray__", False))


def pair(**kw):
    kw = dict(dim=DIM, initializer=I.RandomNormal(0.0, 1.0), seed=11, **kw)
    return ne.Variable(device="cuda", **kw), ne.Variable(**kw)


@pytest.mark.parametrize("num_shards", [1, 3])
@pytest.mark.parametrize("key_dtype", [np.int64, np.int32])
def test_matches_cpu_variable(num_shards, key_dtype):
    gpu, cpu = pair(num_shards=num_shards, key_dtype=key_dtype)
    info = np.iinfo(key_dtype)
    rng = np.random.default_rng(num_shards)
    ext = np.array([info.min, info.max, -1, 0], key_dtype)
    keys = np.concatenate([ext, ext, rng.integers(-50, 50, 60).astype(key_dtype)]).reshape(4, -1)

    got, got_ex = gpu.find_or_insert(keys, return_exists=True)
    want, want_ex = cpu.find_or_insert(keys, return_exists=True)
    assert is_device_array(got) and got.shape == keys.shape + (DIM,)
    np.testing.assert_array_equal(host(got), want)
    # exactly one position of each new key reports the insert on both devices
    assert (~host(got_ex)).sum() == (~want_ex).sum() == len(set(keys.ravel().tolist()))

    vals = rng.standard_normal(keys.shape + (DIM,)).astype(np.float32)
    gpu.upsert(keys, vals)
    cpu.upsert(keys, vals)
    probe = np.concatenate([keys.ravel()[::3], rng.integers(-99, 99, 20).astype(key_dtype)])
    g, ge = gpu.lookup(probe, return_exists=True)
    c, ce = cpu.lookup(probe, return_exists=True)
    np.testing.assert_array_equal(host(g), c)
    np.testing.assert_array_equal(host(ge), ce)

    exists = rng.random(probe.shape[0]) < 0.5
    old, new = vals.reshape(-1, DIM)[:probe.shape[0]], np.ones((probe.shape[0], DIM), np.float32)
    gpu.accum(probe, old, new, exists)
    cpu.accum(probe, old, new, exists)
    gone = keys.ravel()[::4]
    gpu.remove(gone)
    cpu.remove(gone)
    assert gpu.size() == cpu.size()
    assert [gpu.size(i) for i in range(num_shards)] == [cpu.size(i) for i in range(num_shards)]
    gk, gv = gpu.export()
    ck, cv = cpu.export()
    assert is_device_array(gk) and gk.dtype == np.dtype(key_dtype)
    gk, gv = host(gk), host(gv)
    assert sorted(gk.tolist()) == sorted(ck.tolist())
    np.testing.assert_allclose(gv[np.argsort(gk)], cv[np.argsort(ck)], rtol=1e-6)


def test_growth_rehash_and_free_rows():
    gpu, cpu = pair()
    rng = np.random.default_rng(3)
    for step in range(4):
        keys = rng.integers(-300, 300, 120)
        np.testing.assert_array_equal(host(gpu.find_or_insert(keys)), cpu.find_or_insert(keys))
        gone = keys[::2]
        gpu.remove(gone)
        cpu.remove(gone)
        assert gpu.size() == cpu.size()
    shard = gpu.shards[0]
    assert shard.capacity > 16 and shard.n_full + shard.n_deleted <= 0.75 * shard.capacity
    live = host(shard.export_rows()[1])
    free = host(shard.free_rows)
    assert len(set(live.tolist()) | set(free.tolist())) == live.size + free.size == shard.fresh
    gpu.clear()
    assert gpu.size() == 0 and host(gpu.export()[0]).shape == (0,)


def test_lookups_at_high_load_probe_four_slots_a_step(monkeypatch):
    """From X4_LOAD of the index on, lookups read four slots a probe step: the CPU
    table's values and initial values all the same, with tombstones in the chains."""
    from numbaemb import cuda_shard
    steps = []
    real = cuda_shard.k.lookup
    monkeypatch.setattr(cuda_shard.k, "lookup",
                        lambda *a, step=None: steps.append(step) or real(*a, step=step))
    kw = dict(initializer=I.RandomNormal(0.0, 1.0), seed=4, init_size=40)
    gpu, cpu = ne.Variable(3, device="cuda", **kw), ne.Variable(3, **kw)
    cap = gpu.shards[0].capacity
    keys = np.concatenate([[-2**63, 2**63 - 1, -1, 0], np.arange(1, 100) * 7919])
    probe = np.concatenate([keys, np.arange(-50, 50)])
    for n in (int(0.3 * cap), int(0.7 * cap)):
        for v in (gpu, cpu):
            v.find_or_insert(keys[:n])
            v.remove(keys[:n:5])
        load = (gpu.shards[0].n_full + gpu.shards[0].n_deleted) / cap
        assert gpu.shards[0].capacity == cap and load <= cuda_shard.MAX_LOAD
        out, ex = gpu.lookup(probe, return_exists=True)
        want, want_ex = cpu.lookup(probe, return_exists=True)
        np.testing.assert_array_equal(ex.copy_to_host() if hasattr(ex, "copy_to_host") else ex,
                                      want_ex)
        np.testing.assert_array_equal(out.copy_to_host() if hasattr(out, "copy_to_host") else out,
                                      want)
        assert steps[-1] == (4 if load >= cuda_shard.X4_LOAD else 1)
    assert steps == [1, 4]


def test_device_inputs(cuda):
    gpu, cpu = pair(num_shards=2)
    keys = np.array([5, INT64_MIN, 5, 9, -1], np.int64)
    vals = np.arange(15, dtype=np.float32).reshape(5, DIM)
    gpu.upsert(cuda.to_device(keys), cuda.to_device(vals))
    cpu.upsert(keys, vals)
    d32 = cuda.to_device(np.array([5, 9, -1], np.int32))      # int32 keys, int64 table
    np.testing.assert_array_equal(host(gpu.lookup(d32)), cpu.lookup(np.array([5, 9, -1])))
    exists = np.array([True, False, True, True, False])
    gpu.accum(cuda.to_device(keys), cuda.to_device(vals), cuda.to_device(vals + 1),
              cuda.to_device(exists))
    cpu.accum(keys, vals, vals + 1, exists)
    np.testing.assert_array_equal(host(gpu.lookup(keys)), cpu.lookup(keys))
    with pytest.raises(ValueError, match="shape"):
        gpu.upsert(cuda.to_device(keys), cuda.to_device(vals[:4]))
    with pytest.raises(TypeError, match="integers"):
        gpu.lookup(cuda.to_device(np.ones(3)))
    with pytest.raises(TypeError, match="bool"):
        gpu.accum(keys, vals, vals, cuda.to_device(np.ones(5, np.int8)))


def test_int32_table_rejects_out_of_range_device_keys(cuda):
    v = ne.Variable(DIM, key_dtype=np.int32, device="cuda")
    with pytest.raises(ValueError, match="int32"):
        v.lookup(cuda.to_device(np.array([1 << 40], np.int64)))
    assert host(v.lookup(cuda.to_device(np.array([7], np.int64)))).shape == (1, DIM)


def test_hybrid_rows_spill_to_mapped_host_memory():
    row_bytes = DIM * 4
    gpu = ne.Variable(DIM, device="cuda", max_hbm_bytes=20 * row_bytes, seed=3,
                      initializer=I.RandomUniform())
    cpu = ne.Variable(DIM, seed=3, initializer=I.RandomUniform())
    rng = np.random.default_rng(4)
    keys = rng.integers(-10**6, 10**6, 90)
    vals = rng.standard_normal((90, DIM)).astype(np.float32)
    np.testing.assert_array_equal(host(gpu.find_or_insert(keys)), cpu.find_or_insert(keys))
    gpu.upsert(keys[::2], vals[::2])
    cpu.upsert(keys[::2], vals[::2])
    ex = np.ones(90, bool)
    gpu.accum(keys, vals, 2 * vals, ex)
    cpu.accum(keys, vals, 2 * vals, ex)
    np.testing.assert_array_equal(host(gpu.lookup(keys)), cpu.lookup(keys))
    from jit_kernels.cuda_table import SplitRows
    col = gpu.shards[0].values
    assert isinstance(col, SplitRows) and col.split == 20 and col.shape[0] >= 90
    gk, gv = (host(a) for a in gpu.export())
    ck, cv = cpu.export()
    np.testing.assert_array_equal(gv[np.argsort(gk)], cv[np.argsort(ck)])


def test_add_column_on_device():
    gpu = ne.Variable(DIM, device="cuda")
    gpu.upsert(np.array([1, 2]), np.ones((2, DIM)))
    from jit_kernels.initializers import CONSTANT
    gpu.shards[0].add_column("m", 2, np.float32, (CONSTANT, 0.0, 0.0, 0, np.array([4.0, 5.0])))
    k, m = gpu.shards[0].export("m")
    assert host(m).tolist() == [[4.0, 5.0], [4.0, 5.0]]
    gpu.find_or_insert(np.array([3]))
    assert host(gpu.shards[0].export("m")[1]).tolist() == [[4.0, 5.0]] * 3


def test_bad_device_arguments():
    with pytest.raises(ValueError, match="cuda:7"):
        ne.Variable(DIM, device="cuda:7")


# ---- random operation sequences against a dict -------------------------------------------
POOL = EXTREMES + [1, 2, 3, -17, INT64_MIN + 1, INT64_MAX - 1, 1 << 40]
keys_st = st.lists(st.one_of(st.sampled_from(POOL), st.integers(INT64_MIN, INT64_MAX)),
                   min_size=0, max_size=12)
small = st.integers(-8, 8)


class CudaTableMachine(RuleBasedStateMachine):
    NUM_SHARDS = 1

    def __init__(self):
        super().__init__()
        self.var = ne.Variable(DIM, device="cuda", num_shards=self.NUM_SHARDS, seed=5,
                               initializer=I.TruncatedNormal())
        self.ref = ne.Variable(DIM, seed=5, initializer=I.TruncatedNormal())
        self.oracle = {}

    def expected(self, keys):
        out = self.ref.lookup(keys).copy()
        for i, x in enumerate(keys.tolist()):
            if x in self.oracle:
                out[i] = self.oracle[x]
        return out

    @rule(ks=keys_st, data=st.data())
    def upsert(self, ks, data):
        keys = np.array(ks, np.int64)
        vals = np.array(data.draw(st.lists(small, min_size=len(ks) * DIM, max_size=len(ks) * DIM)),
                        np.float32).reshape(-1, DIM)
        self.var.upsert(keys, vals)
        for x, row in zip(ks, vals):
            self.oracle[x] = row

    @rule(ks=keys_st)
    def lookup(self, ks):
        keys = np.array(ks, np.int64)
        got, ex = self.var.lookup(keys, return_exists=True)
        np.testing.assert_array_equal(host(got), self.expected(keys))
        assert host(ex).tolist() == [x in self.oracle for x in ks]

    @rule(ks=keys_st)
    def find_or_insert(self, ks):
        keys = np.array(ks, np.int64)
        want = self.expected(keys)
        np.testing.assert_array_equal(host(self.var.find_or_insert(keys)), want)
        for x, row in zip(ks, want):
            self.oracle.setdefault(x, row)

    @rule(ks=keys_st)
    def remove(self, ks):
        self.var.remove(np.array(ks, np.int64))
        for x in ks:
            self.oracle.pop(x, None)

    @rule(ks=keys_st, data=st.data())
    def accum(self, ks, data):
        n = len(ks)
        keys = np.array(ks, np.int64)
        old = np.array(data.draw(st.lists(small, min_size=n * DIM, max_size=n * DIM)),
                       np.float32).reshape(-1, DIM)
        new = np.array(data.draw(st.lists(small, min_size=n * DIM, max_size=n * DIM)),
                       np.float32).reshape(-1, DIM)
        exists = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
        self.var.accum(keys, old, new, exists)
        for x, o, w, e in zip(ks, old, new, exists):          # the sequential TFRA loop
            if e and x in self.oracle:
                self.oracle[x] = self.oracle[x] + (w - o)
            elif not e and x not in self.oracle:
                self.oracle[x] = w

    @invariant()
    def same_contents(self):
        keys, vals = self.var.export()
        keys, vals = host(keys), host(vals)
        assert sorted(keys.tolist()) == sorted(self.oracle)
        for x, row in zip(keys.tolist(), vals):
            np.testing.assert_array_equal(row, self.oracle[x])
        assert self.var.size() == len(self.oracle)


class CudaShardedMachine(CudaTableMachine):
    NUM_SHARDS = 3


_SETTINGS = settings(max_examples=examples(4 if SIMULATOR else 40), stateful_step_count=8,
                     deadline=None)
TestCudaTable = CudaTableMachine.TestCase
TestCudaTable.settings = _SETTINGS
TestCudaSharded = CudaShardedMachine.TestCase
TestCudaSharded.settings = _SETTINGS


@pytest.mark.parametrize("value_dtype", [np.int8, np.int64])
def test_integer_values_match_cpu_variable(value_dtype):
    """Integer tables (id maps, counters) run the same kernel bodies on the device."""
    gpu = ne.Variable(dim=DIM, device="cuda", value_dtype=value_dtype, initializer=-1)
    cpu = ne.Variable(dim=DIM, value_dtype=value_dtype, initializer=-1)
    keys = np.array(EXTREMES + [5, 5, 9], np.int64)
    vals = np.arange(keys.size * DIM).reshape(-1, DIM).astype(value_dtype)
    for t in (gpu, cpu):
        t.upsert(keys[:4], vals[:4])
        t.find_or_insert(keys)
    np.testing.assert_array_equal(host(gpu.lookup(keys)), cpu.lookup(keys))
    exists = np.ones(keys.size, bool)
    for t in (gpu, cpu):
        old = host(t.lookup(keys))
        t.accum(keys, old, old + 1, exists)
    np.testing.assert_array_equal(host(gpu.lookup(keys)), cpu.lookup(keys))
    assert host(gpu.lookup(keys)).dtype == value_dtype


HALF = [np.float16] + (["bfloat16"] if ne._checks.BFLOAT16 is not None else [])


@pytest.mark.parametrize("value_dtype", HALF)
def test_half_values_match_cpu_variable(value_dtype, cuda):
    """16-bit float tables: initial values, float32 inputs rounded on the device, accum in
    float32 rounded once: the same bits as the CPU table."""
    gpu, cpu = pair(value_dtype=value_dtype, num_shards=2)
    keys = np.array(EXTREMES + [5, 5, 9], np.int64)
    vals = (np.arange(keys.size * DIM).reshape(-1, DIM) / 7).astype(np.float32)
    gpu.upsert(cuda.to_device(keys[:3]), cuda.to_device(vals[:3]))     # float32 on the device
    cpu.upsert(keys[:3], vals[:3])
    for t in (gpu, cpu):
        t.find_or_insert(keys)
    bits = lambda a: host(a).view(np.uint16)                            # noqa: E731
    assert np.array_equal(bits(gpu.lookup(keys)), bits(cpu.lookup(keys)))
    exists = np.ones(keys.size, bool)
    for t in (gpu, cpu):
        old = host(t.lookup(keys))
        t.accum(keys, old, old.astype(np.float32) + np.float32(0.3), exists)
    assert host(gpu.lookup(keys)).dtype == cpu.value_dtype
    assert np.array_equal(bits(gpu.lookup(keys)), bits(cpu.lookup(keys)))
    gk, gv = gpu.export()
    ck, cv = cpu.export()
    assert np.array_equal(bits(gv)[np.argsort(host(gk))], bits(cv)[np.argsort(ck)])
