"""Several tables' lookups, or optimizer steps, in one parallel kernel: one table per
thread at a time.

A model with many small tables (26 features of a CTR model, each 4,096 ids a
step) spends more time entering and leaving kernels, and in the Python around
them, than in them; and each of its kernels is too small to split across
threads.  :func:`lookup_tables` takes every table's arrays as tuples and runs
each table's whole lookup (the batch's distinct ids, then every position's row)
serially, the tables spread over the threads.  Each table's results are
exactly the single-table kernels' (:func:`jit_kernels.segment.unique_inverse`'s
serial pass, :func:`jit_kernels.cpu_table.lookup`).  :func:`apply_tables` does the
same for a training step: each table's gradient sums, inserts and optimizer update
(the bodies of :mod:`jit_kernels.optimizers`).

Arguments are tuples with one entry per table (arrays of one dtype each, so
Numba sees a homogeneous tuple; it compiles once per number of tables) and
arrays indexed by table:

* ``keys`` (n_t,) int64; ``slots``, ``masks`` (T,), ``values`` (rows, dim_t): each
  table's index and rows; ``kinds``, ``a``, ``b``, ``seeds`` (T,), ``consts``: its
  initializer (see :mod:`jit_kernels.initializers`);
* outputs ``out`` (n_t, dim_t), ``exists`` (n_t,) bool;
* with ``unique``: ``uniq``, ``inverse`` (n_t,) int64 (:func:`unique_inverse`'s),
  ``n_uniq`` (T,), and for the ids found absent ``valid`` (n_t,) bool and ``kept``
  (n_t, dim_t): ``valid[j]`` marks the distinct id ``j`` that is absent and
  ``kept[j]`` its initial row (copied from one of its positions), ``n_absent`` (T,)
  the number of absent positions.

>>> import numpy as np
>>> from jit_kernels.slots import empty_slots
>>> from jit_kernels.initializers import CONSTANT
>>> keys = (np.array([7, 7, 8]), np.array([1]))
>>> out = (np.empty((3, 2), np.float32), np.empty((1, 2), np.float32))
>>> ex = (np.empty(3, np.bool_), np.empty(1, np.bool_))
>>> two = lambda: (np.empty(3, np.int64), np.empty(1, np.int64))
>>> uniq, inv, valid = two(), two(), (np.empty(3, np.bool_), np.empty(1, np.bool_))
>>> kept, n_uniq, n_absent = out, np.empty(2, np.int64), np.empty(2, np.int64)
>>> lookup_tables(keys, (empty_slots(16), empty_slots(16)), np.array([15, 15]),
...               (np.empty((0, 2), np.float32), np.empty((0, 2), np.float32)), out, ex,
...               np.array([CONSTANT, CONSTANT]), np.zeros(2), np.zeros(2),
...               np.zeros(2, np.int64), (np.array([1.0, 2.0]), np.array([3.0, 4.0])),
...               True, uniq, inv, n_uniq, valid, kept, n_absent)
>>> out[0].tolist(), n_uniq.tolist(), n_absent.tolist(), inv[0].tolist()
([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], [2, 1], [3, 1], [0, 0, 1])
"""
from numba import njit, prange

from .cpu_table import find_or_insert_rows as _find_or_insert, lookup as _lookup
from .initializers import init_row
from .optimizers import (_prefetch, adagrad_row, adam_row, ftrl_row, rmsprop_row, sgd_row,
                         start_row)
from .segment import _segment_sum_serial, _unique_serial

__all__ = ["lookup_tables", "apply_tables", "RULES"]

_lookup_serial = _lookup.serial
_find_or_insert_serial = _find_or_insert.serial


@njit(nogil=True, cache=True, parallel=True)
def lookup_tables(keys, slots, masks, values, out, exists, kinds, a, b, seeds, consts,
                  unique, uniq, inverse, n_uniq, valid, kept, n_absent):
    """Every table's lookup (and with ``unique`` its distinct ids and absent rows);
    see the module docstring."""
    for t in prange(len(keys)):
        if unique:
            n_uniq[t] = _unique_serial(keys[t], uniq[t], inverse[t])
        _lookup_serial(slots[t], masks[t], keys[t], values[t], out[t], exists[t], kinds[t],
                       a[t], b[t], seeds[t], consts[t])
        if unique:
            n_absent[t] = _absent_rows(exists[t], inverse[t], out[t], n_uniq[t], valid[t],
                                       kept[t])


@njit(nogil=True, cache=True)
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


@njit(nogil=True, cache=True, error_model="numpy")
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
def apply_tables(rule, h, flag, s0, keys, inverse, grads, sums, slots, masks, free_rows,
                 n_free, fresh_start, alloc, rows, inserted, values, a, b, c, valid, kept,
                 has_kept, kinds, ia, ib, seeds, consts, w0):
    """One optimizer step on every table ``t`` (a table per thread at a time), as
    ``numbaemb.optimizers.apply_gradients(keys[t], grads[t], inverse=inverse[t],
    initial_rows=(kept[t], valid[t]) if has_kept[t] else None)`` does it, bit for bit:
    the position rows ``grads[t]`` (n_t, d) summed per distinct key into ``sums[t]``
    (u_t, d) in position order; the keys found or inserted (``rows``, ``inserted``
    (u_t,); the table's index ``slots``/``masks``, new rows from ``free_rows[t][:n_free]``
    top down then ``fresh_start[t]`` on, ``alloc[t]`` counts them: room must be made
    first); a new row starts from ``kept`` where ``valid`` else its initial value (the
    initializer ``kinds``, ``ia``, ``ib``, ``seeds``, ``consts``; written to ``w0``) and
    slots ``s0``; then the ``rule`` body updates ``values`` and slots ``a``, ``b``, ``c``
    (see :func:`_update_row`)."""
    for t in prange(len(keys)):
        _segment_sum_serial(grads[t], inverse[t], sums[t])
        _find_or_insert_serial(slots[t], masks[t], keys[t], rows[t], inserted[t],
                               alloc[t:t + 1], free_rows[t], n_free[t], fresh_start[t])
        _step_rows(rule, h, flag, s0, keys[t], sums[t], rows[t], inserted[t], values[t], a[t],
                   b[t], c[t], valid[t], kept[t], has_kept[t], kinds[t], ia[t], ib[t], seeds[t],
                   consts[t], w0[t])


@njit(nogil=True, cache=True, error_model="numpy")
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
