"""Positions of a bounded call grouped by range of the index, for the passes of
:func:`jit_kernels.bounded.bounded_insert_ranges` (counting sorts, batch order kept
in a group).

>>> import numpy as np
>>> keys = np.array([5, 6, 7]); rows = np.array([-2, -2, -2]); where = np.full(3, -1)
>>> order, starts = by_range(1023, keys, rows, where, 4)
>>> int(starts[-1]), sorted(order.tolist())
(3, [0, 1, 2])
"""
import numpy as np
from numba import njit

from .slots import first_slot


@njit(nogil=True, cache=True)
def by_range(mask, keys, rows, where, n_ranges):
    """The positions grouped by range of the index, batch order in a range (a counting
    sort; present keys by their slot, absent ones by their home slot): ``(order,
    starts)``, range g's positions ``order[starts[g]:starts[g + 1]]``."""
    n = keys.shape[0]
    span = (mask + 1) // n_ranges
    starts = np.zeros(n_ranges + 1, np.int64)
    home = np.empty(n, np.int64)
    for i in range(n):
        home[i] = (where[i] if rows[i] >= 0 else first_slot(keys[i], mask)) // span
        starts[home[i] + 1] += 1
    for g in range(n_ranges):
        starts[g + 1] += starts[g]
    order = np.empty(n, np.int64)
    fill = starts[:-1].copy()
    for i in range(n):
        order[fill[home[i]]] = i
        fill[home[i]] += 1
    return order, starts


@njit(nogil=True, cache=True)
def shifted_range(mask, keys, rows, where, i, n_ranges):
    """Position ``i``'s range of round two (the ranges shifted by half a range): g in
    ``[1, n_ranges)`` for the slots ``[(g - 1/2) * span, (g + 1/2) * span)`` (present
    keys by their slot, absent ones by their home slot), else ``n_ranges`` (the
    wrapping half ranges at the index's ends: the serial pass)."""
    span = (mask + 1) // n_ranges
    g = ((where[i] if rows[i] >= 0 else first_slot(keys[i], mask)) + span // 2) // span
    return g if 1 <= g < n_ranges else n_ranges


@njit(nogil=True, cache=True)
def shifted(mask, keys, rows, where, late, n_ranges, deferred):
    """Round two of :func:`jit_kernels.bounded.bounded_insert_ranges`: the deferred
    positions ``late`` (batch order) grouped by :func:`shifted_range` (group g - 1 its
    g), batch order in a group: ``(order, starts)`` (n_ranges - 1 groups);
    ``deferred[i]`` = that range (``n_ranges``: not grouped, the serial pass)."""
    starts = np.zeros(n_ranges, np.int64)
    for i in late:
        deferred[i] = shifted_range(mask, keys, rows, where, i, n_ranges)
        if deferred[i] < n_ranges:
            starts[deferred[i]] += 1
    for g in range(1, n_ranges):
        starts[g] += starts[g - 1]
    order = np.empty(starts[n_ranges - 1], np.int64)
    fill = starts[:-1].copy()
    for i in late:
        if deferred[i] < n_ranges:
            order[fill[deferred[i] - 1]] = i
            fill[deferred[i] - 1] += 1
    return order, starts
