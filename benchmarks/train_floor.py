"""The least any embedding layer must move in a step of ``bench_train.py``'s job.

One table, measured in one run (Numba loops on one thread, the median of 15):

* the output: every position's row written into ``(65,536, 64)`` float32 (16 MB),
  warm (the buffer in cache) and cold (after a 64 MB pass evicted it);
* its gradient: the same 16 MB read once, warm (TensorFlow has just written it);
* Adam's rows: each distinct id's weight and two slot rows read and written once
  (256 B each, about 13,600 ids a batch of the job's Zipf stream), as bytes over the
  streaming bandwidth measured here (a 256 MB copy): a lower bound, since rows at
  random places stream no faster than a copy.

The sum is the embedding's floor a step; no layer trains the job in less than the
limit's step plus it.

    python benchmarks/train_floor.py
"""
import time

import numpy as np
from numba import njit

POSITIONS, DIM, VOCAB = 16_384 * 4, 64, 1_000_000


@njit(nogil=True, cache=True)
def _write(out, v):
    for i in range(out.shape[0]):
        for c in range(out.shape[1]):
            out[i, c] = v


@njit(nogil=True, cache=True)
def _read(a):
    s = np.zeros(a.shape[1], a.dtype)
    for i in range(a.shape[0]):
        for c in range(a.shape[1]):
            s[c] += a[i, c]
    return s


def median_ms(fn, before=None, n=15):
    """The median ms of ``n`` calls of ``fn()``, each after ``before()`` (untimed)."""
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def floor(ids=None):
    """``[(piece, ms)]`` and the mean distinct ids a batch of ``ids`` (``(n, 65,536)``
    int64; default 8 batches of the job's stream)."""
    out = np.ones((POSITIONS, DIM), np.float32)
    big = np.ones((1 << 18, DIM), np.float32)               # 64 MB: evicts the caches
    src, dst = np.ones(64 << 20, np.float32), np.empty(64 << 20, np.float32)
    _write(out[:1], 0.0), _read(out[:1])                   # compiled
    if ids is None:
        ids = np.random.default_rng(0).zipf(1.2, size=(8, POSITIONS)) % VOCAB
    distinct = float(np.mean([np.unique(b).shape[0] for b in ids]))
    copy_ms = median_ms(lambda: np.copyto(dst, src), n=5)
    bandwidth = 2 * src.nbytes / (copy_ms * 1e-3)           # bytes/s, read + write
    rows_ms = 2 * 3 * DIM * 4 * distinct / bandwidth * 1e3
    rows = [("output written, warm", median_ms(lambda: _write(out, 1.0))),
            ("output written, cold", median_ms(lambda: _write(out, 1.0),
                                               before=lambda: _read(big))),
            ("gradient read, warm", median_ms(lambda: _read(out))),
            (f"Adam's rows, {distinct:.0f} ids x 3 x 256 B read and written, at "
             f"{bandwidth / 1e9:.1f} GB/s", rows_ms)]
    return rows, distinct


if __name__ == "__main__":
    rows, _ = floor()
    print("| what any embedding moves a step | ms |\n|---|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")
    warm, cold = rows[0][1] + rows[2][1] + rows[3][1], rows[1][1] + rows[2][1] + rows[3][1]
    print(f"| floor (output warm / cold + gradient + rows) | {warm:.2f} / {cold:.2f} |")
