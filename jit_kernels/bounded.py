"""Inserts into a table of bounded size: eviction of the lowest-scored key of a window.

A bounded table never holds more than ``limit`` keys.  Each key has a *score*
(int64, in a row-aligned column) that the inserting kernel updates as it finds or
inserts the key (no extra probe):

=========  ===  ==================================================================
policy     id   score after a find or insert
=========  ===  ==================================================================
lru        0    the table's clock (one tick per inserting call)
lfu        1    occurrences so far (1 when inserted)
epoch_lru  2    ``epoch << 32 | clock`` (low 32 bits of the clock)
epoch_lfu  3    ``epoch << 32 | occurrences in this epoch``
custom     4    the caller's score for that position
=========  ===  ==================================================================

An absent key arriving when the table is full looks at the ``window`` index slots
from its home slot and takes the lowest-scored key there that is not in this call
(first on ties; the call's present keys are marked before any insert); if its own score is lower it is not admitted (row -1),
else the victim is evicted: its slot becomes a tombstone, its row is reused and
``(key, row)`` is reported so the caller can hand its values out first (HKV's
``insert_and_evict``).  The pass is serial (one thread, batch order): the
result does not depend on thread timing.

>>> import numpy as np
>>> from jit_kernels.slots import empty_slots
>>> slots = empty_slots(8); scores = np.zeros(4, np.int64); stamp = np.zeros(4, np.int64)
>>> rows = np.empty(3, np.int64); new = np.empty(3, np.bool_)
>>> find_present(slots, 7, np.array([5, 6, 7]), rows, stamp, 1)
>>> ek, er = np.empty(3, np.int64), np.empty(3, np.int64)
>>> out = bounded_insert(slots, 7, np.array([5, 6, 7]), np.zeros(3, np.int64), scores, stamp,
...                      1, rows, new, np.empty(0, np.int64), 0, 0, 0, 2, 8, LRU, 0, 1, False,
...                      ek, er)
>>> out[0], out[1], out[3]      # rows taken, keys evicted, size after: 7 evicted 5 or 6
(2, 0, 2)
>>> bool(rows[2] == -1)         # ... unless every candidate was touched by this call
True
"""
import numpy as np
from numba import njit, prange

from .slots import DELETED, EMPTY, first_slot, next_slot

LRU, LFU, EPOCH_LRU, EPOCH_LFU, CUSTOM = 0, 1, 2, 3, 4
POLICIES = {"lru": LRU, "lfu": LFU, "epoch_lru": EPOCH_LRU, "epoch_lfu": EPOCH_LFU,
            "custom": CUSTOM}
_LOW = np.int64(0xFFFFFFFF)


@njit(nogil=True, cache=True)
def touched(policy, old, given, epoch, clock, fresh, keep):
    """A key's score after this call finds it (``old``: its score) or inserts it;
    ``keep``: a custom-scored call without scores (an optimizer step) keeps a found
    key's score and gives a new one 0."""
    if policy == LRU:
        return clock
    if policy == LFU:
        return np.int64(1) if fresh else old + 1
    if policy == EPOCH_LRU:
        return (epoch << 32) | (clock & _LOW)
    if policy == EPOCH_LFU:
        if fresh or (old >> 32) != epoch:
            return (epoch << 32) | 1
        return old + 1 if (old & _LOW) < _LOW else old
    if keep:
        return np.int64(0) if fresh else old
    return given


@njit(nogil=True, cache=True)
def _place(slots, mask, key, row):
    """Put absent ``key`` in the first tombstone or empty slot of its probe sequence;
    returns whether that slot was a tombstone."""
    s = first_slot(key, mask)
    for _ in range(mask + 1):
        w = slots[2 * s + 1]
        if w == EMPTY or w == DELETED:
            slots[2 * s] = key
            slots[2 * s + 1] = row
            return w == DELETED
        s = next_slot(s, mask)
    return False


