"""``Variable(device="cuda", max_capacity=...)`` against the same CPU table.

Every bounded kernel runs the CPU's body (``jit_kernels.cuda_bounded``), so after
the same calls a CUDA bounded table must hold the CPU one's index, scores, values
and optimizer slots bit for bit, and report the same evictions.  GPU or simulator
(small batches: the simulator runs a Python thread per CUDA thread).
"""
import numpy as np
import pytest

import numbaemb as ne
from jit_kernels import bounded as kb
from numbaemb import initializers as I
from numbaemb import optimizers as O
from tests.cuda_support import assert_same_floats, needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]
EXTREMES = [-2**63, 2**63 - 1, -1, 0]


def host(a):
    if hasattr(a, "head"):                  # hybrid storage (cuda_table.SplitRows)
        return np.concatenate([host(a.head), host(a.tail)])
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def pair(max_hbm_bytes=None, **kw):
    kw = dict(dim=3, initializer=I.RandomNormal(0.0, 1.0), seed=5, **kw)
    return ne.Variable(device="cuda", max_hbm_bytes=max_hbm_bytes, **kw), ne.Variable(**kw)


def same_state(gpu, cpu):
    g, c = gpu.shards[0], cpu.shards[0]
    for name in ("slots", "mscore", "mark", "free_rows"):
        np.testing.assert_array_equal(host(getattr(g, name)), getattr(c, name), err_msg=name)
    assert (g.n_full, g.n_deleted, g.fresh) == (c.n_full, c.n_deleted, c.fresh)
    for name, col in c.columns.items():
        n = c.fresh
        assert_same_floats(host(g.columns[name].data)[:n], col.data[:n], err_msg=name)
    assert gpu.size() == cpu.size() <= cpu.max_capacity


WINDOWS = pytest.mark.parametrize("window", [8, "bucket"])   # a window of slots; a bucketed index


@WINDOWS
@pytest.mark.parametrize("policy", sorted(kb.POLICIES))
def test_same_calls_same_table_as_the_cpu(policy, window):
    gpu, cpu = pair(max_capacity=40, evict=policy, evict_window=window)
    rng = np.random.default_rng(len(policy))
    evicted = 0
    for step in range(8):
        if policy.startswith("epoch") and step == 4:
            gpu.set_epoch(3)
            cpu.set_epoch(3)
        keys = np.concatenate([EXTREMES, rng.integers(-40, 60, 26)]).astype(np.int64)
        rng.shuffle(keys)
        sc = rng.integers(0, 50, keys.shape[0]) if policy == "custom" else None
        want = cpu.find_or_insert(keys, return_exists=True, return_evicted=True, scores=sc)
        got = gpu.find_or_insert(keys, return_exists=True, return_evicted=True, scores=sc)
        for name, a, b in zip(("values", "exists", "evicted keys", "evicted values"), got, want):
            np.testing.assert_array_equal(host(a), b, err_msg=f"step {step}: {name}")
        evicted += want[2].shape[0]
        vals = rng.standard_normal((6, 3)).astype(np.float32)
        part = None if sc is None else sc[:6]
        gpu.upsert(keys[:6], vals, scores=part)
        cpu.upsert(keys[:6], vals, scores=part)
        if step % 3 == 2:
            assert gpu.remove(keys[6:12]) is None and cpu.remove(keys[6:12]) is None
        same_state(gpu, cpu)
    np.testing.assert_array_equal(host(gpu.lookup(keys)), cpu.lookup(keys))
    assert evicted > 10


@pytest.mark.parametrize("hybrid, window", [(False, 4), (True, 4), (False, "bucket"),
                                            (True, "bucket")],
                         ids=["device", "hybrid", "bucket", "hybrid-bucket"])
def test_optimizer_steps_on_the_device_match_the_cpu(hybrid, window):
    """Adam steps on more ids than fit: evictions take the slots with them; ids the
    LFU table does not admit drop their gradients (rows -1 in the device's update).
    Hybrid storage: 120 bytes a column's rows in device memory (10 rows of values, 3
    once the slots count), the rest but the scores in mapped host memory."""
    rule = O.Adam(0.1)
    gpu, cpu = pair(max_capacity=24, evict="lfu", evict_window=window,
                    max_hbm_bytes=120 if hybrid else None)
    rng = np.random.default_rng(1)
    for step in range(1, 7):
        ids = np.concatenate([EXTREMES, rng.integers(-30, 30, 20)]).astype(np.int64)
        grads = rng.standard_normal((ids.shape[0], 3)).astype(np.float32)
        O.apply_gradients(gpu, rule, ids, grads, step=step)
        O.apply_gradients(cpu, rule, ids, grads, step=step)
        same_state(gpu, cpu)
    keys = host(gpu.export()[0])
    assert_same_floats(host(gpu.lookup(keys)), cpu.lookup(keys))
    ev = gpu.find_or_insert(np.arange(100, 140), return_evicted="columns")[1:]
    want = cpu.find_or_insert(np.arange(100, 140), return_evicted="columns")[1:]
    np.testing.assert_array_equal(host(ev[0]), want[0])
    assert set(ev[1]) == set(want[1]) and len(want[1]) == 2 + len(rule.slots())
    for name, col in want[1].items():
        assert_same_floats(host(ev[1][name]), col, err_msg=name)
    keys = np.concatenate([EXTREMES, np.arange(90, 130)]).astype(np.int64)
    args = [rng.standard_normal((keys.shape[0], 3)).astype(np.float32) for _ in range(2)]
    exists = rng.random(keys.shape[0]) < 0.5
    gpu.accum(keys, *args, exists)
    cpu.accum(keys, *args, exists)
    same_state(gpu, cpu)
    split = {name: hasattr(col.data, "head") for name, col in gpu.shards[0].columns.items()}
    assert split == {name: hybrid and name != "score" for name in split}


