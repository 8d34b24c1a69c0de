"""Record the argument types of every CUDA kernel launch while the CUDA tables run
a workload under the simulator, so that ``tests/jit_kernels/test_cuda_ptx.py``
can compile each launch for a real GPU on a machine without one.

The simulator runs kernels as Python and accepts code that a GPU compiler
rejects (a device function returning a view of its argument did, once), so
the simulator tests alone do not show that the kernels compile.

    NUMBA_ENABLE_CUDASIM=1 python -m tests.cuda_launches OUT.pkl [PART]

PART (0 or 1) runs one of the workload's :data:`PARTS` only.  OUT.pkl holds
``{"kernels": [names], "launches": {(name, arg_types)}, "errors": [...]}``.
"""
import pickle
import sys

import numpy as np


def record(K):
    """Wrap every kernel of the namespace ``K`` so that launches record their types."""
    from numba import typeof

    from jit_kernels.cuda_kernels import _host
    launches, errors = set(), []

    class Recorded:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, config):
            launch = self.kernel[config]

            def call(*args):
                try:
                    launches.add((self.name, tuple(typeof(_host(a)) for a in args)))
                except Exception as e:  # noqa: BLE001 - reported by the test
                    errors.append(f"{self.name}: {type(e).__name__}: {e}")
                return launch(*args)
            return call

    names = sorted(n for n in vars(K) if not n.startswith("_"))
    for n in names:
        setattr(K, n, Recorded(n, getattr(K, n)))
    return names, launches, errors


def workload(part=None):
    """The CUDA tables' operations over the key and value dtypes, growth, deletes,
    hybrid storage, checkpoints and every optimizer (tiny sizes: the simulator
    runs a Python thread per CUDA thread); ``part``: only ``PARTS[part]`` of them
    (19 and 12 s alone on a 2-core VM, with `tests.cuda_support.quiet_simulator_blocks`)."""
    import numbaemb as ne
    from numbaemb import optimizers as O

    keys = np.array([0, -1, 2**63 - 1, -2**63, 5, 5, 9], np.int64)
    # one rule a kernel (options are run-time flags, not types)
    rules = [O.SGD(0.1, momentum=0.9), O.Adagrad(0.1), O.Adam(0.1), O.Ftrl(0.1),
             O.RMSprop(0.1, momentum=0.5, centered=True)]
    ids = np.array([4, 4, 9, -1], np.int64)
    grads = np.ones((4, 3), np.float32)
    for p, run in enumerate(PARTS):
        if part in (None, p):
            run(ne, O, keys, rules, ids, grads)


def _tables_and_steps(ne, O, keys, rules, ids, grads):
    """Unbounded tables of every dtype, growth, hybrid storage, every optimizer's
    step, admission filters and steps-to-live."""
    import tempfile

    from jit_kernels import cuda_table as ct
    cuda = ct.cuda_api()
    for value_dtype in ("float32", "float64", "float16", "bfloat16", "int8", "int64"):
        v = ne.Variable(3, value_dtype=value_dtype, device="cuda", num_shards=2,
                        initializer=ne.initializers.RandomNormal(0.0, 1.0, seed=1)
                        if value_dtype.startswith(("float", "bfloat")) else None)
        vals = np.arange(keys.size * 3).reshape(-1, 3).astype(np.float32)
        v.find_or_insert(keys)
        v.upsert(keys[:3], vals[:3].astype(v.value_dtype))
        v.lookup(keys)
        old = v.lookup(keys)
        v.accum(keys, old, old, np.ones(keys.size, bool))
        v.remove(keys[:2])
        v.export()
        v.size()
    half = ne.Variable(3, value_dtype="float16", device="cuda")   # device input converted:
    half.upsert(cuda.to_device(keys.astype(np.int32)),           # int32 keys cast to int64,
                cuda.to_device(np.ones((keys.size, 3), np.float32)))   # float32 narrowed
    v32 = ne.Variable(2, key_dtype=np.int32, device="cuda")
    v32.find_or_insert(np.arange(300, dtype=np.int32))          # growth: rehash, copy
    v32.remove(np.arange(0, 300, 2, dtype=np.int32))
    v32.find_or_insert(np.arange(300, 400, dtype=np.int32))     # free rows reused
    hybrid = ne.Variable(4, device="cuda", max_hbm_bytes=64)
    hybrid.find_or_insert(np.arange(40))
    hybrid.lookup(np.arange(50))
    s = hybrid.shards[0]               # the four-slot probe (a benchmark variant)
    out, ex = cuda.device_array((5, 4), np.float32), cuda.device_array(5, np.bool_)
    ct.lookup(s.slots, s.mask, cuda.to_device(np.arange(5)), s.values, out, ex,
              *s.columns["values"].init, step=4)
    with tempfile.TemporaryDirectory() as d:
        hybrid.save(f"{d}/t.nbe")
        ne.Variable.load(f"{d}/t.nbe", device="cuda").lookup(np.arange(5))
    # each rule's step: repeats, then unique ids
    uniq = np.array([4, 9, -1], np.int64)
    for value_dtype in ("float32", "float16"):
        for rule in rules:
            t = ne.Variable(3, value_dtype=value_dtype, device="cuda", max_hbm_bytes=24)
            O.apply_gradients(t, rule, ids, grads, step=1)
            O.apply_gradients(t, rule, uniq, grads[:3], step=2, assume_unique=True)
            O.slot_values(t, rule, rule.slots()[0][0], uniq)
    O.apply_gradients(t, rules[-1], uniq, grads, step=3, inverse=np.array([0, 0, 1, 2]))
    f = ne.Variable(2, device="cuda", admit=ne.admission.CounterFilter(min_count=2))
    for _ in range(2):          # an admission filter: positions taken and put back
        f.find_or_insert(ids)
        f.upsert(ids, np.ones((4, 2), np.float32))
        O.apply_gradients(f, rules[1], ids[:3], np.ones((3, 2), np.float32), step=1)
    for hbm in (None, 40):      # steps_to_live: the step marks rows; expiry, small rows
        e = ne.Variable(2, device="cuda", steps_to_live=1, max_hbm_bytes=hbm)
        O.apply_gradients(e, rules[0], ids, np.ones((4, 2), np.float32), step=1)
        O.apply_gradients(e, rules[0], ids[:1], np.ones((1, 2), np.float32), step=3)
        ne.expiry.expire(e)
        ne.expiry.prune_small(e, 1.0)


