"""Sparse optimizer row updates: pure per-row bodies plus CPU drivers.

Each ``*_row`` body updates ONE row in place: the weight row ``w`` (d,), its
slot rows (d,) and the row's summed gradient ``g`` (d,), given scalar
hyper-parameters.  Bodies allocate nothing and loop over the row, so a CUDA
kernel can call them too (they are inlined into their callers, which lets the
row loops vectorise).  They follow Keras 3's ``update_step`` formulas
(``keras/src/optimizers/*.py``) op for op and, like Keras, compute in the
dtype of the weight row: scalars are cast to it once per row (``g`` must
have that dtype).  16-bit float weight rows (:mod:`jit_kernels.halfs`) are
computed in float32 (``g`` and the slots float32) and rounded once on store.  A slot an option does not use (SGD momentum at momentum 0,
Adam ``vhat`` without amsgrad, RMSprop momentum / average gradient) is never
read or written: pass any row of the right type, e.g. ``w``.  Options branch
outside the column loops, never inside one: on an H200 (numba-cuda 0.30.4) the
bodies with a branch inside their loop (then sgd, adam, rmsprop) ran only the
loop's first iteration in the CUDA update kernel, while adagrad and ftrl were
right (a minimal kernel with a branch in an inlined loop ran correctly, so
the cause was not isolated).

Each ``*_rows`` driver applies its body to ``values[rows[i]]`` with gradient
``grads[i]`` for every i; ``rows`` must be distinct (one update per unique
id).  Shapes: ``values`` and slots (row_capacity, d); ``rows`` (n,) int64;
``grads`` (n, d).  A driver runs in parallel (``prange``) from
``PARALLEL_MIN / ROW_COST`` rows of 64 values on (1,024 by default; narrower rows
later, wider ones sooner), below that its serial
twin (the same Python function compiled with ``parallel=False``; see
:mod:`jit_kernels.segment` for why).  Drivers request the rows a few positions
ahead (weight and slot rows) before updating the current one, so that cache
misses overlap, as the table drivers of :mod:`jit_kernels.cpu_table` do.

>>> import numpy as np
>>> w, acc = np.ones(2), np.full(2, 0.1)
>>> adagrad_row(w, acc, np.array([1.0, 0.0]), 0.5, 0.0)
>>> w.round(4).tolist(), acc.round(4).tolist()
([0.5233, 1.0], [1.1, 0.1])
"""
import math

import numpy as np
from numba import njit, prange

from ._inner import inner
from .cpu_table import prefetch_row
from .halfs import compute_cast, load, store
from .segment import ROW_COST, serial_twin, threads_for

_row = dict(nogil=True, cache=True, inline="always", error_model="numpy")
ROWS_AHEAD = 8      # rows requested ahead of their update (see ``_prefetch``)
_drv = dict(parallel=True, nogil=True, cache=True, error_model="numpy")


@inner(**_row)
def sgd_row(w, m, g, lr, momentum, nesterov):
    """Plain: ``w -= lr g``.  With momentum: ``m = momentum m - lr g``, then
    ``w += m`` or, Nesterov, ``w += momentum m - lr g``."""
    lr_t, mu = compute_cast(w, lr), compute_cast(w, momentum)
    # options branch outside the column loops (see the module docstring)
    if momentum == 0.0:
        for c in range(w.shape[0]):
            store(w, c, load(w, c) - g[c] * lr_t)
    elif nesterov:
        for c in range(w.shape[0]):
            m[c] = m[c] * mu - g[c] * lr_t
            store(w, c, load(w, c) + (m[c] * mu - g[c] * lr_t))
    else:
        for c in range(w.shape[0]):
            m[c] = m[c] * mu - g[c] * lr_t
            store(w, c, load(w, c) + m[c])


@inner(**_row)
def adagrad_row(w, acc, g, lr, epsilon):
    """``acc += g^2;  w -= lr g / sqrt(acc + epsilon)``."""
    lr_t, eps = compute_cast(w, lr), compute_cast(w, epsilon)
    for c in range(w.shape[0]):
        acc[c] += g[c] * g[c]
        store(w, c, load(w, c) - lr_t * g[c] / math.sqrt(acc[c] + eps))


