"""The cost of launching a Numba parallel kernel under each OpenMP wait setting.

numbaemb's kernels are many short parallel regions (a bounded insert runs about ten
a call).  Between regions Numba's OpenMP workers wait; how they wait decides what the
next region pays to start.  This script launches a 100-element ``prange`` kernel 400
times from Python, with about 0.3 ms of Python work between launches (as a training
step's kernels are spaced), in a fresh process per setting, on an idle machine and
with ``--busy`` processes spinning on the cores (a loaded machine: TensorFlow's
pools, an input pipeline, other jobs).  "limit": the same kernel compiled serial (no
thread pool).  Prints one Markdown table.

    python benchmarks/bench_launch.py              # idle, then 2 busy processes
    python benchmarks/bench_launch.py --busy 0 4
"""
import argparse
import os
import subprocess
import sys
import time

SETTINGS = [
    ("serial build (limit: no thread pool)", {}, True),
    ("OMP_WAIT_POLICY=PASSIVE (numbaemb's default before session 24)",
     {"OMP_WAIT_POLICY": "PASSIVE"}, False),
    ("GOMP_SPINCOUNT=3000 (numbaemb's default)", {}, False),
    ("GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}, False),
    ("GOMP_SPINCOUNT=30000", {"GOMP_SPINCOUNT": "30000"}, False),
    ("OpenMP's default (300000 spins)", {"GOMP_SPINCOUNT": "300000"}, False),
]

CHILD = r"""
import sys, time, numpy as np
import numbaemb
from numba import njit, prange
serial = sys.argv[1] == "1"
@njit(parallel=not serial)
def f(a):
    for i in prange(a.shape[0]):
        a[i] += 1
a = np.zeros(100)
f(a)
ts = []
for _ in range(400):
    x = sum(range(20000))           # Python work between launches
    t0 = time.perf_counter()
    f(a)
    ts.append(time.perf_counter() - t0)
ts = np.array(ts) * 1e6
print(np.median(ts), ts.mean(), np.percentile(ts, 99))
"""


def launch(env_extra, serial):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", CHILD, "1" if serial else "0"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return [float(x) for x in out.split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 2],
                    help="busy processes to run beside it, one table column pair each")
    args = ap.parse_args()
    results = {}
    for busy in args.busy:
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(busy)]
        try:
            time.sleep(0.5)
            for name, env, serial in SETTINGS:
                results[name, busy] = launch(env, serial)
        finally:
            for p in spinners:
                p.kill()
    print(f"cpus {os.cpu_count()}; 400 launches of a 100-element prange kernel, 0.3 ms of "
          "Python between launches; microseconds a launch, median / mean / p99")
    print("| setting | " + " | ".join(f"{b} busy processes" for b in args.busy) + " |")
    print("|---|" + "---:|" * len(args.busy))
    for name, _, _ in SETTINGS:
        cells = [" / ".join(f"{x:.0f}" for x in results[name, b]) for b in args.busy]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
