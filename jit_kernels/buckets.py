"""A bucketed index: HierarchicalKV's layout, inside the slots array of :mod:`.slots`.

A bounded table built with ``evict_window="bucket"`` keeps each key in one *bucket*
of ``BUCKET`` (32) consecutive slots, chosen by the key's hash.  It finds a key by a
one-byte *digest* a slot: one vector compare gives the slots whose digest matches,
and only their keys are read (a false match about once in 255 slots).  A key never
moves, so an eviction writes one slot in place and a removal leaves no tombstone.

Layout: ``slots`` (2 * capacity + capacity // 4,) int64, capacity a power of two of
at least ``BUCKET``:

* ``slots[2 s]``, ``slots[2 s + 1]``: the key and row word of slot s < capacity, as in
  a linear index (:mod:`jit_kernels.slots`; row word ``EMPTY``: free);
* then capacity // 8 pairs ``(digests, EMPTY)``: word ``2 capacity + 2 g`` holds the
  digests of slots 8 g ... 8 g + 7 (byte s % 8; 0: free).  The odd words are
  ``EMPTY``, so a pass over the array's (key, row word) pairs (an export, the column
  passes, a rehash's source) reads free slots there and needs no change.  A bucket's
  32 digests share one 64-byte line.

The kernels of a bounded table's call (:mod:`jit_kernels.bounded`'s find before a
call, its score restore and removal) tell the layouts apart by the array's length
(:func:`is_bucketed`, mask = capacity - 1); the find kernels of every table have
twins for this layout (:mod:`jit_kernels.bucket_reads`).  The bucket is a key's
probe "window" of :mod:`jit_kernels.bounded`: :mod:`jit_kernels.bucket_bounded`
inserts.

>>> slots = empty_buckets(64)
>>> s = place(slots, 63, 12345, 7)
>>> bool(find(slots, 63, 12345) == s), int(slots[2 * s + 1])
(True, 7)
>>> int(erase(slots, 63, 12345)), int(find(slots, 63, 12345))
(7, -1)
"""
import numpy as np
from numba import njit

from ._inner import inner
from .hashing import hash_key
from .lanes import ctz, even_eq32, vectors
from .slots import EMPTY

__all__ = ["BUCKET", "empty_buckets", "bucket_capacity", "is_bucketed", "home", "digests",
           "lowest", "match", "find", "free_slot", "place", "place_all", "place_by_score", "erase",
           "set_digest"]

BUCKET = 32
_BYTE = np.int64(0xFF)
_LOW = np.int64(BUCKET - 1)


