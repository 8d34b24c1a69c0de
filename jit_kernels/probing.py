"""Per-element hash-index operations: the bodies every driver (CPU or CUDA) calls.

Each function handles one key and is safe to run concurrently with the same
function on other keys (inserts claim slots by compare-and-swap on the row
word).  ``find_slot`` is read-only; it may run beside inserts only with
``synced=True``, and never beside erases.

>>> import numpy as np
>>> from jit_kernels.slots import empty_slots
>>> s = empty_slots(8); alloc = np.zeros(1, np.int64); free = np.zeros(0, np.int64)
>>> find_or_insert_key(s, 7, -1, alloc, free, 0, 0)
(0, True)
>>> int(find_slot(s, 7, -1)) >= 0
True
"""

from ._inner import inner
from .atomics import cas, claim, load_acquire, store_release
from .halfs import load, store
from .slots import BUSY, DELETED, EMPTY, first_slot, is_busy, is_empty, is_full, next_slot


@inner
def find_slot(slots, mask, key, synced=False):
    """Slot index holding ``key``, or -1 when absent.

    ``synced`` reads row words with acquire loads: needed while other threads
    insert (a published row word must not be paired with a stale key); a
    read-only pass (lookup) uses plain loads.
    """
    s = first_slot(key, mask)
    for _ in range(mask + 1):
        word = load_acquire(slots, 2 * s + 1) if synced else slots[2 * s + 1]
        if is_empty(word):
            return -1
        if is_full(word) and slots[2 * s] == key:
            return s
        s = next_slot(s, mask)
    return -1


@inner
def find_row(slots, mask, key, synced=False):
    """Row of ``key`` in the value arena, or -1 when absent (``synced``: see find_slot)."""
    s = find_slot(slots, mask, key, synced)
    if s < 0:
        return -1
    return slots[2 * s + 1]


@inner
def find_row_x4(slots, mask, key):
    """:func:`find_row`'s result for a read-only pass, four slots a step: a step's
    eight loads (four keys, four row words, the same 64 bytes) issue together, so a
    chain of c slots waits on about c / 4 loads.  For GPUs, where a lane's loads do
    not overlap across a loop's iterations; an index has at least 16 slots."""
    s = first_slot(key, mask)
    for _ in range(0, mask + 1, 4):
        s1, s2, s3 = (s + 1) & mask, (s + 2) & mask, (s + 3) & mask
        w0, w1, w2, w3 = slots[2 * s + 1], slots[2 * s1 + 1], slots[2 * s2 + 1], slots[2 * s3 + 1]
        k0, k1, k2, k3 = slots[2 * s], slots[2 * s1], slots[2 * s2], slots[2 * s3]
        if is_empty(w0):
            return -1
        if is_full(w0) and k0 == key:
            return w0
        if is_empty(w1):
            return -1
        if is_full(w1) and k1 == key:
            return w1
        if is_empty(w2):
            return -1
        if is_full(w2) and k2 == key:
            return w2
        if is_empty(w3):
            return -1
        if is_full(w3) and k3 == key:
            return w3
        s = (s + 4) & mask
    return -1


@inner(inline="always")
def nth_row(free_rows, n_free, fresh_start, c):
    """The ``c``-th row a call hands out: the free list's first (top down), then fresh
    rows from ``fresh_start``."""
    return free_rows[n_free - 1 - c] if c < n_free else fresh_start + (c - n_free)


@inner
def take_row(alloc, free_rows, n_free, fresh_start):
    """Hand out one row: first from the free list (top down), then fresh rows.

    ``alloc[0]`` counts rows handed out during this launch (on CUDA one atomic per
    warp, see :func:`jit_kernels.atomics.claim`).
    """
    return nth_row(free_rows, n_free, fresh_start, claim(alloc, 0))


@inner
def find_or_insert_key(slots, mask, key, alloc, free_rows, n_free, fresh_start):
    """Row of ``key``, inserting it with a newly taken row when absent.

    Returns ``(row, inserted)``; ``row`` is -1 only if the index is full (the
    caller reserves capacity first, so that does not happen).  Concurrent calls
    with the same key agree on one row and exactly one reports ``inserted``.
    Tombstones are not reused here (that would need a second pass to rule out
    a later copy of the key); ``rehash`` clears them.
    """
    s = first_slot(key, mask)
    for _ in range(mask + 1):
        word = load_acquire(slots, 2 * s + 1)
        if is_empty(word):
            word = cas(slots, 2 * s + 1, EMPTY, BUSY)
            if is_empty(word):  # we own the slot: write the key, then publish the row
                slots[2 * s] = key
                row = take_row(alloc, free_rows, n_free, fresh_start)
                store_release(slots, 2 * s + 1, row)
                return row, True
            word = load_acquire(slots, 2 * s + 1)   # the CAS may be relaxed (CUDA)
        while is_busy(word):  # another inserter is publishing this slot
            word = load_acquire(slots, 2 * s + 1)
        if is_full(word) and slots[2 * s] == key:
            return word, False
        s = next_slot(s, mask)
    return -1, False


@inner
def insert_unique(slots, mask, key, row):
    """Place ``key -> row`` for a key known to be absent (rehash, bulk load)."""
    s = first_slot(key, mask)
    for _ in range(mask + 1):
        if is_empty(load_acquire(slots, 2 * s + 1)):
            if is_empty(cas(slots, 2 * s + 1, EMPTY, BUSY)):
                slots[2 * s] = key
                store_release(slots, 2 * s + 1, row)
                return s
        s = next_slot(s, mask)
    return -1


@inner
def erase_key(slots, mask, key):
    """Turn ``key``'s slot into a tombstone; returns the freed row or -1.

    Of concurrent erases of the same key exactly one gets the row back.
    """
    s = find_slot(slots, mask, key)
    if s < 0:
        return -1
    word = slots[2 * s + 1]
    if cas(slots, 2 * s + 1, word, DELETED) == word:
        return word
    return -1


@inner
def accum_group(slots, mask, keys, order, lo, hi, values, spill, split, old, new, exists,
                rows, inserted, alloc, free_rows, n_free, fresh_start):
    """Replay TFRA ``accum`` for one key's positions ``order[lo:hi]`` in batch order.

    Where the key is present and ``exists`` is true add ``new - old``; where it is
    absent and ``exists`` is false insert ``new``; otherwise do nothing.  ``rows[p]``
    gets the row touched (or -1) and ``inserted[p]`` marks the inserting position.
    Row ``r`` lives at ``values[r]`` below ``split`` and at ``spill[r - split]`` above
    (rows kept in host memory by a GPU table; the CPU passes ``split = len(values)``).
    16-bit float rows (:mod:`jit_kernels.halfs`) add in float32 (``old`` and ``new``
    float32) and round once.
    """
    key = keys[order[lo]]
    r = find_row(slots, mask, key, True)     # other groups insert meanwhile
    for j in range(lo, hi):
        p = order[j]
        rows[p] = -1
        inserted[p] = False
        if exists[p] and r >= 0:
            row = values[r] if r < split else spill[r - split]
            for c in range(row.shape[0]):
                store(row, c, load(row, c) + (new[p, c] - old[p, c]))
            rows[p] = r
        elif not exists[p] and r < 0:
            r, _ = find_or_insert_key(slots, mask, key, alloc, free_rows, n_free, fresh_start)
            row = values[r] if r < split else spill[r - split]
            for c in range(row.shape[0]):
                store(row, c, new[p, c])
            rows[p] = r
            inserted[p] = True
