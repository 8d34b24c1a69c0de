"""Positions of a bounded call grouped by range of the index, for the passes of
:func:`jit_kernels.bounded.bounded_insert_ranges` (counting sorts, batch order kept
in a group), and the call's evictions put back in the order of their positions.

>>> import numpy as np
>>> keys = np.array([5, 6, 7]); rows = np.array([-2, -2, -2]); where = np.full(3, -1)
>>> starts, rank, keys2, _, _, _ = by_range(1023, keys, keys, rows, where, 4)
>>> int(starts[-1]), sorted(rank.tolist()), bool((keys2[rank] == keys).all())
(3, [0, 1, 2], True)
"""
import numpy as np
from numba import njit, prange

from ._inner import inner
from .slots import first_slot


@inner
def stable_groups(ids, n_groups):
    """``(order, starts)``: the positions of ``ids`` (n,) in ``[0, n_groups)`` grouped
    by id, ascending in a group (a counting sort); group g is
    ``order[starts[g]:starts[g + 1]]``."""
    n = ids.shape[0]
    starts = np.zeros(n_groups + 1, np.int64)
    for i in range(n):
        starts[ids[i] + 1] += 1
    for g in range(n_groups):
        starts[g + 1] += starts[g]
    order = np.empty(n, np.int64)
    fill = starts[:-1].copy()
    for i in range(n):
        order[fill[ids[i]]] = i
        fill[ids[i]] += 1
    return order, starts


@inner
def block_places(place):
    """A counting sort's middle: ``place`` (blocks, groups) holds each block's count of
    positions in each group; it gets each block's first place in each group (group by
    group, a group's blocks in order) and the groups' starts (groups + 1,) are
    returned."""
    n_blocks, n_groups = place.shape
    starts = np.empty(n_groups + 1, np.int64)
    o = 0
    for g in range(n_groups):
        starts[g] = o
        for c in range(n_blocks):
            k = place[c, g]
            place[c, g] = o
            o += k
    starts[n_groups] = o
    return starts


SORT_BLOCKS = 16     # blocks of positions by_range counts and places in parallel


@njit(nogil=True, cache=True, parallel=True)
def by_range(mask, keys, given, rows, where, n_ranges, with_given=True):
    """The positions grouped by range of the index, batch order in a range (present
    keys by their slot, absent ones by their home slot): ``(starts, rank, keys2,
    given2, rows2, where2)``: position i goes to place ``rank[i]``, range g's places
    are ``starts[g]:starts[g + 1]``, and ``keys2`` ... hold ``keys`` ... in that order
    (``given2`` is ``given`` itself unless ``with_given``: scores nobody reads).

    A stable counting sort on all threads: each of up to ``SORT_BLOCKS`` blocks of
    positions is counted per range, then placed after the earlier blocks' positions
    of the range (the result does not depend on the number of blocks)."""
    n = keys.shape[0]
    span = (mask + 1) // n_ranges
    n_blocks = max(1, min(SORT_BLOCKS, n // 1024))
    step = (n + n_blocks - 1) // n_blocks
    ids = np.empty(n, np.int64)
    place = np.zeros((n_blocks, n_ranges), np.int64)    # counts, then next places
    for c in prange(n_blocks):
        for i in range(c * step, min((c + 1) * step, n)):
            g = (where[i] if rows[i] >= 0 else first_slot(keys[i], mask)) // span
            ids[i] = g
            place[c, g] += 1
    starts = block_places(place)
    rank = np.empty(n, np.int64)
    k2, r2, w2 = np.empty_like(keys), np.empty_like(rows), np.empty_like(where)
    g2 = np.empty_like(given) if with_given else given
    for c in prange(n_blocks):      # (a thread writes its blocks' stretch of each range)
        for i in range(c * step, min((c + 1) * step, n)):
            t = place[c, ids[i]]
            rank[i] = t
            k2[t], r2[t], w2[t] = keys[i], rows[i], where[i]
            if with_given:
                g2[t] = given[i]
            place[c, ids[i]] = t + 1
    return starts, rank, k2, g2, r2, w2


@inner
def shifted_range(mask, keys, rows, where, i, n_ranges):
    """Position ``i``'s range of round two (the ranges shifted by half a range): g in
    ``[1, n_ranges)`` for the slots ``[(g - 1/2) * span, (g + 1/2) * span)`` (present
    keys by their slot, absent ones by their home slot), else ``n_ranges`` (the
    wrapping half ranges at the index's ends: the serial pass)."""
    span = (mask + 1) // n_ranges
    g = ((where[i] if rows[i] >= 0 else first_slot(keys[i], mask)) + span // 2) // span
    return g if 1 <= g < n_ranges else n_ranges


@inner
def shifted(mask, keys, rows, where, late, n_ranges, deferred):
    """Round two of :func:`jit_kernels.bounded.bounded_insert_ranges`: the deferred
    positions ``late`` (batch order) grouped by :func:`shifted_range` (group g - 1 its
    range g; the last group, n_ranges - 1, those left for the serial pass), batch order
    in a group: ``(positions, starts)``; ``deferred[i]`` = that range (the GPU groups
    them likewise, ``cuda_bounded.shifted_groups``)."""
    ids = np.empty(late.shape[0], np.int64)
    for t in range(late.shape[0]):
        g = shifted_range(mask, keys, rows, where, late[t], n_ranges)
        deferred[late[t]] = g
        ids[t] = g - 1
    order, starts = stable_groups(ids, n_ranges)
    return late[order], starts


REPORT_CHUNK = 4096     # positions a thread of report takes at a time


@njit(nogil=True, cache=True, parallel=True)
def report(at, base, ek, er, ev_keys, ev_rows):
    """``ev_keys`` / ``ev_rows`` get ``ek[at[i]]`` / ``er[at[i]]`` for the positions i
    with ``at[i] >= 0``, in position order, on all threads; ``base[c + 1]`` comes with
    the count of such positions in chunk c (``REPORT_CHUNK`` positions).  Returns how
    many."""
    n = at.shape[0]
    m = base.shape[0] - 1
    for c in range(m):
        base[c + 1] += base[c]
    for c in prange(m):
        o = base[c]
        for i in range(c * REPORT_CHUNK, min((c + 1) * REPORT_CHUNK, n)):
            if at[i] >= 0:
                ev_keys[o] = ek[at[i]]
                ev_rows[o] = er[at[i]]
                o += 1
    return base[m]