def empty_buckets(capacity, empty=np.empty):
    """A fresh bucketed index of ``capacity`` slots (a power of two, >= ``BUCKET``;
    ``empty(n, dtype)`` allocates it)."""
    if capacity < BUCKET or capacity & (capacity - 1):
        raise ValueError(f"capacity must be a power of two of at least {BUCKET}, "
                         f"got {capacity}")
    slots = empty(2 * capacity + capacity // 4, np.int64)
    slots[1::2] = EMPTY
    slots[0::2] = 0
    return slots


def bucket_capacity(slots):
    """The slots of the bucketed index ``slots`` (its length is 9 / 4 of them)."""
    return slots.shape[0] * 4 // 9


@inner
def is_bucketed(slots, mask):
    """Whether ``slots`` is a bucketed index (a linear one is ``2 * (mask + 1)`` long)."""
    return slots.shape[0] != 2 * (mask + 1)


@inner
def home(key, mask):
    """``(o, d)``: the first slot of ``key``'s bucket and its digest (1 ... 255)."""
    h = hash_key(key)
    d = np.int64(h >> np.uint64(56))
    return np.int64(h & np.uint64(mask)) & ~_LOW, d if d != 0 else np.int64(1)


@inner
def lowest(m):
    """The place of the lowest set bit of the non-zero ``m``."""
    if vectors():
        return ctz(m)
    j = np.int64(0)
    while (m >> j) & 1 == 0:
        j += 1
    return j


@inner
def digests(slots, mask, o, d):
    """Bit j set where slot ``o + j``'s digest is ``d`` (j < 32; ``o``: a bucket's first
    slot): one vector compare on the CPU, a loop over the 4 words on a GPU."""
    w = 2 * (mask + 1) + (o >> 2)       # the word of slots o ... o + 7 (o / 8 pairs on)
    if vectors():
        return np.int64(even_eq32(slots, w, d))
    m = np.int64(0)
    for g in range(4):
        word = slots[w + 2 * g]
        for b in range(8):
            if (word >> (8 * b)) & _BYTE == d:
                m |= np.int64(1) << (8 * g + b)
    return m


@inner
def set_digest(slots, mask, s, d):
    """Slot ``s``'s digest = ``d`` (0: free).  The word holds 7 other slots' digests:
    one thread writes a bucket at a time."""
    w = 2 * (mask + 1) + 2 * (s >> 3)
    sh = 8 * (s & 7)
    slots[w] = (slots[w] & ~(_BYTE << sh)) | (d << sh)


@inner
def match(slots, mask, o, d, key):
    """The slot of ``key`` (digest ``d``) in the bucket at ``o``, or -1."""
    m = digests(slots, mask, o, d)
    while m != 0:
        s = o + lowest(m)
        if slots[2 * s] == key and slots[2 * s + 1] >= 0:
            return s
        m &= m - 1
    return np.int64(-1)


@inner
def find(slots, mask, key):
    """The slot of ``key``, or -1."""
    o, d = home(key, mask)
    return match(slots, mask, o, d, key)


@inner
def free_slot(slots, mask, o):
    """The first free slot of the bucket at ``o``, or -1 (the bucket is full)."""
    m = digests(slots, mask, o, 0)
    return np.int64(-1) if m == 0 else o + lowest(m)


@inner
def place(slots, mask, key, row):
    """``key -> row`` into the first free slot of its bucket, for a key known to be
    absent; its slot, or -1 (the bucket is full).  The digest is written last."""
    o, d = home(key, mask)
    s = free_slot(slots, mask, o)
    if s >= 0:
        slots[2 * s] = key
        slots[2 * s + 1] = row
        set_digest(slots, mask, s, d)
    return s


@inner
def erase(slots, mask, key):
    """Free ``key``'s slot (digest first); returns its row, or -1 if it was absent."""
    s = find(slots, mask, key)
    if s < 0:
        return np.int64(-1)
    r = slots[2 * s + 1]
    set_digest(slots, mask, s, 0)
    slots[2 * s + 1] = EMPTY
    return r


@njit(nogil=True, cache=True)
def place_all(pairs, slots, mask, over):
    """Every key of ``pairs`` (an index of either layout, or a flat array of (key, row)
    pairs: the full ones) into the bucketed index ``slots``, serially in their order:
    the same layout whatever the threads.  A key whose bucket is full is not placed:
    its pair goes to ``over`` (a flat array with room for them all, or empty: not
    kept).  Returns how many keys found their bucket full."""
    m = 0
    for s in range(pairs.shape[0] // 2):
        if pairs[2 * s + 1] >= 0 and place(slots, mask, pairs[2 * s], pairs[2 * s + 1]) < 0:
            if over.shape[0]:
                over[2 * m], over[2 * m + 1] = pairs[2 * s], pairs[2 * s + 1]
            m += 1
    return m


@njit(nogil=True, cache=True)
def place_by_score(over, slots, mask, scores, freed, dropped):
    """The pairs ``over`` (flat (key, row) pairs, ``place_all``'s overflow: their
    buckets are full) in order: a key takes the slot of the lowest-scored key of its
    bucket (``scores[row]``; the first on ties) when it scores higher, and that key is
    dropped; else it is dropped itself.  ``freed[j]`` / ``dropped[j]``: the row and key
    of the j-th dropped (one a pair)."""
    for j in range(over.shape[0] // 2):
        key, row = over[2 * j], over[2 * j + 1]
        o, d = home(key, mask)
        low, best = np.int64(0), np.int64(-1)
        for t in range(BUCKET):
            r = slots[2 * (o + t) + 1]
            if r >= 0 and (best < 0 or scores[r] < low):
                low, best = scores[r], o + t
        if best >= 0 and scores[row] > low:
            freed[j], dropped[j] = slots[2 * best + 1], slots[2 * best]
            set_digest(slots, mask, best, 0)
            slots[2 * best], slots[2 * best + 1] = key, row
            set_digest(slots, mask, best, d)
        else:
            freed[j], dropped[j] = row, key
