"""Several tables' lookups, or optimizer steps, in one parallel kernel: one table per
thread at a time.

A model with many small tables (26 features of a CTR model, each 4,096 ids a
step) spends more time entering and leaving kernels, and in the Python around
them, than in them; and each of its kernels is too small to split across
threads.  :func:`lookup_tables` takes every table's arrays and runs
each table's whole lookup (the batch's distinct ids, then every position's row)
serially, the tables spread over the threads.  Each table's results are
exactly the single-table kernels' (:func:`jit_kernels.segment.unique_inverse`'s
serial pass, :func:`jit_kernels.cpu_table.lookup`).  :func:`apply_tables` does the
same for a training step: each table's gradient sums, inserts and optimizer update
(the bodies of :mod:`jit_kernels.optimizers`).

Each table's arrays reach the kernel as addresses: a ``(T, k)`` int64 matrix
``ptrs`` (:func:`addresses`; every array C-contiguous, kept alive by the caller
for the call) and their sizes ``sizes`` (T, m), so the kernels compile once per
value dtype (``like``, an empty array of it), whatever the number of tables.
Per-table numbers (index masks, initializers, outputs) are arrays indexed by table.

:func:`lookup_tables` columns of ``ptrs``: keys (n,) int64, index slots (s,),
values (r, d), out (n, d), exists (n,) bool, the initializer's constants (c,)
float64, uniq and inverse (n,) int64, valid (n,) bool, kept (n, d); of ``sizes``:
n, d, r, s, c.  With ``unique`` it also writes each batch's distinct ids
(:func:`jit_kernels.segment.unique_inverse`'s), ``n_uniq``, and for the ids found
absent ``valid[j]`` / ``kept[j]`` (the distinct id ``j`` is absent / its initial
row) and ``n_absent`` (absent positions).

>>> import numpy as np
>>> from jit_kernels.slots import empty_slots
>>> from jit_kernels.initializers import CONSTANT
>>> arrays = [np.array([7, 7, 8]), empty_slots(16), np.empty((0, 2), np.float32),
...           np.empty((3, 2), np.float32), np.empty(3, np.bool_), np.array([1.0, 2.0]),
...           np.empty(3, np.int64), np.empty(3, np.int64), np.empty(3, np.bool_),
...           np.empty((3, 2), np.float32)]
>>> n_uniq, n_absent = np.zeros(1, np.int64), np.zeros(1, np.int64)
>>> lookup_tables(addresses([arrays]), np.array([[3, 2, 0, 32, 2]]), np.array([15]),
...               np.array([CONSTANT]), np.zeros(1), np.zeros(1), np.zeros(1, np.int64),
...               True, n_uniq, n_absent, arrays[2], 1 << 20)
>>> arrays[3].tolist(), n_uniq.tolist(), n_absent.tolist(), arrays[7].tolist()
([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], [2], [3], [0, 0, 1])
"""
import numpy as np
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import bucket_reads as _buckets
from ._inner import inner
from ._twins import twin_of
from .cpu_table import find_or_insert_rows as _find_or_insert, lookup_rows as _lookup
from .initializers import init_row
from .optimizers import (_prefetch, adagrad_row, adam_row, ftrl_row, rmsprop_row, sgd_row,
                         start_row)
from .segment import _segment_sum_serial, _unique_serial_alloc

__all__ = ["lookup_tables", "lookup_bucket_tables", "apply_tables", "addresses", "RULES"]

_lookup_serial = _lookup.serial
_find_or_insert_serial = _find_or_insert.serial


def addresses(per_table):
    """``(T, k)`` int64: the data address of each table's arrays (``per_table``: one
    list of ``k`` C-contiguous arrays a table)."""
    out = np.empty((len(per_table), len(per_table[0]) if per_table else 0), np.int64)
    for t, arrays in enumerate(per_table):
        for j, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise ValueError(f"array {j} of table {t} must be C-contiguous")
            out[t, j] = a.__array_interface__["data"][0]    # 1.7 us; a.ctypes.data 2.6
    return out


