"""Throughput of the CUDA hash-index drivers against a plain CuPy gather (the limit).

Prints one Markdown table: per value width and load factor, billions of keys
per second for find, find_or_insert, insert_or_assign (upsert), accum and
export, beside ``cupy.take(values, rows, axis=0)`` of the same rows by known
row number (no hashing: the bandwidth limit of a lookup).

    python benchmarks/bench_cuda.py                      # the issue's sizes (H100: ~2 min)
    python benchmarks/bench_cuda.py --log2-capacity 20 --batch 65536 --repeats 3   # smoke
    python benchmarks/bench_cuda.py --profile --init zeros   # find_or_insert's parts; no draws

Method
------
* Index of ``2**log2_capacity`` slots (default 2**26 = 64M) filled to load 0.5
  and 0.9 with distinct scattered keys (``i * 0x9E3779B97F4A7C15``).  The
  shard's MAX_LOAD of 0.75 would rehash before 0.9, so the index is built
  directly through ``jit_kernels.cuda_table.find_or_insert_rows`` and every
  operation runs the drivers exactly as ``numbaemb.cuda_shard.CudaShard`` does
  (same kernels, same reused scratch buffers, same host syncs), minus the
  capacity checks.
* Batches of ``--batch`` (default 1M) keys.  find: keys drawn uniformly from
  the present keys (all hits).  find_or_insert / insert_or_assign / accum: keys
  drawn uniformly from a universe of ``capacity`` keys of which the first
  ``load * capacity`` are present, so the hit rate equals the load factor
  (accum: ``exists`` true for present keys).  export: every key and its row.
* find and find_or_insert return the values (``(batch, dim)`` float32) as the
  Variable does; outputs are preallocated once.
* Timing: CUDA events around the host call (kernel launches, allocations and
  syncs included); each operation runs twice untimed first (compilation), then
  ``--repeats`` times; the median is reported.  Mutations restore the index
  from a device copy before every run (untimed), so each run starts from the
  same load.
"""
import argparse
import os
import statistics
import sys
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from jit_kernels import cuda_table as ct  # noqa: E402
from jit_kernels.initializers import NORMAL, ZEROS  # noqa: E402

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def universe_keys(idx):
    """Distinct, scattered int64 keys for indices ``idx`` (a bijection on uint64)."""
    return (np.asarray(idx, np.uint64) * GOLDEN).view(np.int64)


def median_ms(cuda, fn, repeats, restore=None):
    """Median milliseconds of ``fn()`` measured with CUDA events, after two untimed
    runs; ``restore()`` (untimed) before each run."""
    start, end = cuda.event(), cuda.event()
    times = []
    for rep in range(2 + repeats):
        if restore:
            restore()
        cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        if rep >= 2:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


