"""Where a GPU table's training step (``apply_gradients``) spends its time, on a
skewed (Zipf) and a uniform batch: grouping the positions by id (atomic placement and a
heapsort a group, against stable radix passes), the whole step under each, and the
forward ``find_or_insert`` of the same ids for scale.  Needs a GPU (no TensorFlow).

    python3 benchmarks/profile_cuda_step.py                 # 64K ids, dim 64, Adam
    python3 benchmarks/profile_cuda_step.py --ids 1048576 --repeats 5

Session 32 measured a 64K-id Adam step at 41 ms on an H100 (Zipf 1.2 over 10M ids,
``bench_distributed.py --device cuda``), against 3.3 ms for its ``find_or_insert``:
its largest group (the hottest id, ~18% of the batch) was heapsorted by one thread.
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def batch(kind, n, vocab, zipf, rng):
    """int64 ids: Zipf(zipf) ranks over ``vocab`` ids, or uniform, spread over int64."""
    rank = rng.zipf(zipf, n) % vocab if kind == "zipf" else rng.integers(0, vocab, n)
    return (rank.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)


def timed(fn, repeats, sync):
    """Median seconds of ``fn()`` (each ended by ``sync()``), after one warm call."""
    fn()
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=65536)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=10_000_000)
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()

    from numba import cuda

    import numbaemb as ne
    from jit_kernels import cuda_table as ct
    rng = np.random.default_rng(0)
    name = getattr(cuda.get_current_device(), "name", "(the simulator)")
    print(f"GPU {name.decode() if isinstance(name, bytes) else name}; "
          f"{args.ids} ids a batch; dim {args.dim}; Adam; median of {args.repeats} (ms)")
    print()
    print("| batch | distinct | largest group | group_keys heapsort | group_keys radix | "
          "step heapsort | step radix | step auto | find_or_insert |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    default = ct.RADIX_ABOVE
    profile = None
    for kind in ("zipf", "uniform"):
        ids = batch(kind, args.ids, args.vocab, args.zipf, rng)
        _, counts = np.unique(ids, return_counts=True)
        d_ids = cuda.to_device(ids)
        grads = cuda.to_device(rng.standard_normal((args.ids, args.dim)).astype(np.float32))
        v = ne.Variable(args.dim, device="cuda",
                        initializer=ne.initializers.RandomNormal(0.0, 0.05, seed=1))
        rule = ne.optimizers.Adam(0.001)
        row = [timed(lambda: ct.group_keys(d_ids, radix=radix), args.repeats, cuda.synchronize)
               for radix in (False, True)]
        try:            # a step groups by the module's threshold: heapsort, radix, automatic
            for above in (1 << 62, -1, default):
                ct.RADIX_ABOVE = above
                row.append(timed(lambda: ne.optimizers.apply_gradients(v, rule, d_ids, grads,
                                                                       step=1),
                                 args.repeats, cuda.synchronize))
        finally:
            ct.RADIX_ABOVE = default
        row.append(timed(lambda: v.find_or_insert(d_ids), args.repeats, cuda.synchronize))
        print(f"| {kind} | {counts.shape[0]:,} | {counts.max():,} | "
              + " | ".join(f"{1e3 * t:.2f}" for t in row) + " |")
        if kind == "zipf":                      # the host side of one automatic step
            profile = cProfile.Profile()
            profile.enable()
            ne.optimizers.apply_gradients(v, rule, d_ids, grads, step=1)
            cuda.synchronize()
            profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(14)
    print("\nOne automatic step on the Zipf batch, by function (cumulative, host view):")
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


if __name__ == "__main__":
    main()
