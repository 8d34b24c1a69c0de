"""Hybrid GPU tables: find with part of the rows in pinned host memory, against the host link.

Prints one Markdown table: for each share of rows kept in GPU memory (1.0 =
all in HBM, 0.5 = half the rows in mapped host memory), billions of keys per
second of ``CudaShard.lookup`` and the bytes per second it pulls over the host
link, beside two limits measured in the same run:

* ``H2D copy``: ``cudaMemcpy`` from pinned host memory to the device of as many
  bytes as the lookups read from host memory (the link's bulk bandwidth);
* ``host gather``: ``cupy.take`` of the same host rows by known row number,
  straight from the mapped host memory (zero-copy, no hashing: the limit of
  reading scattered rows over the link).

    python benchmarks/bench_hybrid.py                    # 16M rows of dim 64 (4 GiB)
    python benchmarks/bench_hybrid.py --rows 65536 --batch 4096 --repeats 2   # smoke

Method: one shard per share, ``init_size`` = ``--rows`` (no growth), filled
with ``--rows`` distinct scattered keys through ``find_or_insert`` (untimed);
rows ``[0, share * rows)`` are in HBM (each key's row is read back with
``find_rows`` to count the bytes that come from host memory).
Lookups draw ``--batch`` keys uniformly from the present keys (all hits, so
a share ``1 - share`` of them reads host rows); CUDA events around the host
call, two untimed runs first, median of ``--repeats``.
"""
import argparse
import os
import sys
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from jit_kernels import cuda_table as ct  # noqa: E402
from jit_kernels.initializers import NORMAL  # noqa: E402
from numbaemb.cuda_shard import CudaShard  # noqa: E402

from bench_cuda import median_ms, universe_keys as keys_of  # noqa: E402  (this folder)


def filled_shard(cuda, rows, dim, share):
    per_row = dim * 4
    budget = None if share >= 1.0 else max(per_row, int(rows * share) * per_row)
    s = CudaShard(dim, np.float32, (NORMAL, 0.0, 1.0, 7, np.zeros(dim)),
                  init_size=rows, max_hbm_bytes=budget)
    step = 1 << 22
    for lo in range(0, rows, step):
        s.find_or_insert(s.to_device(keys_of(np.arange(lo, min(rows, lo + step)))))
    cuda.synchronize()
    return s


def run(cuda, cp, rows, dim, share, batch, repeats, rng):
    s = filled_shard(cuda, rows, dim, share)
    idx = rng.integers(0, rows, batch)
    keys = s.to_device(keys_of(idx))
    out = cuda.device_array((batch, dim), np.float32)
    exists = cuda.device_array(batch, np.bool_)
    ms = median_ms(cuda, lambda: s.lookup(keys, out, exists), repeats)
    assert exists.copy_to_host().all()
    values = s.values
    split = values.split if isinstance(values, ct.SplitRows) else rows
    found = s.find_rows(keys).copy_to_host()       # rows are claimed per warp, not by key order
    host_rows = found[found >= split] - split
    host_bytes = host_rows.size * dim * 4
    res = {"find": batch / (ms * 1e6), "host GB/s": host_bytes / (ms * 1e6),
           "host share": host_rows.size / batch}
    if cp is not None and host_rows.size:
        tail = cp.asarray(values.tail)           # the mapped host rows, zero-copy
        r = cp.asarray(host_rows.astype(np.int64))
        g_ms = median_ms(cuda, lambda: cp.take(tail, r, axis=0), repeats)
        res["host gather GB/s"] = host_bytes / (g_ms * 1e6)
        pinned = cp.cuda.alloc_pinned_memory(host_bytes)
        src = np.frombuffer(pinned, np.uint8, host_bytes)
        src[:] = 1
        dst = cp.empty(host_bytes, np.uint8)
        c_ms = median_ms(cuda, lambda: dst.set(src), repeats)
        res["H2D GB/s"] = host_bytes / (c_ms * 1e6)
        del tail, dst
    return res


def main():
    warnings.simplefilter("ignore", category=Warning)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 24)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.5])
    args = ap.parse_args()
    cuda = ct.cuda_api()
    try:
        import cupy as cp
    except ImportError:
        cp = None
    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    name = name.decode() if isinstance(name, bytes) else name
    print(f"GPU: {name}; {args.rows} rows of dim {args.dim} float32 "
          f"({args.rows * args.dim * 4 / 2**30:.2f} GiB); batch {args.batch} keys, all hits; "
          f"median of {args.repeats}\n")
    print("| rows in HBM | host share of keys | find (B keys/s) | from host (GB/s) "
          "| host gather limit (GB/s) | H2D copy limit (GB/s) | host GB/s / gather | / H2D |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for share in args.shares:
        r = run(cuda, cp, args.rows, args.dim, share, args.batch, args.repeats, rng)
        g, c = r.get("host gather GB/s"), r.get("H2D GB/s")

        def cell(x, fmt="{:.1f}"):
            return "n/a" if x is None else fmt.format(x)
        print(f"| {share:.0%} | {r['host share']:.2f} | {r['find']:.2f} | {r['host GB/s']:.1f} "
              f"| {cell(g)} | {cell(c)} "
              f"| {cell(g and r['host GB/s'] / g, '{:.0%}')} "
              f"| {cell(c and r['host GB/s'] / c, '{:.0%}')} |", flush=True)


if __name__ == "__main__":
    main()