@inner(**_row)
def adam_row(w, m, v, vhat, g, alpha, beta_1, beta_2, epsilon, amsgrad):
    """``m += (1 - beta_1)(g - m);  v += (1 - beta_2)(g^2 - v)``;
    amsgrad: ``vhat = max(vhat, v)`` and use ``vhat`` for ``v``;
    ``w -= alpha m / (sqrt(v) + epsilon)``, where the caller computes the step size
    ``alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)`` once per 1-based step t."""
    alpha_t, c1 = compute_cast(w, alpha), compute_cast(w, 1.0 - beta_1)
    c2, eps = compute_cast(w, 1.0 - beta_2), compute_cast(w, epsilon)
    if amsgrad:
        for c in range(w.shape[0]):
            m[c] += (g[c] - m[c]) * c1
            v[c] += (g[c] * g[c] - v[c]) * c2
            vhat[c] = max(vhat[c], v[c])
            store(w, c, load(w, c) - m[c] * alpha_t / (math.sqrt(vhat[c]) + eps))
    else:
        for c in range(w.shape[0]):
            m[c] += (g[c] - m[c]) * c1
            v[c] += (g[c] * g[c] - v[c]) * c2
            store(w, c, load(w, c) - m[c] * alpha_t / (math.sqrt(v[c]) + eps))


@inner(**_row)
def ftrl_row(w, acc, linear, g, lr, lr_power, l1, l2, l2_shrinkage, beta):
    """With ``p = -lr_power``, ``n' = acc + g^2``:
    ``linear += g + 2 l2_shrinkage w - (n'^p - acc^p) / lr * w``;
    ``w = (clip(linear, -l1, l1) - linear) / (n'^p / lr + 2 (l2 + beta / (2 lr)))``;
    ``acc = n'``."""
    lr_t, p = compute_cast(w, lr), compute_cast(w, -lr_power)
    hi, lo = compute_cast(w, l1), compute_cast(w, -l1)
    shrink = compute_cast(w, 2.0 * l2_shrinkage)
    two_l2 = compute_cast(w, 2.0 * (l2 + beta / (2.0 * lr)))
    for c in range(w.shape[0]):
        new_acc = acc[c] + g[c] * g[c]
        new_acc_p = new_acc ** p
        wc = load(w, c)
        linear[c] += g[c] + shrink * wc - (new_acc_p - acc[c] ** p) / lr_t * wc
        clipped = min(max(linear[c], lo), hi)
        store(w, c, (clipped - linear[c]) / (new_acc_p / lr_t + two_l2))
        acc[c] = new_acc


@inner(**_row)
def rmsprop_row(w, vel, mom, avg, g, lr, rho, momentum, epsilon, centered):
    """``vel = rho vel + (1 - rho) g^2``; centered: ``avg = rho avg + (1 - rho) g``
    and ``den = vel - avg^2 + epsilon``, else ``den = vel + epsilon``;
    ``inc = lr g / sqrt(den)``; momentum > 0: ``mom = momentum mom + inc;
    w -= mom``, else ``w -= inc``."""
    lr_t, r, r1 = compute_cast(w, lr), compute_cast(w, rho), compute_cast(w, 1.0 - rho)
    mu, eps = compute_cast(w, momentum), compute_cast(w, epsilon)
    if centered and momentum > 0.0:
        for c in range(w.shape[0]):
            vel[c] = r * vel[c] + r1 * (g[c] * g[c])
            avg[c] = r * avg[c] + r1 * g[c]
            mom[c] = mu * mom[c] + lr_t * g[c] / math.sqrt(vel[c] - avg[c] * avg[c] + eps)
            store(w, c, load(w, c) - mom[c])
    elif centered:
        for c in range(w.shape[0]):
            vel[c] = r * vel[c] + r1 * (g[c] * g[c])
            avg[c] = r * avg[c] + r1 * g[c]
            store(w, c, load(w, c) - lr_t * g[c] / math.sqrt(vel[c] - avg[c] * avg[c] + eps))
    elif momentum > 0.0:
        for c in range(w.shape[0]):
            vel[c] = r * vel[c] + r1 * (g[c] * g[c])
            mom[c] = mu * mom[c] + lr_t * g[c] / math.sqrt(vel[c] + eps)
            store(w, c, load(w, c) - mom[c])
    else:
        for c in range(w.shape[0]):
            vel[c] = r * vel[c] + r1 * (g[c] * g[c])
            store(w, c, load(w, c) - lr_t * g[c] / math.sqrt(vel[c] + eps))


@inner(inline="always")
def _prefetch(rows, i, a, b, c, d):
    """Request the rows ``ROWS_AHEAD`` positions on in the (up to four) arrays updated
    in place; a table is far larger than the caches, so each row is a cache miss."""
    j = i + ROWS_AHEAD
    if j < rows.shape[0]:
        r = rows[j]
        prefetch_row(a, r, True)
        prefetch_row(b, r, True)
        prefetch_row(c, r, True)
        prefetch_row(d, r, True)


