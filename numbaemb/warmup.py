"""Fill Numba's on-disk cache with numbaemb's kernels, so later processes start warm.

    python -m numbaemb.warmup                    # int64 keys, float32 values: the defaults
    python -m numbaemb.warmup --all-dtypes       # int32/int64 keys x float32/float64 values
    NUMBA_CACHE_DIR=/shared/numba python -m numbaemb.warmup   # a cache several hosts share
    python -m numbaemb.warmup --prebuilt DIR     # the set a wheel build ships (jit_kernels.prebuilt)
    python -m numbaemb.warmup --groups table,bounded   # only these groups of GROUPS

Run it once when building an image, at the start of a CI job (cache the directory
between jobs) or on each node before a distributed job: the first table operations of
a process then load machine code (a few hundredths of a second) instead of compiling it
(about 10-25 s on a 2-core machine, see ``benchmarks/bench_compile.py``).  It runs
every table operation, every optimizer and the training path's unique / segment-sum /
spread kernels on small arrays of each dtype pair.  A wheel built by ``pip install``
already carries these kernels for the machine that built it (:mod:`jit_kernels.prebuilt`);
this command is for caches that wheel does not fill (other dtypes, another CPU model,
an editable install).

The work is split into tasks (:func:`tasks`: a group of kernels, a build, a dtype
pair) run by ``--jobs`` worker processes (default: one a CPU), each compiling into a
cache directory of its own; their cache files are then merged into the cache
(:func:`jit_kernels.prebuilt.merge`), so they never wait on each other's index
locks (:func:`jit_kernels._cache.locked`).  On the 2-core development VM: 88 s with two
workers (111 s in one process before string keys joined the warmup).

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


def tasks(dtypes=None, groups=None):
    """The warmup's units of work, ``(key dtype, value dtype, build, group)``: every
    group of kernels of :data:`GROUPS` (or of ``groups``, names of it) for each dtype
    pair and each build (``"serial"``: the twins small batches run, ``"parallel"``: the
    ``prange`` builds)."""
    return [(k, v, build, group) for k, v in dtypes or DEFAULT
            for build in ("serial", "parallel") for group in GROUPS
            if (build == "serial" or group not in ONCE) and (not groups or group in groups)]


def warm(dtypes=None, verbose=False, part=(0, 1), groups=None):
    """Run every kernel (of ``groups``, default all of :data:`GROUPS`) once per ``(key
    dtype, value dtype)`` pair (default: int64 / float32); returns ``{what: seconds}``
    (the last pair's).  ``part=(i, n)`` runs only the tasks ``i, i + n, ...`` of
    :func:`tasks` (one worker of ``--jobs n``)."""
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
    try:
        for key_dtype, value_dtype, build, group in tasks(dtypes, groups)[part[0]::part[1]]:
            if verbose:
                print(f"{key_dtype} keys, {value_dtype} values, {build} kernels: {group}",
                      flush=True)
            segment.PARALLEL_MIN = 1 << 62 if build == "serial" else 0
            GROUPS[group](ne, segment, key_dtype, value_dtype, timed)
    finally:
        segment.PARALLEL_MIN = saved
    return times


def _variable(ne, key_dtype, value_dtype, name, **kw):
    return ne.Variable(4, key_dtype=key_dtype, value_dtype=value_dtype, name=name, **kw)


def _inits(ne):
    """One initializer of each kind (Zeros first)."""
    i = ne.initializers
    return (i.Zeros(), i.Constant(0.5), i.RandomUniform(seed=1), i.RandomNormal(seed=1),
            i.TruncatedNormal(seed=1))


def _warm_table(ne, segment, key_dtype, value_dtype, timed):
    """Every table op once, on 100 keys (and a growth past 1 MB of columns)."""
    keys = np.arange(-50, 50, dtype=key_dtype)
    grads = np.ones((keys.size, 4), value_dtype)
    v = _variable(ne, key_dtype, value_dtype, "warmup",
                  initializer=ne.initializers.RandomNormal(seed=1))
    timed("find_or_insert", lambda: v.find_or_insert(keys))
    timed("lookup", lambda: v.lookup(keys, return_exists=True))
    timed("upsert", lambda: v.upsert(keys, grads))
    timed("accum", lambda: v.accum(keys, grads, grads, np.ones(keys.size, bool)))
    timed("export", v.export)
    timed("remove", lambda: v.remove(keys[:10]))
    if segment.PARALLEL_MIN == 0:       # columns past 1 MB start the page populator
        timed("table growth", lambda: v.find_or_insert(np.arange(300_000, dtype=key_dtype)))
    # the kernels that draw initial values build one kind of initializer each
    # (jit_kernels.initializers.Kind): every kind's builds
    for init in _inits(ne):
        w = _variable(ne, key_dtype, value_dtype, "warmup_init", initializer=init)

        def run():
            w.find_or_insert(keys)
            w.remove(keys[:10])
            w.find_or_insert(keys[::-1].copy())         # rows from the free list
            w.lookup(keys + 100)
            ne.optimizers.apply_gradients(w, ne.optimizers.SGD(0.1), keys + 200, grads, step=1)
        timed(f"initial values: {type(init).__name__}", run)


def _warm_optimizers(ne, segment, key_dtype, value_dtype, timed):
    """Each optimizer's first step (new rows) on 100 keys."""
    keys = np.arange(-50, 50, dtype=key_dtype)
    grads = np.ones((keys.size, 4), value_dtype)
    for name, opt in (("SGD", ne.optimizers.SGD(0.1)),
                      ("SGD momentum", ne.optimizers.SGD(0.1, momentum=0.9)),
                      ("Adagrad", ne.optimizers.Adagrad(0.1)),
                      ("Adam", ne.optimizers.Adam(0.1)), ("Ftrl", ne.optimizers.Ftrl(0.1)),
                      ("RMSprop", ne.optimizers.RMSprop(0.1))):
        w = _variable(ne, key_dtype, value_dtype, f"warm_{name}")
        timed(name, lambda: ne.optimizers.apply_gradients(w, opt, keys, grads, step=1))


def _warm_training(ne, segment, key_dtype, value_dtype, timed):
    """A Keras step's kernels: unique, segment-sum, spread, Adam on per-position rows."""
    keys = np.arange(-50, 50, dtype=key_dtype)
    flat = np.concatenate([keys, keys]).astype(np.int64)
    uniq, inverse = segment.unique_inverse(flat)
    rows = np.ones((flat.size, 4), value_dtype)
    timed("unique / segment-sum / spread", lambda: (
        segment.segment_sum(rows, inverse, uniq.size, segment.threads_for(flat.size)),
        segment.gather_rows(rows[:uniq.size], inverse, np.empty_like(rows))))
    w = _variable(ne, key_dtype, value_dtype, "warm_fused")
    timed("Adam, per-position gradients (a Keras step's)", lambda: ne.optimizers.apply_gradients(
        w, ne.optimizers.Adam(0.1), uniq.astype(key_dtype), rows, step=1, inverse=inverse))


def _warm_many(ne, segment, key_dtype, value_dtype, timed):
    """The multi-table kernels (``numbaemb.multi``; a Keras model's tables, stepped
    together by ``DynamicEmbeddingOptimizer``): a lookup, a training lookup, a step."""
    from numbaemb import multi
    tables = [ne.Variable(d, key_dtype=key_dtype, value_dtype=value_dtype, name=f"warm_many{d}")
              for d in (2, 3)]
    keys = [np.arange(-5, 5, dtype=key_dtype)] * 2

    def run():
        multi.lookup_many(tables, keys)
        got = multi.lookup_many(tables, keys, unique=True)
        multi.apply_many(tables, ne.optimizers.Adam(0.1), [g.uniq for g in got],
                         [np.ones((10, t.dim), value_dtype) for t in tables],
                         [g.inverse for g in got], [None, None], step=1)
    timed("many tables in one kernel call", run)


def _warm_bounded(ne, segment, key_dtype, value_dtype, timed):
    """A bounded table (``max_capacity``): inserts that fill it, evicting inserts in the
    serial pass and in ranges of the index (a small table made to take them), an
    optimizer step; a bucketed one (``evict_window="bucket"``) likewise, in stretches
    of buckets and serially, with its lookups and removal."""
    from jit_kernels import bounded as kb
    from numbaemb import bounded as nb
    saved = kb.RANGE_SLOTS, kb.RANGES_MIN, nb.stretches_for
    try:
        kb.RANGE_SLOTS, kb.RANGES_MIN, nb.stretches_for = 16, 8, (lambda: 2)
        v = _variable(ne, key_dtype, value_dtype, "warm_bounded", max_capacity=40,
                      evict_window=1)
        b = _variable(ne, key_dtype, value_dtype, "warm_bounded_bucket", max_capacity=40,
                      evict_window="bucket")

        def run():
            v.find_or_insert(np.arange(60, dtype=key_dtype))
            v.find_or_insert(np.arange(60, 64, dtype=key_dtype))       # (below RANGES_MIN)
            ne.optimizers.apply_gradients(v, ne.optimizers.Adam(0.1),
                                          np.arange(50, 70, dtype=key_dtype),
                                          np.ones((20, 4), value_dtype), step=1)

        def run_buckets():
            b.find_or_insert(np.arange(30, dtype=key_dtype))       # a fill in stretches
            b.find_or_insert(np.arange(30, 60, dtype=key_dtype))   # fills it: serially
            b.find_or_insert(np.arange(60, 90, dtype=key_dtype))   # evicts in stretches
            ne.optimizers.apply_gradients(b, ne.optimizers.Adam(0.1),
                                          np.arange(80, 100, dtype=key_dtype),
                                          np.ones((20, 4), value_dtype), step=1)
            b.lookup(np.arange(100, dtype=key_dtype))
            b.remove(np.arange(80, 85, dtype=key_dtype))
        timed("bounded tables", run)
        timed("bounded tables: bucketed index", run_buckets)
        for init in _inits(ne)[1:]:                  # (each kind's build)
            w = _variable(ne, key_dtype, value_dtype, "warm_bounded_init", max_capacity=40,
                          initializer=init)
            timed(f"bounded tables: {type(init).__name__}",
                  lambda: w.find_or_insert(np.arange(60, dtype=key_dtype)))
    finally:
        kb.RANGE_SLOTS, kb.RANGES_MIN, nb.stretches_for = saved


def _warm_strings(ne, segment, key_dtype, value_dtype, timed):
    """A string-keyed table (``key_dtype="string"``; ``key_dtype`` is not used): insert,
    lookup, an Adam step on its ids, export."""
    keys = np.array([f"warm{i}" for i in range(100)], dtype=object)
    v = ne.Variable(4, key_dtype="string", value_dtype=value_dtype, name="warm_strings")
    timed("string keys: find_or_insert", lambda: v.find_or_insert(keys))
    timed("string keys: lookup", lambda: v.lookup(keys))
    timed("string keys: Adam step", lambda: ne.optimizers.apply_gradients(
        v, ne.optimizers.Adam(0.1), v.ids(keys, insert=True),
        np.ones((keys.size, 4), value_dtype), step=1))
    timed("string keys: export", v.export)


GROUPS = {"table": _warm_table, "optimizers": _warm_optimizers, "training": _warm_training,
          "many tables": _warm_many, "bounded": _warm_bounded, "string keys": _warm_strings}
# one task a dtype pair, in the serial build's pass: the multi-table and range kernels
# are parallel whatever the size, and string tables' batches are seldom past the
# parallel cut-off
ONCE = ("many tables", "bounded", "string keys")


def _in_workers(jobs, all_dtypes, prebuilt_dir, groups=None):
    """Run the tasks in ``jobs`` worker processes, each with a cache directory of its
    own (no waiting on one another's index locks), then merge their caches into
    ``prebuilt_dir``, or else into this process's cache."""
    import os
    import subprocess
    import tempfile
    from jit_kernels import prebuilt
    with tempfile.TemporaryDirectory(prefix="numbaemb-warmup-") as tmp:
        outs = [os.path.join(tmp, f"out{i}") for i in range(jobs)]
        procs = []
        for i, out in enumerate(outs):
            env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(tmp, f"cache{i}"),
                       NUMBAEMB_PREBUILT="0")
            cmd = [sys.executable, "-m", "numbaemb.warmup", "-q", "--part", f"{i}/{jobs}",
                   "--prebuilt", out] + (["--all-dtypes"] if all_dtypes else []) \
                + (["--groups", ",".join(groups)] if groups else [])
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
        errors = [p.communicate()[1] for p in procs]
        failed = [e[-2000:] for p, e in zip(procs, errors) if p.returncode]
        if failed:
            raise RuntimeError("a warmup worker failed:\n" + failed[0])
        if prebuilt_dir:
            return prebuilt.collect(prebuilt_dir, sources=outs)
        return sum(prebuilt.merge([os.path.join(o, p) for o in outs], prebuilt.cache_dir(d),
                                  first=prebuilt.live_start())
                   for p, d in prebuilt.PACKAGES.items())