class Bench:
    def __init__(self, cuda, log2_capacity, batch, repeats, profile=False, init_kind=NORMAL,
                 x4=False):
        self.cuda = cuda
        self.x4 = x4
        self.init_kind = init_kind
        self.profile = profile
        self.cap = 1 << log2_capacity
        self.mask = self.cap - 1
        self.batch = batch
        self.repeats = repeats
        self.rng = np.random.default_rng(0)

    def time(self, fn, restore=None):
        return median_ms(self.cuda, fn, self.repeats, restore)

    def build(self, load, dim):
        """Index at ``load``, a value arena with room for one batch of inserts."""
        cuda = self.cuda
        n = int(load * self.cap)
        self.n_present = n
        self.slots = ct.device_empty_slots(self.cap)
        step = 1 << 23
        no_free = cuda.to_device(np.zeros(1, np.int64))
        for lo in range(0, n, step):
            keys = cuda.to_device(universe_keys(np.arange(lo, min(n, lo + step))))
            m = keys.shape[0]
            rows = cuda.device_array(m, np.int64)
            ins = cuda.device_array(m, np.bool_)
            alloc = cuda.to_device(np.zeros(1, np.int64))
            ct.find_or_insert_rows(self.slots, self.mask, keys, rows, ins, alloc, no_free, 0, lo)
            del keys, rows, ins
        self.backup = cuda.device_array_like(self.slots)
        self.backup.copy_to_device(self.slots)
        self.values = cuda.device_array((n + self.batch, dim), np.float32)
        ct.init_rows(self.values, cuda.to_device(np.arange(n, dtype=np.int64)),
                     cuda.to_device(universe_keys(np.arange(n))), ct.filled(n, True, np.bool_),
                     NORMAL, 0.0, 1.0, 7, cuda.to_device(np.zeros(dim)))
        self.init = (self.init_kind, 0.0, 1.0, 7, cuda.to_device(np.zeros(dim)))
        self.no_free = no_free
        cuda.synchronize()

    def restore(self):
        self.slots.copy_to_device(self.backup)

    def run(self, dim, load):
        cuda, b = self.cuda, self.batch
        self.build(load, dim)
        hit_idx = self.rng.integers(0, self.n_present, b)
        hits = cuda.to_device(universe_keys(hit_idx))
        mixed_idx = self.rng.integers(0, self.cap, b)
        mixed = cuda.to_device(universe_keys(mixed_idx))
        exists = cuda.to_device(mixed_idx < self.n_present)
        out = cuda.device_array((b, dim), np.float32)
        ex = cuda.device_array(b, np.bool_)
        src = cuda.device_array((b, dim), np.float32)
        res = {}

        res["find"] = self.time(lambda: ct.lookup(self.slots, self.mask, hits, self.values,
                                                  out, ex, *self.init))
        if self.x4:                    # four slots a probe step (probing.find_row_x4)
            res["find x4"] = self.time(lambda: ct.lookup(
                self.slots, self.mask, hits, self.values, out, ex, *self.init, step=4))

        sc = ct.Scratch()

        def insert(keys, then=None):
            rows = sc.array("rows", b, np.int64)
            inserted = sc.array("inserted", b, np.bool_)
            ct.insert_rows(self.slots, self.mask, keys, rows, inserted, self.no_free, 0,
                           self.n_present, sc, then and (lambda: then(rows, inserted)))
            return rows, inserted

        def find_or_insert():    # as Variable -> CudaShard.find_or_insert(keys, out)
            _, inserted = insert(mixed, lambda rows, inserted: ct.init_gather(
                self.values, rows, mixed, inserted, self.n_present, out, *self.init))
            ct.invert(inserted, ex)

        def upsert():
            rows, _ = insert(mixed)
            ct.assign_rows(self.values, rows, src, scratch=sc)

        def accum():
            order, starts = ct.group_keys(mixed, sc)
            _ = b - ct.count_true(exists, sc)     # the shard sizes its reserve with this
            rows = sc.array("rows", b, np.int64)
            inserted = sc.array("inserted", b, np.bool_)
            alloc, c0 = sc.counter("alloc")
            ct.accum_groups(self.slots, self.mask, mixed, order, starts, self.values, src, out,
                            exists, rows, inserted, alloc, self.no_free, c0, self.n_present)
            sc.read("alloc")

        res["find_or_insert"] = self.time(find_or_insert, self.restore)
        if self.profile:   # its parts, each timed alone from the same starting index
            res["fi: insert"] = self.time(lambda: insert(mixed), self.restore)
            rows, inserted = insert(mixed)
            res["fi: init_gather"] = self.time(lambda: ct.init_gather(
                self.values, rows, mixed, inserted, self.n_present, out, *self.init))
            self.restore()
        res["insert_or_assign"] = self.time(upsert, self.restore)
        res["accum"] = self.time(accum, self.restore)

        def export():
            keys, rows = ct.export_slots(self.slots)
            vals = cuda.device_array((keys.shape[0], dim), np.float32)
            ct.gather(self.values, rows, vals)
            return keys, vals
        self.restore()
        res["export"] = self.time(export)

        res["limit"] = None
        try:
            import cupy as cp
            v = cp.asarray(self.values)
            rows = cp.asarray(hit_idx.astype(np.int64))   # as many random rows as find reads
            res["limit"] = self.time(lambda: cp.take(v, rows, axis=0))
        except ImportError:
            pass
        rate = {k: (self.n_present if k == "export" else b) / (ms * 1e6)
                for k, ms in res.items() if ms is not None}
        del self.slots, self.backup, self.values
        return rate


def main():
    warnings.simplefilter("ignore", category=Warning)   # numba's performance hints
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2-capacity", type=int, default=26)
    ap.add_argument("--batch", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--loads", type=float, nargs="+", default=[0.5, 0.9])
    ap.add_argument("--init", choices=["normal", "zeros"], default="normal",
                    help="initializer of new rows (default normal(0, 1), as a table "
                         "of embeddings would use; zeros: no per-value work)")
    ap.add_argument("--x4", action="store_true",
                    help="also time find with the probe that reads four slots a step "
                         "(printed after the table)")
    ap.add_argument("--profile", action="store_true",
                    help="also time find_or_insert's parts alone (printed after the table)")
    args = ap.parse_args()
    cuda = ct.cuda_api()
    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    name = name.decode() if isinstance(name, bytes) else name
    bench = Bench(cuda, args.log2_capacity, args.batch, args.repeats, args.profile,
                  NORMAL if args.init == "normal" else ZEROS, args.x4)
    ops = ["find", "find_or_insert", "insert_or_assign", "accum", "export", "limit"]
    print(f"GPU: {name}; index 2^{args.log2_capacity} slots; batch {args.batch} keys; "
          f"float32 values; {args.init} initializer; billions of keys/s "
          f"(median of {args.repeats})\n")
    print("| dim | load | " + " | ".join(ops[:-1]) + " | gather limit | find / limit |")
    print("|---:|---:|" + "---:|" * (len(ops) + 1))
    parts, x4 = [], []
    for dim in args.dims:
        for load in args.loads:
            r = bench.run(dim, load)
            cells = [f"{r[k]:.2f}" if k in r else "n/a" for k in ops]
            frac = f"{100 * r['find'] / r['limit']:.0f}%" if "limit" in r else "n/a"
            print(f"| {dim} | {load} | " + " | ".join(cells) + f" | {frac} |", flush=True)
            parts.append((dim, load, {k: v for k, v in r.items() if k.startswith("fi: ")}))
            x4.append((dim, load, r["find"], r.get("find x4")))
    if args.x4:
        print("\nfind, slots a probe step (billions of keys/s):")
        for dim, load, one, four in x4:
            print(f"  dim {dim} load {load}: one {one:.2f}, four {four:.2f} ({four / one:.2f}x)")
    if args.profile:
        print("\nfind_or_insert, its parts alone (milliseconds per batch):")
        for dim, load, p in parts:
            print(f"  dim {dim} load {load}: " + ", ".join(
                f"{k[4:]} {args.batch / (v * 1e6):.3f} ms" for k, v in p.items()))


if __name__ == "__main__":
    main()
