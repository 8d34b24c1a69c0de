"""Rows of a bounded call (:mod:`jit_kernels.bounded`): a fill's new rows handed out
range by range after the ranges placed their keys, and a ``find_or_insert``'s values
(new rows' initial values and the output) in one pass.  The fill's bodies are the
GPU's too (:mod:`jit_kernels.cuda_bounded` runs :func:`slot_row_one` a thread a position
and :func:`range_rows` a thread a range); its ``init_copy`` is its own kernel.
``AHEAD`` is also :func:`jit_kernels.bounded.find_present`'s and ``restore_scores``'.

>>> import numpy as np
>>> values, out = np.zeros((4, 2), np.float32), np.empty((2, 2), np.float32)
>>> rows, keys = np.array([3, 1]), np.array([7, 8])
>>> inserted, present = np.array([True, False]), np.array([False, True])
>>> values[1] = 5.0
>>> init_copy(values, rows, keys, inserted, present, out, 0, 0.0, 0.0, 0, np.zeros(2, np.float32))
>>> out.tolist()                    # a new row of zeros, a present key's row
[[0.0, 0.0], [5.0, 5.0]]
"""
from numba import njit, prange

from ._inner import inner
from .cpu_table import ROWS_AHEAD, prefetch_read, prefetch_row, prefetch_write
from .initializers import init_row
from .probing import nth_row

AHEAD = 8            # keys whose index slots are requested ahead of their turn


# ---- a fill in ranges ------------------------------------------------------------------
@inner
def slot_row_one(rows, where, scores, mscore, i):
    """Before the ranges of a fill: a present key's score goes beside its slot
    (``mscore``) and its slot stands in for its row, as a new key's does."""
    if rows[i] >= 0:
        mscore[where[i]] = scores[rows[i]]
        rows[i] = where[i]


@inner
def range_rows(starts, g, base, slots, rows, where, inserted, deferred, scores, mscore,
               free_rows, n_free, fresh_start):
    """After the ranges of a fill, range ``g``'s positions (``starts[g]:starts[g + 1]``
    of the arrays in range order) in order: each inserting one takes the call's next
    new row (its ``base[g]``-th on: ``free_rows`` top down, then ``fresh_start`` on)
    into its slot, and each one its key's row, which gets the score kept beside the
    slot (``mscore`` keeps it too: the deferred keys, the last to run, cannot fill the
    table, so no victim is looked for before :func:`restore_scores`).  The accesses
    stay in the range's slots; the new rows are consecutive."""
    k = base[g]
    for t in range(starts[g], starts[g + 1]):
        if t + AHEAD < starts[g + 1] and not deferred[t + AHEAD]:
            prefetch_write(slots, 16 * where[t + AHEAD])    # (the range's slots have
            prefetch_read(mscore, 8 * where[t + AHEAD])     # left the cache by now)
        if deferred[t]:
            continue
        p = where[t]
        if inserted[t]:
            slots[2 * p + 1] = nth_row(free_rows, n_free, fresh_start, k)
            k += 1
        r = slots[2 * p + 1]
        rows[t] = r
        scores[r] = mscore[p]


@njit(nogil=True, cache=True, parallel=True)
def init_copy(values, rows, keys, inserted, present, out, kind, a, b, seed, const):
    """A bounded ``find_or_insert``'s values in one pass: each inserted row gets its
    initial value, and ``out[i]`` (n, dim) the row of ``keys[i]`` where it is readable
    (``present[i]`` when the call started, or the inserting position), else the key's
    initial value (not admitted, or a repeat of a key this call inserted, whose row
    another thread may not have written yet: the same bits)."""
    n = rows.shape[0]
    for i in prange(n):
        if i + ROWS_AHEAD < n and rows[i + ROWS_AHEAD] >= 0:
            prefetch_row(values, rows[i + ROWS_AHEAD], inserted[i + ROWS_AHEAD])
        r = rows[i]
        if inserted[i]:
            init_row(values[r], keys[i], kind, a, b, seed, const)
        if present[i] or inserted[i]:
            for c in range(out.shape[1]):
                out[i, c] = values[r, c]
        else:
            init_row(out[i], keys[i], kind, a, b, seed, const)