@njit(nogil=True, cache=True)
def _find(slots, mask, key):
    s = first_slot(key, mask)
    for _ in range(mask + 1):
        w = slots[2 * s + 1]
        if w == EMPTY:
            return -1
        if w >= 0 and slots[2 * s] == key:
            return s
        s = next_slot(s, mask)
    return -1


@njit(nogil=True, cache=True)
def _victim(slots, mask, key, window, scores, stamp, batch):
    """``(slot, score)`` of the lowest-scored untouched key in ``key``'s window, or -1."""
    s = first_slot(key, mask)
    best, best_score = -1, np.int64(0)
    for _ in range(window):
        r = slots[2 * s + 1]
        if r >= 0 and stamp[r] != batch and (best < 0 or scores[r] < best_score):
            best, best_score = s, scores[r]
        s = next_slot(s, mask)
    return best, best_score


@njit(nogil=True, cache=True, parallel=True)
def find_present(slots, mask, keys, rows, stamp, batch):
    """``rows[i]`` = the row of ``keys[i]``, or -2 when absent; ``stamp[row] = batch``
    for every present key, so no key of the call is a victim (parallel, read-only
    on the index; before :func:`bounded_insert`)."""
    for i in prange(keys.shape[0]):
        s = _find(slots, mask, keys[i])
        rows[i] = -2 if s < 0 else slots[2 * s + 1]
        if s >= 0:
            stamp[rows[i]] = batch


@njit(nogil=True, cache=True)
def bounded_insert(slots, mask, keys, given, scores, stamp, batch, rows, inserted, free_rows,
                   n_free, fresh_start, size, limit, window, policy, epoch, clock, keep,
                   ev_keys, ev_rows):
    """Find or insert every key of ``keys`` (n,) in batch order, evicting when full.

    ``rows`` (n,) comes filled by :func:`find_present` (which also stamped the present
    keys); ``rows[i]`` gets the key's row or -1 (not admitted), ``inserted[i]`` marks
    the position that inserted it.  ``scores`` (rows,) int64 is updated (see the module
    doc; ``given`` (n,) the custom scores), ``stamp[row] = batch`` marks the rows
    this call touched.  New rows come from ``free_rows[:n_free]`` (top down), then
    ``fresh_start, fresh_start + 1, ...``; ``keep``: see :func:`touched`; ``ev_keys`` / ``ev_rows`` (n,) receive
    the evicted keys and their rows.  Returns ``(rows taken, keys evicted,
    tombstones made minus consumed, size after)``.
    """
    taken = 0
    n_ev = 0
    d_deleted = 0
    n = keys.shape[0]
    for i in range(n):              # in batch order: scores, inserts, evictions
        key = keys[i]
        inserted[i] = False
        if rows[i] >= 0:
            r = rows[i]
            scores[r] = touched(policy, scores[r], given[i], epoch, clock, False, keep)
            continue
        s = _find(slots, mask, key)  # a repeat of a key this call inserted
        if s >= 0:
            r = slots[2 * s + 1]
            rows[i] = r
            scores[r] = touched(policy, scores[r], given[i], epoch, clock, False, keep)
            continue
        score = touched(policy, np.int64(0), given[i], epoch, clock, True, keep)
        if size < limit:
            r = free_rows[n_free - 1 - taken] if taken < n_free else fresh_start + taken - n_free
            taken += 1
            size += 1
        else:
            v, v_score = _victim(slots, mask, key, window, scores, stamp, batch)
            if v < 0 or score < v_score:
                rows[i] = -1
                inserted[i] = False
                continue
            r = slots[2 * v + 1]
            ev_keys[n_ev] = slots[2 * v]
            ev_rows[n_ev] = r
            n_ev += 1
            slots[2 * v + 1] = DELETED
            d_deleted += 1
        if _place(slots, mask, key, r):
            d_deleted -= 1
        scores[r] = score
        stamp[r] = batch
        rows[i] = r
        inserted[i] = True
    return taken, n_ev, d_deleted, size
