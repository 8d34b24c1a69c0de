"""Where a bounded GPU table's evicting insert spends its time (needs a GPU).

Fills a bounded table of ``--keys`` keys on the device, then times batches of new
keys (every insert evicts), once plainly and once with every kernel wrapper of
``jit_kernels.cuda_bounded`` and every ``cuda_table._go`` launch timed between
device synchronisations (inclusive times, so nested entries overlap).  Also counts
the positions each call defers to the one-thread pass after the ranges.

    python benchmarks/profile_cuda_bounded.py --keys 1000000 --batch 100000
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TIMES = {}


def timed(mod, name, key=None):
    from jit_kernels import cuda_table as ct
    f = getattr(mod, name)

    def g(*a, **kw):
        ct.cuda.synchronize()
        t0 = time.perf_counter()
        out = f(*a, **kw)
        ct.cuda.synchronize()
        entry = TIMES.setdefault(key(a, kw) if key else name, [0, 0.0, 0])
        entry[0] += 1
        entry[1] += time.perf_counter() - t0
        if name == "_run":
            entry[2] += a[0].shape[0]
        return out
    setattr(mod, name, g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--evict", default="lru")
    ap.add_argument("--ab-round-two", action="store_true",
                    help="alternate batches with and without round two (the deferred "
                         "positions in shifted ranges; without: all serial)")
    ap.add_argument("--pass-threads", type=int, nargs="+", default=[256, 1],
                    help="threads a block of the passes kernel, each timed (the last profiled)")
    args = ap.parse_args()
    import numbaemb as ne
    from jit_kernels import bounded as kb
    from jit_kernels import cuda_bounded as kbc
    from jit_kernels import cuda_table as ct
    cuda = ct.cuda_api()
    n, b = args.keys, args.batch
    rng = np.random.default_rng(0)
    todo_n = (len(args.pass_threads) + 1) * args.repeats + 1
    keys = rng.permutation(np.arange(n + b * todo_n, dtype=np.int64) * 7919 + 13)
    v = ne.Variable(args.dim, max_capacity=n, evict=args.evict, device="cuda")
    for lo in range(0, n, b):
        v.find_or_insert(cuda.to_device(keys[lo:lo + b]))
    cuda.synchronize()
    shard = v.shards[0]
    print(f"keys {n:,}; batch {b:,}; dim {args.dim}; index {shard.capacity:,} slots; "
          f"ranges {kb.ranges_for(shard.capacity, shard.window)}; window {shard.window}")
    todo = [cuda.to_device(keys[n + i * b:n + (i + 1) * b])
            for i in range(todo_n)]
    v.find_or_insert(todo.pop())          # compile
    with_two = kbc._round_two
    for threads in args.pass_threads:
        kbc.PASS_THREADS = threads
        plain = {True: [], False: []}
        for r in range(args.repeats):
            two = not (args.ab_round_two and r % 2)     # alternate: with, without
            kbc._round_two = with_two if two else (lambda late, *a, **kw: (late, 0))
            k = todo.pop()
            t0 = time.perf_counter()
            v.find_or_insert(k)
            cuda.synchronize()
            plain[two].append(time.perf_counter() - t0)
        kbc._round_two = with_two
        for two, ts in plain.items():
            if ts:
                t = float(np.median(ts))
                print(f"passes {threads} threads a block, round two {'on' if two else 'off'}: "
                      f"{t * 1e3:.2f} ms a batch ({b / t / 1e6:.2f} M keys/s)")
    for name in ("find_present", "restore_scores", "bounded_insert", "bounded_insert_ranges",
                 "init_copy", "absent_count", "nonneg", "_round_two"):
        timed(kbc, name)
    timed(kbc, "_run", key=lambda a, kw: "_run one thread" if a[1].shape[0] <= 2 else
          "_run shifted ranges" if kw.get("off") else "_run ranges")
    for name in ("group_positions", "compact_nonneg"):
        timed(ct, name)
    timed(ct, "_go", key=lambda a, kw: "go " + getattr(getattr(a[0], "py_func", a[0]), "__name__", "?"))
    t0 = time.perf_counter()
    reps = todo
    for k in reps:
        v.find_or_insert(k)
    cuda.synchronize()
    total = (time.perf_counter() - t0) / len(reps)
    print(f"timed: {total * 1e3:.2f} ms a batch (with a synchronisation around each step)")
    print("| step | calls a batch | ms a batch | positions a batch |\n|---|---:|---:|---:|")
    for name, (c, t, m) in sorted(TIMES.items(), key=lambda x: -x[1][1]):
        print(f"| {name} | {c / len(reps):.1f} | {t / len(reps) * 1e3:.2f} | "
              f"{m / len(reps):,.0f} |" if m else
              f"| {name} | {c / len(reps):.1f} | {t / len(reps) * 1e3:.2f} | |")


if __name__ == "__main__":
    main()