def _bounded_and_exchange(ne, O, keys, rules, ids, grads):
    """Bounded tables (fills, evictions in ranges and round two, custom scores, hybrid
    storage, reloads; a bucketed index's stretches) and a split table's exchange
    kernels."""
    import tempfile

    from jit_kernels import bounded as kb
    from jit_kernels import cuda_exchange as cx
    from jit_kernels import cuda_table as ct
    cuda = ct.cuda_api()
    # a bounded table: a fill in ranges, the serial pass, ranges into the full table
    # (their thresholds lowered: the simulator is slow), custom scores, a step with ids
    # not admitted, a reload
    kb.RANGES_MIN, kb.RANGE_SLOTS = 16, 64
    for policy in ("lfu", "custom"):
        b = ne.Variable(3, device="cuda", max_capacity=100, evict=policy, evict_window=1)
        sc = (lambda n: np.arange(n)) if policy == "custom" else (lambda n: None)
        b.find_or_insert(np.arange(-40, 0), scores=sc(40))     # a fill in ranges
        b.find_or_insert(np.arange(120), return_exists=True, return_evicted=True,
                         scores=sc(120))
        b.find_or_insert(np.arange(5000, 5050), return_evicted="columns", scores=sc(50))
        b.upsert(keys, np.ones((keys.size, 3), np.float32), scores=sc(keys.size))
    O.apply_gradients(b, rules[2], ids, grads, step=1)
    ct.group_positions(cuda.to_device(np.arange(600) % 7), 7)      # few groups: chunks
    ct.group_keys(cuda.to_device(np.repeat(np.arange(3), 70)))     # a hot key: radix passes
    r = ne.Variable(3, device="cuda", max_capacity=100, evict="lru", evict_window=2)
    r.find_or_insert(np.arange(150))
    r.find_or_insert(np.arange(6000, 6400))     # round two of the ranges (keys deferred)
    u = ne.Variable(3, device="cuda", max_capacity=100, evict="custom", evict_window="bucket")
    u.find_or_insert(np.arange(-40, 0), scores=np.arange(40))      # a fill in stretches
    u.find_or_insert(np.arange(120), return_evicted="columns", scores=np.arange(120))  # serial
    u.find_or_insert(np.arange(5000, 5050), return_evicted=True, scores=np.arange(50))
    u.lookup(np.arange(20))
    u.remove(np.arange(10))
    b.remove(np.arange(10))
    b.accum(keys, np.zeros((keys.size, 3), np.float32), np.ones((keys.size, 3), np.float32),
            np.arange(keys.size) % 2 == 0)
    h = ne.Variable(3, device="cuda", max_capacity=20, max_hbm_bytes=24)   # hybrid storage
    h.find_or_insert(np.arange(30), return_evicted="columns")
    h.accum(keys, np.zeros((keys.size, 3), np.float32), np.ones((keys.size, 3), np.float32),
            np.arange(keys.size) % 2 == 0)
    with tempfile.TemporaryDirectory() as d:
        b.save(f"{d}/b.nbe")
        ne.Variable.load(f"{d}/b.nbe", device="cuda").find_or_insert(np.arange(3))
        u.save(f"{d}/u.nbe")
        ne.Variable.load(f"{d}/u.nbe", device="cuda").find_or_insert(np.arange(3))
    # a split GPU table's exchange (its kernels; the MPI part is tests/distributed's)
    for bits, unique in ((32, True), (64, False), (64, True)):
        send, counts, slot, first = cx.plan(cuda.to_device(keys), 3, bits, unique)
    for dt in (np.float32, np.float64):       # gradient sums in each compute dtype
        cx.segment_sums(cuda.to_device(np.ones((keys.size, 3), dt)), slot, send.shape[0])
    back = cuda.to_device(np.ones(send.shape[0], np.bool_))
    cx.pick(back, slot, first)
    cx.pick(back, slot)


PARTS = (_tables_and_steps, _bounded_and_exchange)   # run at once, a simulator process each


def main(out, part=None):
    from jit_kernels import cuda_table as ct
    from tests.cuda_support import simulate_as_tests_do
    simulate_as_tests_do()
    names, launches, errors = record(ct._kernels())
    workload(part)
    with open(out, "wb") as f:
        pickle.dump({"kernels": names, "launches": launches, "errors": errors}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
