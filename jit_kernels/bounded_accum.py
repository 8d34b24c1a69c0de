"""TFRA ``accum`` on a bounded table: the plan (the position at which each key is found
or inserted once) and the replay of each key's positions in batch order, once its row
is known (:meth:`numbaemb.bounded.BoundedShard.accum`; per-group bodies a GPU thread
runs too, :mod:`jit_kernels.cuda_bounded`).

>>> import numpy as np
>>> order, starts = np.array([0, 1]), np.array([0, 2])     # one key at positions 0 and 1
>>> touch = np.empty(1, np.int64)
>>> accum_plan(order, starts, np.array([False, False]), np.array([False, True]), touch)
>>> int(touch[0])                  # absent, not exists at 0: inserted there
0
"""
from numba import njit

from ._inner import inner
from .halfs import load, store


@njit(nogil=True, cache=True)
def accum_plan(order, starts, present, exists, touch):
    """``touch[g]``: the position of key group ``g`` (``order[starts[g]:starts[g + 1]]``,
    in batch order) at which a sequential ``accum`` first finds (present and
    ``exists``) or inserts (absent and not ``exists``) the key, else -1.  ``present``
    (n,): the key is in the table when the call starts."""
    for g in range(starts.shape[0] - 1):
        plan_group(order, starts, present, exists, touch, g)


@inner
def plan_group(order, starts, present, exists, touch, g):
    """:func:`accum_plan` for group ``g`` (the body a GPU thread runs too)."""
    touch[g] = -1
    for j in range(starts[g], starts[g + 1]):
        p = order[j]
        if exists[p] == present[p]:
            touch[g] = p
            break


@njit(nogil=True, cache=True)
def accum_apply(order, starts, touch, touch_rows, present, values, old, new, exists, rows,
                inserted):
    """Replay each key group in batch order once its row is known (``touch_rows[g]``;
    -1: the key was not admitted, so its positions do nothing): a key present at the
    start adds ``new - old`` at every ``exists`` position; an absent one is written
    ``new`` at ``touch[g]``, then adds at every later ``exists`` position.  ``rows[p]``
    gets the row touched (or -1), ``inserted[p]`` marks the inserting position.
    16-bit rows add in float32 and round once (:mod:`jit_kernels.halfs`)."""
    for g in range(starts.shape[0] - 1):
        apply_group(order, starts, touch, touch_rows, present, values, values,
                    values.shape[0], old, new, exists, rows, inserted, g)


@inner
def apply_group(order, starts, touch, touch_rows, present, values, spill, split, old, new,
                exists, rows, inserted, g):
    """:func:`accum_apply` for group ``g`` (groups touch disjoint rows: a GPU runs them
    a thread each; rows from ``split`` on are ``spill``'s, from its row 0: a GPU's
    hybrid storage, see :class:`jit_kernels.cuda_table.SplitRows`)."""
    r = touch_rows[g]
    live = present[order[starts[g]]]
    for j in range(starts[g], starts[g + 1]):
        p = order[j]
        rows[p] = -1
        inserted[p] = False
        if r < 0:
            continue
        row = values[r] if r < split else spill[r - split]
        if not live and p == touch[g]:
            for c in range(row.shape[0]):
                store(row, c, new[p, c])
            live = True
            inserted[p] = True
            rows[p] = r
        elif live and exists[p]:
            for c in range(row.shape[0]):
                store(row, c, load(row, c) + (new[p, c] - old[p, c]))
            rows[p] = r
