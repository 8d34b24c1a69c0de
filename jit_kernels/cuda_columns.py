"""CUDA drivers of :mod:`jit_kernels.columns`: the same names, arguments and results
(device arrays, or a :class:`jit_kernels.cuda_table.SplitRows` for a column), the
same per-slot bodies (``stale``, ``small``), one thread a slot; the picked keys come
out in slot order, as from the CPU's pass.  Nothing here imports ``numba.cuda``
until a driver is first called.

Example (needs a GPU or the simulator, so not a doctest)::

    n = keys_below(shard.slots, shard.columns["updated_step"].data, 7, out)   # out[:n]
"""
import numpy as np

from . import columns as kc
from . import cuda_table as ct
from .cuda_kernels import registrar

__all__ = ["set_rows", "keys_below", "keys_with_small_rows"]

cuda = None      # numba.cuda, bound by add_kernels (a global: the simulator swaps it)


def add_kernels(kernels, cuda_module, body):
    """Add the column kernels (``column_*``) to ``kernels`` (from
    :func:`jit_kernels.cuda_kernels.build`)."""
    global cuda
    cuda = cuda_module
    stale, small = body(kc.stale), body(kc.small)

    kernel = registrar(kernels, "column_")

    @kernel
    def set_rows(col, spill, split, rows, value):
        for i in range(cuda.grid(1), rows.shape[0], cuda.gridsize(1)):
            r = rows[i]
            if r >= 0:
                if r < split:
                    col[r, 0] = value
                else:
                    spill[r - split, 0] = value

    @kernel
    def pick_stale(slots, col, spill, split, threshold, sel):
        for s in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
            sel[s] = s if stale(slots, col, spill, split, threshold, s) else -1

    @kernel
    def pick_small(slots, values, spill, split, min_sq, sel):
        for s in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
            sel[s] = s if small(slots, values, spill, split, min_sq, s) else -1

    @kernel
    def keys_at(slots, at, out):
        for j in range(cuda.grid(1), at.shape[0], cuda.gridsize(1)):
            out[j] = slots[2 * at[j]]


def set_rows(col, rows, value):
    """col[rows[i], 0] = value for every valid row (-1: skipped)."""
    ct._go(ct._kernels().column_set_rows, rows.shape[0], *ct._split(col), rows,
           np.int64(value))


def _picked(kernel, slots, args, out):
    cap = slots.shape[0] // 2
    sel = ct.cuda.device_array(cap, np.int64)
    ct._go(kernel, cap, slots, *args, sel)
    at = ct.cuda.device_array(cap, np.int64)
    n = ct.compact_nonneg(sel, at)
    ct._go(ct._kernels().column_keys_at, n, slots, at[:n], out)
    return n


def keys_below(slots, col, threshold, out):
    """See :func:`jit_kernels.columns.keys_below`."""
    return _picked(ct._kernels().column_pick_stale, slots, (*ct._split(col), threshold), out)


def keys_with_small_rows(slots, values, min_sq, out):
    """See :func:`jit_kernels.columns.keys_with_small_rows`."""
    return _picked(ct._kernels().column_pick_small, slots,
                   (*ct._split(values), float(min_sq)), out)