def test_a_table_runs_its_ranges_as_the_cpu_does(monkeypatch):
    """Batches into a filling table and a full one cut into ranges (thresholds
    lowered: the simulator's block-wide scans take seconds a launch on 2,000
    positions)."""
    monkeypatch.setattr(kb, "RANGES_MIN", 64)
    monkeypatch.setattr(kb, "RANGE_SLOTS", 64)
    gpu, cpu = pair(max_capacity=250, evict="lru", evict_window=2)
    assert kb.ranges_for(cpu.shards[0].capacity, 2) == 4
    rng = np.random.default_rng(2)
    fill = rng.integers(-2**40, 2**40, 300)
    for part in (fill[:200], fill[200:]):       # a fill in ranges, then the serial pass
        gpu.find_or_insert(part)                # (the call that fills the table)
        cpu.find_or_insert(part)
    same_state(gpu, cpu)
    made = allocations(monkeypatch)
    for _ in range(2):
        keys = np.concatenate([EXTREMES, rng.integers(-2**40, 2**40, 100), fill[:40]])
        want = cpu.find_or_insert(keys, return_evicted=True)
        made.clear()
        got = gpu.find_or_insert(keys, return_evicted=True)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(host(a), b)
    same_state(gpu, cpu)
    assert cpu.size() == 250
    # the second call reuses the shard's work buffers: only what it hands out is new
    assert made and not [where for where in made if "jit_kernels" in where], made


@pytest.mark.parametrize("policy", ["lru", "custom"])
def test_a_bucketed_table_runs_its_stretches_as_the_cpu_does(monkeypatch, policy):
    """Fills in stretches (two, one with repeats of keys it inserts), the serial pass
    of the call that fills the table, then evicting calls in stretches: a GPU thread
    a bucket against the CPU's thread a half of the index."""
    from jit_kernels import cuda_buckets
    monkeypatch.setattr(kb, "RANGES_MIN", 64)
    ran = []
    real = cuda_buckets.bucket_insert_ranges
    monkeypatch.setattr(cuda_buckets, "bucket_insert_ranges",
                        lambda *a, **kw: ran.append(a[2].shape[0]) or real(*a, **kw))
    gpu, cpu = pair(max_capacity=250, evict=policy, evict_window="bucket")
    rng = np.random.default_rng(2)
    fill = rng.integers(-2**40, 2**40, 300)
    calls = [fill[:100], np.concatenate([fill[:20], fill[100:200], fill[150:160]]), fill[200:]]
    calls += [np.concatenate([EXTREMES, rng.integers(-2**40, 2**40, 100), fill[:40], fill[:9]])
              for _ in range(2)]
    for keys in calls:
        sc = rng.integers(0, 50, keys.shape[0]) if policy == "custom" else None
        want = cpu.find_or_insert(keys, return_exists=True, return_evicted=True, scores=sc)
        got = gpu.find_or_insert(keys, return_exists=True, return_evicted=True, scores=sc)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(host(a), b)
        same_state(gpu, cpu)
    assert ran == [100, 130, 153, 153] and cpu.size() == 250
    assert want[2].shape[0] > 30


