"""The scalar code a GPU runs, run on the CPU (``NUMBAEMB_SCALAR_LANES=1``).

The bounded kernels' bodies take vector instructions on the CPU where
:func:`jit_kernels.lanes.vectors` says so and keep scalar code for a GPU (a bucket's
digests, the lowest score of a window or bucket).  The CUDA simulator runs those
bodies compiled for the CPU, vectors and all, so only a real GPU would run the
scalar code.  Here a subprocess compiles every kernel with ``vectors()`` False (in a
cache directory of its own) and makes the calls of :func:`calls`; the tables it ends
with must be this process's bit for bit.
"""
import os
import subprocess
import sys

import numpy as np
from numba import njit

import numbaemb as ne
from jit_kernels import bounded as kb
from jit_kernels.lanes import vectors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTREMES = [-2**63, 2**63 - 1, -1, 0]


def calls():
    """Bounded tables (a window of 4 slots and a bucketed index, LRU and LFU) through
    fills, evictions in ranges and serially, removals and lookups; their arrays and
    the calls' results by name."""
    kb.RANGES_MIN, kb.RANGE_SLOTS = 64, 64      # (calls of 64 keys on run in ranges)
    out = {"vectors": np.array([njit(cache=False)(lambda: vectors())()])}
    rng = np.random.default_rng(7)
    for window in (4, "bucket"):
        for policy in ("lru", "lfu"):
            v = ne.Variable(2, max_capacity=300, evict=policy, evict_window=window, seed=1)
            name = f"{window}-{policy}"
            for step in range(6):
                keys = np.concatenate([EXTREMES, rng.integers(-2**40, 2**40, 120),
                                       rng.integers(0, 60, 60)]).astype(np.int64)
                vals, exists, ev_keys, _ = v.find_or_insert(keys, return_exists=True,
                                                            return_evicted=True)
                out[f"{name}/{step}/exists"] = exists
                out[f"{name}/{step}/evicted"] = ev_keys
                if step % 2:
                    v.remove(keys[:20])
                out[f"{name}/{step}/lookup"] = v.lookup(keys)
            s = v.shards[0]
            for a in ("slots", "mscore", "mark", "free_rows"):
                out[f"{name}/{a}"] = np.asarray(getattr(s, a))
            out[f"{name}/score"] = s.columns["score"].data[:s.fresh]
    return out


def test_the_gpus_scalar_code_gives_the_vector_codes_tables(tmp_path):
    env = dict(os.environ, NUMBAEMB_SCALAR_LANES="1", NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               NUMBAEMB_PREBUILD="0", PYTHONPATH=ROOT)
    code = ("import sys, numpy as np; from tests.jit_kernels.test_scalar_lanes import calls; "
            "np.savez(sys.argv[1], **calls())")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "scalar.npz")], env=env,
                         cwd=ROOT, timeout=600, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "scalar.npz")
    ranges = kb.RANGES_MIN, kb.RANGE_SLOTS
    try:
        want = calls()
    finally:
        kb.RANGES_MIN, kb.RANGE_SLOTS = ranges
    assert bool(want.pop("vectors")[0]) and not bool(got["vectors"][0])
    assert sorted(got.files) == sorted(want) + ["vectors"]
    for name, a in want.items():
        np.testing.assert_array_equal(got[name], a, err_msg=name)
    assert sum(a.shape[0] for n, a in want.items() if n.endswith("evicted")) > 1000