def main(argv=None):
    import os
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all-dtypes", action="store_true",
                    help="int32/int64 keys x float32/float64 values (default: int64/float32)")
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument("-j", "--jobs", type=int, default=0,
                    help="worker processes compiling at once (default: one a CPU, at most "
                         "one a task; 1: compile in this process)")
    ap.add_argument("--prebuilt", metavar="DIR",
                    help="then copy the cache files into DIR with a manifest (what a wheel "
                         "build ships in jit_kernels/prebuilt; see jit_kernels.prebuilt)")
    ap.add_argument("--groups", metavar="G,G",
                    help="only these groups of kernels, comma-separated: " + ", ".join(GROUPS))
    ap.add_argument("--part", help=argparse.SUPPRESS)       # i/n: one worker's share
    args = ap.parse_args(argv)
    groups = args.groups.split(",") if args.groups else None
    unknown = sorted(set(groups or ()) - set(GROUPS))
    if unknown:
        ap.error(f"--groups: unknown group {unknown[0]!r} (one of {', '.join(GROUPS)})")
    from . import _ahead
    _ahead.disable()        # it compiles every kernel itself: no helper guessing at a few
    t0 = time.perf_counter()
    dtypes = ALL if args.all_dtypes else DEFAULT
    jobs = args.jobs or min(os.cpu_count() or 1, len(tasks(dtypes, groups)))
    if args.part or jobs <= 1:
        part = tuple(int(x) for x in args.part.split("/")) if args.part else (0, 1)
        warm(dtypes, verbose=not args.quiet, part=part, groups=groups)
        if args.prebuilt:
            from jit_kernels import prebuilt
            n = prebuilt.collect(args.prebuilt)
            print(f"{n} functions' cache files copied to {args.prebuilt}", file=sys.stderr)
    else:
        _in_workers(jobs, args.all_dtypes, args.prebuilt, groups)
    if args.part:
        return
    import numba.core.config as cfg
    where = args.prebuilt or cfg.CACHE_DIR or "beside the installed sources (__pycache__)"
    print(f"numbaemb kernels compiled and cached in {time.perf_counter() - t0:.1f} s "
          f"({jobs} process{'es' if jobs > 1 else ''}); cache: {where}", file=sys.stderr)


if __name__ == "__main__":
    main()