def allocations(monkeypatch):
    """Where device arrays are made from now on (the innermost frame in this repo)."""
    import os
    import traceback

    from jit_kernels import cuda_table as ct
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    made = []

    def counted(real):
        def make(*a, **kw):
            ours = [f for f in traceback.extract_stack()[:-1]
                    if f.filename.startswith(root) and "/tests/" not in f.filename]
            made.append(f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?")
            return real(*a, **kw)
        return make
    cuda = ct.cuda_api()
    for name in ("device_array", "to_device"):
        monkeypatch.setattr(cuda, name, counted(getattr(cuda, name)))
    return made


@pytest.mark.parametrize("window", [4, "bucket"])
def test_checkpoint_loads_onto_the_gpu_as_onto_the_cpu(tmp_path, window):
    """A saved CUDA bounded table loads onto a GPU and onto the CPU with one layout,
    scores and clocks: both then evict alike."""
    gpu, _ = pair(max_capacity=30, evict="lfu", evict_window=window)
    rng = np.random.default_rng(3)
    for _ in range(3):
        gpu.find_or_insert(rng.integers(-50, 50, 40))
    gpu.save(str(tmp_path / "t.nbe"))
    on_gpu = ne.Variable.load(str(tmp_path / "t.nbe"), device="cuda")
    on_cpu = ne.Variable.load(str(tmp_path / "t.nbe"), device="cpu")
    assert on_gpu.device == gpu.device and on_cpu.device == "cpu"
    assert on_gpu.max_capacity == on_cpu.max_capacity == 30 and on_gpu.evict == "lfu"
    assert on_gpu._clock == on_cpu._clock == gpu._clock
    same_state(on_gpu, on_cpu)
    keys = rng.integers(-80, 80, 40)
    want = on_cpu.find_or_insert(keys, return_evicted=True)
    got = on_gpu.find_or_insert(keys, return_evicted=True)
    assert want[1].shape[0] > 0
    for a, b in zip(got, want):
        np.testing.assert_array_equal(host(a), b)
    same_state(on_gpu, on_cpu)
    # smaller and in the other layout: the same keys on both (the highest-scored)
    kw = dict(max_capacity=12, evict_window="bucket" if window == 4 else 4)
    with pytest.warns(UserWarning, match="keys of checkpoint .* left out"):
        small_gpu = ne.Variable.load(str(tmp_path / "t.nbe"), device="cuda", **kw)
    with pytest.warns(UserWarning, match="keys of checkpoint .* left out"):
        small_cpu = ne.Variable.load(str(tmp_path / "t.nbe"), device="cpu", **kw)
    assert small_gpu.size() == small_cpu.size() == 12
    same_state(small_gpu, small_cpu)


def test_loaded_keys_of_a_full_bucket_are_placed_by_score_as_on_the_cpu():
    """A load's keys beyond a bucket's 32 (saved from another layout) wait with their
    rows, then displace the lowest scores of the bucket on the GPU as on the CPU."""
    from jit_kernels.bucket_bounded import homes_of
    gpu, cpu = pair(max_capacity=60, evict="lfu")
    mask = cpu.shards[0].mask
    keys = np.array([k for k in range(200_000) if homes_of.python_twin()(k, mask) >> 8 == 0][:40])
    scores = np.random.default_rng(3).permutation(40) + 10
    pairs = np.empty(80, np.int64)
    pairs[0::2], pairs[1::2] = keys, np.arange(40)
    for v in (gpu, cpu):
        shard = v.shards[0]
        shard._reserve_rows(40)
        shard._place(pairs if v is cpu else shard.to_device(pairs), shard.slots)
        shard._take_rows(40)
        for name, data in (("score", scores.reshape(40, 1)),
                           ("values", np.arange(120, dtype=np.float32).reshape(40, 3))):
            col = shard.columns[name].data                 # (as a load writes them)
            if v is cpu:
                col[:40] = data
            else:
                col[:40].copy_to_device(np.ascontiguousarray(data))
        with pytest.warns(UserWarning, match="8 loaded keys did not fit"):
            shard._loaded()
    same_state(gpu, cpu)
    kept = keys[np.argsort(-scores, kind="stable")[:32]]
    assert sorted(host(gpu.export()[0]).tolist()) == sorted(kept.tolist())
    np.testing.assert_array_equal(host(gpu.lookup(keys)), cpu.lookup(keys))


@pytest.mark.parametrize("policy, window", [("lru", 4), ("lfu", 4), ("lfu", "bucket")])
def test_accum_matches_the_cpu(policy, window):
    """TFRA accum (batch order, repeats, exists flags, extreme keys) into a table that
    fills and evicts: each key acts once a call, at its first acting position."""
    gpu, cpu = pair(max_capacity=16, evict=policy, evict_window=window)
    rng = np.random.default_rng(5)
    for _ in range(5):
        keys = np.concatenate([EXTREMES, rng.integers(-12, 12, 16)]).astype(np.int64)
        old = rng.standard_normal((keys.shape[0], 3)).astype(np.float32)
        new = rng.standard_normal((keys.shape[0], 3)).astype(np.float32)
        exists = rng.random(keys.shape[0]) < 0.5
        gpu.accum(keys, old, new, exists)
        cpu.accum(keys, old, new, exists)
        same_state(gpu, cpu)
    assert cpu.size() == 16


def test_what_a_cuda_bounded_table_refuses():
    v = ne.Variable(2, device="cuda", max_capacity=8)
    v.find_or_insert(np.arange(4))
    clock = v._clock
    with pytest.raises(ValueError, match="evict='custom'"):
        v.find_or_insert(np.arange(2), scores=np.arange(2))
    assert v._clock == clock
