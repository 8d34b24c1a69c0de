"""Kernels over one row-aligned column: updates at given rows (policy scores, update
steps) and whole-index passes that pick keys by a column (expiry, small rows).

``col`` is ``(row_capacity, 1)`` int64; ``rows`` ``(n,)`` int64 (-1 = skip).  The
passes' per-slot tests (:func:`stale`, :func:`small`) are the bodies that
:mod:`jit_kernels.cuda_columns` runs on a GPU.
"""
import numpy as np
from numba import njit, prange

from ._inner import inner
from .halfs import load

_opts = dict(parallel=True, nogil=True, cache=True)


@njit(**_opts)
def set_rows(col, rows, value):
    """col[rows[i], 0] = value for every valid row."""
    for i in prange(rows.shape[0]):
        if rows[i] >= 0:
            col[rows[i], 0] = value


@njit(**_opts)
def count_rows(col, rows, owners):
    """col[r, 0] += number of times r occurs in rows (owner threads, no atomics)."""
    for t in prange(owners):
        for i in range(rows.shape[0]):
            r = rows[i]
            if r >= 0 and r % owners == t:
                col[r, 0] += 1


@njit(nogil=True, cache=True)
def keys_below(slots, col, threshold, out):
    """Keys whose ``col[row, 0] < threshold`` (one pass over the index ``slots``, see
    :mod:`jit_kernels.slots`) into ``out`` (capacity,); returns how many."""
    n = 0
    for s in range(slots.shape[0] // 2):
        if stale(slots, col, col, col.shape[0], threshold, s):
            out[n] = slots[2 * s]
            n += 1
    return n


@njit(nogil=True, cache=True)
def keys_with_small_rows(slots, values, min_sq, out):
    """Keys whose row of ``values`` has a squared L2 norm below ``min_sq`` (16-bit float
    rows widened, :mod:`jit_kernels.halfs`) into ``out``; returns how many."""
    n = 0
    for s in range(slots.shape[0] // 2):
        if small(slots, values, values, values.shape[0], min_sq, s):
            out[n] = slots[2 * s]
            n += 1
    return n


# ---- per-slot bodies (the CPU passes above and jit_kernels.cuda_columns run them) ----
# A column may be split in two arrays (a CUDA table's hybrid storage): row r is
# ``col[r]`` below ``split``, else ``spill[r - split]``.
@inner
def stale(slots, col, spill, split, threshold, s):
    """Whether slot ``s`` holds a key whose ``col[row, 0] < threshold``."""
    r = slots[2 * s + 1]
    if r < 0:
        return False
    return (col[r, 0] if r < split else spill[r - split, 0]) < threshold


@inner
def small(slots, values, spill, split, min_sq, s):
    """Whether slot ``s`` holds a key whose row's squared L2 norm is below ``min_sq``."""
    r = slots[2 * s + 1]
    if r < 0:
        return False
    row = values[r] if r < split else spill[r - split]
    sq = 0.0
    for c in range(row.shape[0]):
        x = np.float64(load(row, c))
        sq += x * x
    return sq < min_sq
