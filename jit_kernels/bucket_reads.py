"""The find kernels of :mod:`jit_kernels.cpu_table` on a bucketed index.

A bounded table built with ``evict_window="bucket"`` keeps its keys in the bucketed
index of :mod:`jit_kernels.buckets`.  Its lookups run the linear index's kernels
(``find_rows``, ``lookup_rows``) compiled apart with the bucket's find in place of
the probe (:func:`jit_kernels._twins.twin_of`), so the linear tables' kernels carry no
code for it (a cold process compiled them 2.3 s slower with both layouts in one
body); the look-ahead requests a key's digests first, then the slot its digest
points to.  Removal runs serially (a slot's digest shares its word with 7 others).

>>> import numpy as np
>>> from jit_kernels.buckets import empty_buckets, place
>>> slots = empty_buckets(64)
>>> _ = [place.python_twin()(slots, 63, k, r) for r, k in enumerate([5, -9, 12])]
>>> rows = np.empty(4, np.int64)
>>> int(find_rows(slots, 63, np.array([12, 5, 7, -9]), rows)), rows.tolist()
(1, [2, 0, -1, 1])
>>> freed = np.empty(2, np.int64); erase_keys(slots, 63, np.array([5, 5]), freed)
>>> freed.tolist()
[0, -1]
"""
import numpy as np
from numba import njit

from . import cpu_table as _ct
from ._inner import inner
from ._twins import BySize, twin_of
from .buckets import digests, erase, find, home, lowest
from .cpu_table import prefetch_at, prefetch_read

__all__ = ["find_rows", "lookup", "lookup_rows", "erase_keys"]


@inner
def find_row(slots, mask, key):
    """Row of ``key`` in the bucketed index ``slots``, or -1."""
    s = find(slots, mask, key)
    return np.int64(-1) if s < 0 else slots[2 * s + 1]


@inner
def prefetch_slot(slots, mask, key, write):
    """Request the line of ``key``'s bucket's digests."""
    prefetch_at(slots, 8 * (2 * (mask + 1) + (home(key, mask)[0] >> 2)), write)


@inner
def prefetch_second(slots, mask, key):
    """Request the slot ``key``'s digest points to (its digests' line was requested
    first): the line the find reads next."""
    o, d = home(key, mask)
    m = digests(slots, mask, o, d)
    if m != 0:
        prefetch_read(slots, 16 * (o + lowest(m)))


_HELPERS = {"find_row": find_row, "prefetch_slot": prefetch_slot,
            "prefetch_second": prefetch_second}
find_rows = BySize(twin_of(_ct.find_rows.parallel, "__buckets", _HELPERS), 2)
lookup_rows = BySize(twin_of(_ct.lookup_rows.parallel, "__buckets", _HELPERS), 2, 4)


def lookup(slots, mask, keys, values, out, exists, kind, a, b, seed, const):
    """:func:`jit_kernels.cpu_table.lookup` on a bucketed index."""
    lookup_rows(slots, mask, keys, values, out, exists, kind, a, b, seed, const,
                np.empty(keys.shape[0], np.int64), _ct.STREAM_MIN)


@njit(nogil=True, cache=True)
def erase_keys(slots, mask, keys, freed):
    """Free each present key's slot; ``freed[i]`` = the row released by ``keys[i]``, else
    -1 (a key repeated in the batch releases its row once)."""
    for i in range(keys.shape[0]):
        freed[i] = erase(slots, mask, keys[i])