@inner(error_model="numpy")
def start_row(w, w0, a, b, c, s0):
    """A new row's starting values, written just before its first update: slots ``a``,
    ``b``, ``c`` get the constants ``s0[0..2]``, then ``w = w0``.  An optimizer's
    missing slots are passed as ``w`` (see the module docstring): they are written
    first, so the weights written last win.  Not inlined: inlined into a driver it
    cost the update loop its vectorisation (Adam on 13,500 rows: 3.9 vs 2.1 ms)."""
    for j in range(w.shape[0]):        # (a slot passed as w gets w's dtype: w0 overwrites it)
        a[j] = a.dtype.type(s0[0])
        b[j] = b.dtype.type(s0[1])
        c[j] = c.dtype.type(s0[2])
    for j in range(w.shape[0]):
        w[j] = w0[j]


@njit(**_drv)
def _sgd_rows(values, m, rows, grads, lr, momentum, nesterov, fresh, w0, s0):
    for i in prange(rows.shape[0]):
        _prefetch(rows, i, values, m, values, values)
        r = rows[i]
        if fresh[i]:
            start_row(values[r], w0[i], m[r], values[r], values[r], s0)
        sgd_row(values[r], m[r], grads[i], lr, momentum, nesterov)


@njit(**_drv)
def _adagrad_rows(values, acc, rows, grads, lr, epsilon, fresh, w0, s0):
    for i in prange(rows.shape[0]):
        _prefetch(rows, i, values, acc, values, values)
        r = rows[i]
        if fresh[i]:
            start_row(values[r], w0[i], acc[r], values[r], values[r], s0)
        adagrad_row(values[r], acc[r], grads[i], lr, epsilon)


@njit(**_drv)
def _adam_rows(values, m, v, vhat, rows, grads, alpha, beta_1, beta_2, epsilon, amsgrad,
               fresh, w0, s0):
    for i in prange(rows.shape[0]):
        _prefetch(rows, i, values, m, v, vhat)
        r = rows[i]
        if fresh[i]:
            start_row(values[r], w0[i], m[r], v[r], vhat[r], s0)
        adam_row(values[r], m[r], v[r], vhat[r], grads[i], alpha, beta_1, beta_2, epsilon, amsgrad)


@njit(**_drv)
def _ftrl_rows(values, acc, linear, rows, grads, lr, lr_power, l1, l2, l2_shrinkage, beta,
               fresh, w0, s0):
    for i in prange(rows.shape[0]):
        _prefetch(rows, i, values, acc, linear, values)
        r = rows[i]
        if fresh[i]:
            start_row(values[r], w0[i], acc[r], linear[r], values[r], s0)
        ftrl_row(values[r], acc[r], linear[r], grads[i], lr, lr_power, l1, l2, l2_shrinkage, beta)


@njit(**_drv)
def _rmsprop_rows(values, vel, mom, avg, rows, grads, lr, rho, momentum, epsilon, centered,
                  fresh, w0, s0):
    for i in prange(rows.shape[0]):
        _prefetch(rows, i, values, vel, mom, avg)
        r = rows[i]
        if fresh[i]:
            start_row(values[r], w0[i], vel[r], mom[r], avg[r], s0)
        rmsprop_row(values[r], vel[r], mom[r], avg[r], grads[i], lr, rho, momentum, epsilon,
                    centered)


def _driver(parallel, rows_arg):
    """``parallel``'s Python-level entry point: its serial twin below PARALLEL_MIN rows.

    ``fresh`` (n,) bool, ``w0`` (n, d) and ``s0`` (up to three slot constants, in
    the driver's slot order) start new rows in the same pass (:func:`start_row`):
    row ``rows[i]`` with ``fresh[i]`` gets weights ``w0[i]`` and slots ``s0`` just
    before its update, so a new row is written once, not once per column and
    again by the update.  Without ``fresh`` every row is updated as it is.
    """
    serial = serial_twin(parallel)
    name = parallel.py_func.__name__[1:]

    def run(*args, fresh=None, w0=None, s0=()):
        n = args[rows_arg].shape[0]
        if fresh is None:
            fresh, w0 = np.zeros(n, np.bool_), args[rows_arg + 1]
        s0 = tuple(float(x) for x in s0) + (0.0,) * (3 - len(s0))
        cost = max(1, ROW_COST * args[rows_arg + 1].shape[1] // 64)   # ROW_COST: 64 wide
        (serial if threads_for(n, cost) == 1 else parallel)(*args, fresh, w0, s0)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = (f"``{name[:-5]}_row`` on every row of ``rows`` (see the module docstring); "
                   f"``fresh``, ``w0``, ``s0`` start new rows (see ``_driver``).")
    run.parallel, run.serial = parallel, serial
    return run


sgd_rows = _driver(_sgd_rows, 2)
adagrad_rows = _driver(_adagrad_rows, 2)
adam_rows = _driver(_adam_rows, 4)
ftrl_rows = _driver(_ftrl_rows, 3)
rmsprop_rows = _driver(_rmsprop_rows, 4)
