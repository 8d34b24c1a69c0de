"""What a hash slot is, and the order in which slots are probed.

The index is one int64 array ``slots`` of length ``2 * capacity``:
``slots[2*s]`` holds a key and ``slots[2*s + 1]`` the slot's *row word*.  The
row word alone says what the slot is, so no key value is ever reserved:

==========  ===========================================================
row word    meaning
==========  ===========================================================
``>= 0``    full: the key lives at that row of the value arena
``EMPTY``   never used; ends every probe sequence
``DELETED`` tombstone left by ``erase``; probing continues past it
``BUSY``    claimed by an inserter that has not published its row yet
==========  ===========================================================

``capacity`` is a power of two and ``mask = capacity - 1``.  Probing is
linear: start at ``hash_key(key) & mask`` and step by one.  Only the functions
here look at row-word values; kernels ask ``is_full`` / ``is_empty``.
"""
import numpy as np

from ._inner import inner
from .hashing import hash_key

EMPTY = -1
DELETED = -2
BUSY = -3


@inner
def is_full(word):
    return word >= 0


@inner
def is_empty(word):
    return word == EMPTY


@inner
def is_busy(word):
    return word == BUSY


@inner
def first_slot(key, mask):
    """Home slot of ``key``."""
    return np.int64(hash_key(key) & np.uint64(mask))


@inner
def next_slot(slot, mask):
    """Slot probed after ``slot`` (linear probing)."""
    return (slot + 1) & mask


def empty_slots(capacity, empty=np.empty):
    """A fresh index of ``capacity`` slots (a power of two), all EMPTY (``empty(n,
    dtype)`` allocates it)."""
    if capacity < 1 or capacity & (capacity - 1):
        raise ValueError(f"capacity must be a power of two, got {capacity}")
    slots = empty(2 * capacity, np.int64)
    slots[1::2] = EMPTY
    slots[0::2] = 0
    return slots
