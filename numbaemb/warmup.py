"""Fill Numba's on-disk cache with numbaemb's kernels, so later processes start warm.

    python -m numbaemb.warmup                    # int64 keys, float32 values: the defaults
    python -m numbaemb.warmup --all-dtypes       # int32/int64 keys x float32/float64 values
    NUMBA_CACHE_DIR=/shared/numba python -m numbaemb.warmup   # a cache several hosts share

Run it once when building an image, at the start of a CI job (cache the directory
between jobs) or on each node before a distributed job: the first table operations of
a process then load machine code (a few hundredths of a second) instead of compiling it
(about 10-25 s on a 2-core machine, see ``benchmarks/bench_compile.py``).  It runs
every table operation, every optimizer and the training path's unique / segment-sum /
spread kernels on small arrays of each dtype pair.  Numba writes each cache file under
a unique name and renames it into place, so processes that warm the same directory at
once do not corrupt it.

From Python: ``numbaemb.warmup.warm(dtypes=[("int64", "float32")])`` (returns the
seconds each kernel group took in the last pass).
"""
import argparse
import sys
import time

import numpy as np

__all__ = ["warm"]

DEFAULT = [("int64", "float32")]
ALL = [(k, v) for k in ("int64", "int32") for v in ("float32", "float64")]


def warm(dtypes=None, verbose=False):
    """Run every kernel once per ``(key dtype, value dtype)`` pair (default: int64 /
    float32); returns ``{what: seconds}`` (the last pair's)."""
    import numbaemb as ne
    from jit_kernels import segment
    times = {}

    def timed(what, fn):
        t0 = time.perf_counter()
        fn()
        times[what] = time.perf_counter() - t0
        if verbose:
            print(f"  {what}: {times[what]:.2f} s", flush=True)

    saved = segment.PARALLEL_MIN
    try:                # each driver's serial twin (small batches), then its parallel build
        for key_dtype, value_dtype in dtypes or DEFAULT:
            for segment.PARALLEL_MIN in (1 << 62, 0):
                _warm_pair(ne, segment, key_dtype, value_dtype, timed, verbose)
    finally:
        segment.PARALLEL_MIN = saved
    return times


def _warm_pair(ne, segment, key_dtype, value_dtype, timed, verbose):
    """Every table op, optimizer and training-path kernel once, on 100 keys."""
    if verbose:
        kind = "parallel" if segment.PARALLEL_MIN == 0 else "serial"
        print(f"{key_dtype} keys, {value_dtype} values, {kind} kernels", flush=True)
    keys = np.arange(-50, 50, dtype=key_dtype)
    grads = np.ones((keys.size, 4), value_dtype)
    v = ne.Variable(4, key_dtype=key_dtype, value_dtype=value_dtype, name="warmup",
                    initializer=ne.initializers.RandomNormal(seed=1))
    timed("find_or_insert", lambda: v.find_or_insert(keys))
    timed("lookup", lambda: v.lookup(keys, return_exists=True))
    timed("upsert", lambda: v.upsert(keys, grads))
    timed("accum", lambda: v.accum(keys, grads, grads, np.ones(keys.size, bool)))
    timed("export", v.export)
    timed("remove", lambda: v.remove(keys[:10]))
    if segment.PARALLEL_MIN == 0:       # columns past 1 MB start the page populator
        timed("table growth", lambda: v.find_or_insert(np.arange(300_000, dtype=key_dtype)))
    for name, opt in (("SGD", ne.optimizers.SGD(0.1)),
                      ("SGD momentum", ne.optimizers.SGD(0.1, momentum=0.9)),
                      ("Adagrad", ne.optimizers.Adagrad(0.1)),
                      ("Adam", ne.optimizers.Adam(0.1)), ("Ftrl", ne.optimizers.Ftrl(0.1)),
                      ("RMSprop", ne.optimizers.RMSprop(0.1))):
        w = ne.Variable(4, key_dtype=key_dtype, value_dtype=value_dtype, name=f"warm_{name}")
        timed(name, lambda: ne.optimizers.apply_gradients(w, opt, keys, grads, step=1))
    flat = np.concatenate([keys, keys]).astype(np.int64)
    uniq, inverse = segment.unique_inverse(flat)
    rows = np.ones((flat.size, 4), value_dtype)
    timed("unique / segment-sum / spread", lambda: (
        segment.segment_sum(rows, inverse, uniq.size, segment.threads_for(flat.size)),
        segment.gather_rows(rows[:uniq.size], inverse, np.empty_like(rows))))
    w = ne.Variable(4, key_dtype=key_dtype, value_dtype=value_dtype, name="warm_fused")
    timed("Adam, per-position gradients (a Keras step's)", lambda: ne.optimizers.apply_gradients(
        w, ne.optimizers.Adam(0.1), uniq.astype(key_dtype), rows, step=1, inverse=inverse))
    if segment.PARALLEL_MIN != 0:       # (always parallel: once a dtype pair)
        timed("many tables in one kernel call", lambda: _warm_many(ne, key_dtype, value_dtype))
        timed("bounded tables", lambda: _warm_bounded(ne, key_dtype, value_dtype))


def _warm_many(ne, key_dtype, value_dtype):
    """The multi-table kernels (``numbaemb.multi``; a Keras model's tables, stepped
    together by ``DynamicEmbeddingOptimizer``): a lookup, a training lookup, a step."""
    from numbaemb import multi
    tables = [ne.Variable(d, key_dtype=key_dtype, value_dtype=value_dtype, name=f"warm_many{d}")
              for d in (2, 3)]
    keys = [np.arange(-5, 5, dtype=key_dtype)] * 2
    multi.lookup_many(tables, keys)
    got = multi.lookup_many(tables, keys, unique=True)
    multi.apply_many(tables, ne.optimizers.Adam(0.1), [g.uniq for g in got],
                     [np.ones((10, t.dim), value_dtype) for t in tables],
                     [g.inverse for g in got], [None, None], step=1)


def _warm_bounded(ne, key_dtype, value_dtype):
    """A bounded table (``max_capacity``): inserts that fill it, evicting inserts in the
    serial pass and in ranges of the index (a small table made to take them), an
    optimizer step."""
    from jit_kernels import bounded as kb
    saved = kb.RANGE_SLOTS, kb.RANGES_MIN
    try:
        kb.RANGE_SLOTS, kb.RANGES_MIN = 16, 8
        v = ne.Variable(4, key_dtype=key_dtype, value_dtype=value_dtype, max_capacity=40,
                        evict_window=1, name="warm_bounded")
        v.find_or_insert(np.arange(60, dtype=key_dtype))
        v.find_or_insert(np.arange(60, 64, dtype=key_dtype))       # (below RANGES_MIN)
        ne.optimizers.apply_gradients(v, ne.optimizers.Adam(0.1),
                                      np.arange(50, 70, dtype=key_dtype),
                                      np.ones((20, 4), value_dtype), step=1)
    finally:
        kb.RANGE_SLOTS, kb.RANGES_MIN = saved


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all-dtypes", action="store_true",
                    help="int32/int64 keys x float32/float64 values (default: int64/float32)")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    warm(ALL if args.all_dtypes else DEFAULT, verbose=not args.quiet)
    import numba.core.config as cfg
    where = cfg.CACHE_DIR or "beside the installed sources (__pycache__)"
    print(f"numbaemb kernels compiled and cached in {time.perf_counter() - t0:.1f} s; "
          f"cache: {where}", file=sys.stderr)


if __name__ == "__main__":
    main()
