"""Finding a key in a bounded table's index, linear (:mod:`jit_kernels.slots`) or
bucketed (:mod:`jit_kernels.buckets`): the kernels of a call that work on either
(:mod:`jit_kernels.bounded`'s find before a call, its score restore and removal) tell
them apart by the array's length.

>>> import numpy as np
>>> from jit_kernels.buckets import empty_buckets, place
>>> slots = empty_buckets(32)
>>> s = place.python_twin()(slots, 31, 7, 0)
>>> bool(find_slot(slots, 31, 7) == s), int(find_slot(slots, 31, 8))
(True, -1)
"""
import numpy as np

from ._inner import inner
from .buckets import digests, find as bucket_find, home as bucket_home, is_bucketed, lowest
from .cpu_table import prefetch_write
from .slots import EMPTY, first_slot, next_slot

__all__ = ["find_slot", "slot_ahead"]


@inner
def find_slot(slots, mask, key):
    """The slot of ``key`` in a bounded table's index, linear or bucketed, or -1."""
    if is_bucketed(slots, mask):        # (jit_kernels.bucket_bounded's tables)
        return bucket_find(slots, mask, key)
    s = first_slot(key, mask)
    for _ in range(mask + 1):
        w = slots[2 * s + 1]
        if w == EMPTY:
            return -1
        if w >= 0 and slots[2 * s] == key:
            return s
        s = next_slot(s, mask)
    return -1


@inner
def slot_ahead(slots, mask, key):
    """Where :func:`find_present` will likely find ``key`` (-1: no guess), from the
    lines requested for it: its home slot if the key is there; in a bucketed index
    (:mod:`jit_kernels.buckets`), the first slot its digest matches (whose line is
    requested too: its key is read next)."""
    if is_bucketed(slots, mask):
        o, d = bucket_home(key, mask)
        m = digests(slots, mask, o, d)
        if m == 0:
            return np.int64(-1)
        s = o + lowest(m)
        prefetch_write(slots, 16 * s)
        return s
    h = first_slot(key, mask)
    return h if slots[2 * h] == key else np.int64(-1)
