"""What one bounded GPU call asks of the host, counted under the CUDA simulator:
kernel launches, device arrays made, host <-> device copies (each a wait for the
GPU) and host-side slices of device arrays (~25 us each in Numba on a real GPU),
with the call site of each allocation and slice; and a digest of the results, so a
change to the orchestration can be checked to keep them.

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/count_cuda_bounded.py [--keys 8192] [--window 32]

A full table of ``--keys`` keys (2,048-key batches; 8,192 keys: 4 ranges) takes
``--calls`` evicting calls of new keys; the counts are the last call's.  About
3 minutes on 2 cores (the simulator runs a Python thread per CUDA thread).  On a GPU
time the calls with ``bench_bounded.py --device cuda`` instead.
"""
import argparse
import collections
import hashlib
import os
import sys
import threading
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def site():
    """The innermost frame in this repository (not this file)."""
    for f in reversed(traceback.extract_stack()[:-2]):
        if f.filename.startswith(ROOT) and "site-packages" not in f.filename \
                and not f.filename.endswith("count_cuda_bounded.py"):
            return f"{os.path.relpath(f.filename, ROOT)}:{f.lineno}"
    return "?"


def instrument(counts):
    from numba import cuda
    from numba.cuda.simulator.cudadrv import devicearray as da

    from jit_kernels import cuda_table as ct
    K = ct._kernels()

    class Counted:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, config):
            launch = self.kernel[config]

            def call(*args):
                counts["launches"] += 1
                counts[f"  launch {self.name}"] += 1
                return launch(*args)
            return call
    for name in [n for n in vars(K) if not n.startswith("_")]:
        setattr(K, name, Counted(name, getattr(K, name)))

    def wrap(owner, name, label, inside=False):
        real = getattr(owner, name)

        def counted(*a, **kw):
            # (the simulator runs kernels in other threads; they index arrays too, and
            # so do its own copies: only the slices our code writes count)
            if not inside or (threading.current_thread() is threading.main_thread()
                              and "site-packages" not in sys._getframe(1).f_code.co_filename):
                counts[label] += 1
                counts[f"  {label} {site()}"] += 1
            return real(*a, **kw)
        setattr(owner, name, counted)
    wrap(cuda, "device_array", "device arrays made")
    wrap(cuda, "to_device", "to_device (made and copied)")
    wrap(da.FakeCUDAArray, "copy_to_host", "copies to the host")
    wrap(da.FakeCUDAArray, "copy_to_device", "copies to the device")
    wrap(da.FakeCUDAArray, "__getitem__", "slices", inside=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--window", default="bucket", help="bucket (the default), or slots")
    args = ap.parse_args()
    window = args.window if args.window == "bucket" else int(args.window)
    import numbaemb as ne
    from jit_kernels import bounded as kb
    from jit_kernels import cuda_table as ct
    cuda = ct.cuda_api()
    n, b = args.keys, args.batch
    keys = np.random.default_rng(0).permutation(
        np.arange(n + args.calls * b, dtype=np.int64) * 7919 + 13)
    v = ne.Variable(4, max_capacity=n, evict="lru", device="cuda", evict_window=window)
    for lo in range(0, n, b):
        v.find_or_insert(cuda.to_device(keys[lo:lo + b]))
    batches = [cuda.to_device(keys[n + i * b:n + (i + 1) * b]) for i in range(args.calls)]
    counts = collections.Counter()
    instrument(counts)
    digest = hashlib.sha1()
    for batch in batches:
        counts.clear()
        out, ev_keys, ev_values = v.find_or_insert(batch, return_evicted=True)
        for a in (out, ev_keys, ev_values):
            digest.update(np.asarray(a if isinstance(a, np.ndarray) else a.copy_to_host()))
    cut = f"buckets {v.shards[0].capacity // 32}" if window == "bucket" else \
        f"ranges {kb.ranges_for(v.shards[0].capacity, window)}"
    print(f"keys {n:,}; batch {b:,}; window {window}; {cut}; "
          f"the last of {args.calls} calls; results digest {digest.hexdigest()[:10]}")
    for name, c in sorted(counts.items(), key=lambda x: (x[0].startswith(" "), -x[1])):
        print(f"{c:5d} {name}")


if __name__ == "__main__":
    main()