@intrinsic
def _pointer(typingctx, address):
    """An int64 address as a ``void*`` (for ``numba.carray``)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@inner(inline="always")
def _vec(address, n, dtype):
    return carray(_pointer(address), (n,), dtype)


@inner(inline="always")
def _mat(address, n, d, dtype):
    return carray(_pointer(address), (n, d), dtype)


@njit(nogil=True, cache=True, parallel=True)
def lookup_tables(ptrs, sizes, masks, kinds, a, b, seeds, unique, n_uniq, n_absent, like,
                  stream_min):
    """Every table's lookup (and with ``unique`` its distinct ids and absent rows);
    see the module docstring (``stream_min``: :func:`jit_kernels.cpu_table.lookup_rows`')."""
    for t in prange(ptrs.shape[0]):
        n, d, r, s, c = sizes[t, 0], sizes[t, 1], sizes[t, 2], sizes[t, 3], sizes[t, 4]
        p = ptrs[t]
        keys, out, exists = _vec(p[0], n, np.int64), _mat(p[3], n, d, like.dtype), \
            _vec(p[4], n, np.bool_)
        if unique:
            inverse = _vec(p[7], n, np.int64)
            n_uniq[t] = _unique_serial_alloc(keys, _vec(p[6], n, np.int64), inverse)
        _lookup_serial(_vec(p[1], s, np.int64), masks[t], keys, _mat(p[2], r, d, like.dtype),
                       out, exists, kinds[t], a[t], b[t], seeds[t], _vec(p[5], c, np.float64),
                       np.empty(n, np.int64), stream_min)
        if unique:
            n_absent[t] = _absent_rows(exists, inverse, out, n_uniq[t],
                                       _vec(p[8], n, np.bool_), _mat(p[9], n, d, like.dtype))


@inner
def _absent_rows(exists, inverse, rows, u, valid, kept):
    """``valid[:u]`` marks the distinct ids some position found absent, ``kept[j]`` the
    row of such an id's last position; returns the number of absent positions."""
    for j in range(u):
        valid[j] = False
    n = 0
    for i in range(exists.shape[0]):
        if not exists[i]:
            j = inverse[i]
            valid[j] = True
            for c in range(rows.shape[1]):
                kept[j, c] = rows[i, c]
            n += 1
    return n


# ---- an optimizer step on several tables ------------------------------------------------------
SGD, ADAGRAD, ADAM, FTRL, RMSPROP = 0, 1, 2, 3, 4
RULES = {"sgd": SGD, "adagrad": ADAGRAD, "adam": ADAM, "ftrl": FTRL, "rmsprop": RMSPROP}


@inner(error_model="numpy")
def _update_row(rule, w, a, b, c, g, h, flag):
    """The ``{rule}_row`` body of :mod:`jit_kernels.optimizers` on one row: ``a``, ``b``,
    ``c`` its slot rows (unused ones: ``w``), ``h`` its scalars after the gradient."""
    if rule == SGD:
        sgd_row(w, a, g, h[0], h[1], flag)
    elif rule == ADAGRAD:
        adagrad_row(w, a, g, h[0], h[1])
    elif rule == ADAM:
        adam_row(w, a, b, c, g, h[0], h[1], h[2], h[3], flag)
    elif rule == FTRL:
        ftrl_row(w, a, b, g, h[0], h[1], h[2], h[3], h[4], h[5])
    else:
        rmsprop_row(w, a, b, c, g, h[0], h[1], h[2], h[3], flag)


@njit(nogil=True, cache=True, parallel=True, error_model="numpy")
def apply_tables(rule, h, flag, s0, ptrs, sizes, masks, fresh_start, alloc, has_kept, kinds,
                 ia, ib, seeds, like):
    """One optimizer step on every table ``t`` (a table per thread at a time), as
    ``numbaemb.optimizers.apply_gradients(keys, grads, inverse=inverse, initial_rows=
    (kept, valid) if has_kept[t] else None)`` does it, bit for bit: the position rows
    ``grads`` (n, d) summed per distinct key into ``sums`` (u, d) in position order;
    the keys found or inserted (``rows``, ``inserted`` (u,); new rows from the free
    list (f,) top down, then ``fresh_start[t]`` on; ``alloc[t]`` counts them: room must
    be made first); a new row starts from ``kept`` where ``valid`` else its initial
    value (``kinds``, ``ia``, ``ib``, ``seeds``, the constants; written to ``w0``) and
    slots ``s0``; then the ``rule`` body updates the values and slot columns ``a``,
    ``b``, ``c`` (see :func:`_update_row`).

    Columns of ``ptrs``: keys (u,) int64, inverse (n,) int64, grads (n, d), sums
    (u, d), index slots (s,), free rows (f,) int64, rows (u,) int64, inserted (u,)
    bool, values, a, b, c (r, d), valid (u,) bool, kept (u, d), constants (k,)
    float64, w0 (u, d); of ``sizes``: u, n, d, r, s, f, k.
    """
    for t in prange(ptrs.shape[0]):
        u, n, d, r = sizes[t, 0], sizes[t, 1], sizes[t, 2], sizes[t, 3]
        p, v = ptrs[t], like.dtype
        keys, sums = _vec(p[0], u, np.int64), _mat(p[3], u, d, v)
        rows, inserted = _vec(p[6], u, np.int64), _vec(p[7], u, np.bool_)
        _segment_sum_serial(_mat(p[2], n, d, v), _vec(p[1], n, np.int64), sums)
        f = sizes[t, 5]
        _find_or_insert_serial(_vec(p[4], sizes[t, 4], np.int64), masks[t], keys, rows,
                               inserted, alloc[t:t + 1], _vec(p[5], f, np.int64), f,
                               fresh_start[t])
        _step_rows(rule, h, flag, s0, keys, sums, rows, inserted, _mat(p[8], r, d, v),
                   _mat(p[9], r, d, v), _mat(p[10], r, d, v), _mat(p[11], r, d, v),
                   _vec(p[12], u, np.bool_), _mat(p[13], u, d, v), has_kept[t], kinds[t],
                   ia[t], ib[t], seeds[t], _vec(p[14], sizes[t, 6], np.float64),
                   _mat(p[15], u, d, v))


@inner(error_model="numpy")
def _step_rows(rule, h, flag, s0, keys, sums, rows, inserted, values, a, b, c, valid, kept,
               has_kept, kind, ia, ib, seed, const, w0):
    n = rows.shape[0]
    for i in range(n):                   # the new rows' starting weights
        if inserted[i]:
            if has_kept and valid[i]:
                for j in range(w0.shape[1]):
                    w0[i, j] = kept[i, j]
            else:
                init_row(w0[i], keys[i], kind, ia, ib, seed, const)
    for i in range(n):
        _prefetch(rows, i, values, a, b, c)
        r = rows[i]
        if inserted[i]:
            start_row(values[r], w0[i], a[r], b[r], c[r], s0)
        _update_row(rule, values[r], a[r], b[r], c[r], sums[i], h, flag)


# the same kernel over tables with a bucketed index (jit_kernels.buckets): their lookup's
# twin in place of the linear index's, compiled apart (on first use only; made last: a twin
# takes a copy of this module's names)
lookup_bucket_tables = twin_of(lookup_tables, "__buckets",
                               {"_lookup_serial": _buckets.lookup_rows.serial})
