"""Sparse optimizers for :class:`numbaemb.Variable`, framework-free.

An optimizer is a frozen dataclass of hyper-parameters that declares its slot
columns; :func:`apply_gradients` does one training step: unique ids, per-id
gradient sums, then one row update per unique id over the weight row and its
slot rows (all row-aligned columns of the id's shard, found by one probe).
The math is Keras 3's (``keras.optimizers.SGD`` etc.), applied only to the
rows a batch touches, as TFRA does.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=2, value_dtype=np.float64)
>>> opt = ne.optimizers.Adagrad(learning_rate=0.5)
>>> ids = np.array([[3, 3], [4, 3]])
>>> ne.optimizers.apply_gradients(v, opt, ids, np.ones((2, 2, 2)), step=1)
>>> v.lookup(np.array([3, 4])).round(3).tolist()
[[-0.497, -0.497], [-0.477, -0.477]]
>>> ne.optimizers.slot_values(v, opt, "accumulator", np.array([3])).round(3).tolist()
[[9.1, 9.1]]
"""
import functools
from dataclasses import dataclass, fields

import numba
import numpy as np

from jit_kernels import optimizers as _k
from jit_kernels.segment import segment_sum, unique_inverse

from . import _ahead, _checks
from .admission import admitted
from .expiry import mark_updated
from .initializers import Constant, Zeros
from .variable import Variable

__all__ = ["Optimizer", "SGD", "Adagrad", "Adam", "Ftrl", "RMSprop",
           "apply_gradients", "slot_values"]


def _real(value, name, lo=-np.inf, hi=np.inf, open_lo=False, open_hi=False):
    """``value`` as a float, checked to be finite and in the interval lo..hi."""
    arr = None if isinstance(value, (bool, np.bool_)) else np.asarray(value)
    if arr is None or arr.ndim != 0 or arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    x = float(arr)
    inside = (lo < x if open_lo else lo <= x) and (x < hi if open_hi else x <= hi)
    if not (np.isfinite(x) and inside):
        span = f"{'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"
        raise ValueError(f"{name} must be a finite number in {span}, got {x}")
    return x


class Optimizer:
    """Base class: subclasses are frozen dataclasses that declare ``_ranges`` and
    implement ``slots`` and ``_update``."""

    _ranges = {}    # real field -> _real's (lo, hi, open_lo, open_hi); other fields are bool

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self._ranges:
                value = _real(value, f.name, *self._ranges[f.name])
            elif not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{f.name} must be a bool, got {type(value).__name__}")
            object.__setattr__(self, f.name, type(f.default)(value))
        _ahead.note_optimizer(self)         # what a cold start's helper compiles for

    def slots(self):
        """Slot columns this configuration uses: a tuple of ``(name, initial value)``."""
        raise NotImplementedError

    def column(self, slot):
        """Name of the shard column holding ``slot``, e.g. ``"Adam/m"``."""
        return f"{type(self).__name__}/{slot}"

    def _rule(self, lr, step, dtype):
        """``(body, [slot a, b, c], hyper-parameters, flag)`` of the per-row body
        ``jit_kernels.optimizers.{body}_row`` for a GPU step: the slot names it takes
        (None: a slot this configuration does not use), its scalars after the gradient
        and its bool option, at learning rate ``lr`` and 1-based ``step``."""
        raise NotImplementedError

    def _update(self, values, cols, rows, grads, lr, step, fresh=None, w0=None):
        """Update ``values[rows[i]]`` and its slot rows by ``grads[i]``; rows with
        ``fresh[i]`` start from weights ``w0[i]`` and initial slots in the same pass."""
        raise NotImplementedError


_NONNEG = (0.0,)
_UNIT = (0.0, 1.0)
_BETA = (0.0, 1.0, False, True)


@dataclass(frozen=True)
class SGD(Optimizer):
    """``w -= lr g``; with momentum ``m = momentum m - lr g; w += m`` (Nesterov:
    ``w += momentum m - lr g``).  Slot ``momentum`` only when momentum != 0."""

    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    _ranges = {"learning_rate": _NONNEG, "momentum": _UNIT}

    def slots(self):
        return (("momentum", 0.0),) if self.momentum != 0 else ()

    def _rule(self, lr, step, dtype):
        return ("sgd", ["momentum" if self.momentum != 0 else None, None, None],
                (lr, self.momentum), self.nesterov)

    def _update(self, values, cols, rows, grads, lr, step, fresh=None, w0=None):
        _k.sgd_rows(values, cols.get("momentum", values), rows, grads, lr, self.momentum,
                    self.nesterov, fresh=fresh, w0=w0)


@dataclass(frozen=True)
class Adagrad(Optimizer):
    """``acc += g^2; w -= lr g / sqrt(acc + epsilon)``.  Slot ``accumulator``."""

    learning_rate: float = 0.001
    initial_accumulator_value: float = 0.1
    epsilon: float = 1e-7
    _ranges = {"learning_rate": _NONNEG, "initial_accumulator_value": _NONNEG, "epsilon": _NONNEG}

    def slots(self):
        return (("accumulator", self.initial_accumulator_value),)

    def _rule(self, lr, step, dtype):
        return "adagrad", ["accumulator", None, None], (lr, self.epsilon), False

    def _update(self, values, cols, rows, grads, lr, step, fresh=None, w0=None):
        _k.adagrad_rows(values, cols["accumulator"], rows, grads, lr, self.epsilon,
                        fresh=fresh, w0=w0, s0=(self.initial_accumulator_value,))


@dataclass(frozen=True)
class Adam(Optimizer):
    """Keras Adam (epsilon outside the sqrt, bias correction folded into the
    step size with the 1-based ``step``).  Slots ``m``, ``v`` (+ ``vhat`` with amsgrad)."""

    learning_rate: float = 0.001
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    amsgrad: bool = False
    _ranges = {"learning_rate": _NONNEG, "beta_1": _BETA, "beta_2": _BETA, "epsilon": _NONNEG}

    def slots(self):
        return (("m", 0.0), ("v", 0.0)) + ((("vhat", 0.0),) if self.amsgrad else ())

    def step_size(self, lr, step, dtype=np.float32):
        """``alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)`` for the 1-based step t,
        computed in ``dtype`` as Keras does for a variable of that dtype."""
        t = np.dtype(dtype).type
        return float(t(lr) * np.sqrt(t(1) - t(self.beta_2) ** t(step))
                     / (t(1) - t(self.beta_1) ** t(step)))

    def _rule(self, lr, step, dtype):
        return ("adam", ["m", "v", "vhat" if self.amsgrad else None],
                (self.step_size(lr, step, dtype), self.beta_1, self.beta_2, self.epsilon),
                self.amsgrad)

    def _update(self, values, cols, rows, grads, lr, step, fresh=None, w0=None):
        alpha = self.step_size(lr, step, _checks.storage_compute_dtype(values.dtype))
        _k.adam_rows(values, cols["m"], cols["v"], cols.get("vhat", values), rows, grads, alpha,
                     self.beta_1, self.beta_2, self.epsilon, self.amsgrad, fresh=fresh, w0=w0)


@dataclass(frozen=True)
class Ftrl(Optimizer):
    """Keras FTRL-proximal (``accumulator`` n, ``linear`` z; ``beta`` adds
    ``beta / (2 lr)`` to the L2 strength).  Slots ``accumulator``, ``linear``."""

    learning_rate: float = 0.001
    learning_rate_power: float = -0.5
    initial_accumulator_value: float = 0.1
    l1_regularization_strength: float = 0.0
    l2_regularization_strength: float = 0.0
    l2_shrinkage_regularization_strength: float = 0.0
    beta: float = 0.0
    _ranges = {"learning_rate": (0.0, np.inf, True), "learning_rate_power": (-np.inf, 0.0),
               "initial_accumulator_value": _NONNEG, "l1_regularization_strength": _NONNEG,
               "l2_regularization_strength": _NONNEG,
               "l2_shrinkage_regularization_strength": _NONNEG, "beta": _NONNEG}

    def slots(self):
        return (("accumulator", self.initial_accumulator_value), ("linear", 0.0))

    def _rule(self, lr, step, dtype):
        return ("ftrl", ["accumulator", "linear", None],
                (lr, self.learning_rate_power, self.l1_regularization_strength,
                 self.l2_regularization_strength, self.l2_shrinkage_regularization_strength,
                 self.beta), False)

    def _update(self, values, cols, rows, grads, lr, step, fresh=None, w0=None):
        _k.ftrl_rows(values, cols["accumulator"], cols["linear"], rows, grads, lr,
                     self.learning_rate_power, self.l1_regularization_strength,
                     self.l2_regularization_strength,
                     self.l2_shrinkage_regularization_strength, self.beta,
                     fresh=fresh, w0=w0, s0=(self.initial_accumulator_value, 0.0))


@dataclass(frozen=True)
class RMSprop(Optimizer):
    """Keras RMSprop (epsilon inside the sqrt).  Slots ``velocity`` (+ ``momentum``
    when momentum > 0, + ``average_gradient`` when centered)."""

    learning_rate: float = 0.001
    rho: float = 0.9
    momentum: float = 0.0
    epsilon: float = 1e-7
    centered: bool = False
    _ranges = {"learning_rate": _NONNEG, "rho": _UNIT, "momentum": _NONNEG, "epsilon": _NONNEG}

    def slots(self):
        return ((("velocity", 0.0),) + ((("momentum", 0.0),) if self.momentum > 0 else ())
                + ((("average_gradient", 0.0),) if self.centered else ()))

    def _rule(self, lr, step, dtype):
        return ("rmsprop", ["velocity", "momentum" if self.momentum > 0 else None,
                            "average_gradient" if self.centered else None],
                (lr, self.rho, self.momentum, self.epsilon), self.centered)

    def _update(self, values, cols, rows, grads, lr, step, fresh=None, w0=None):
        _k.rmsprop_rows(values, cols["velocity"], cols.get("momentum", values),
                        cols.get("average_gradient", values), rows, grads, lr, self.rho,
                        self.momentum, self.epsilon, self.centered, fresh=fresh, w0=w0)


def _check(variable, optimizer):
    if not isinstance(variable, Variable):
        raise TypeError(f"variable must be a numbaemb.Variable, got {type(variable).__name__}")
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a numbaemb.optimizers.Optimizer, "
                        f"got {type(optimizer).__name__}")
    if variable.value_dtype not in _checks.FLOAT_DTYPES:
        raise _checks.DtypeError(f"table {variable.name!r} holds {variable.value_dtype} values: "
                                 "integer tables are not trainable (float16, bfloat16, float32 "
                                 "and float64 are)")


def _check_slot(variable, optimizer, slot_name):
    _check(variable, optimizer)
    names = [name for name, _ in optimizer.slots()]
    if slot_name not in names:
        raise ValueError(f"slot_name must be one of {sorted(names)} for {optimizer!r}, "
                         f"got {slot_name!r}")


def _step_and_rate(optimizer, step, learning_rate):
    step = _checks.positive_int(step, "step")
    lr = (optimizer.learning_rate if learning_rate is None
          else _real(learning_rate, "learning_rate", *_NONNEG))
    if isinstance(optimizer, Ftrl) and lr <= 0:
        raise ValueError(f"learning_rate must be > 0 for Ftrl, got {lr}")
    return step, lr


def _slot_init(value, dim):
    return (Zeros() if value == 0 else Constant(value)).params(dim, 0)


def _then_sweep_names(apply):
    """``apply``, then a string table's sweep of the names left without a row (its
    evicted or held-back ids: :meth:`numbaemb.string_keys.StringVariable._sweep_names`)."""
    @functools.wraps(apply)
    def run(variable, *args, **kwargs):
        apply(variable, *args, **kwargs)
        sweep = getattr(variable, "_sweep_names", None)
        if sweep is not None:
            sweep()
    return run


@_then_sweep_names
def apply_gradients(variable, optimizer, ids, grads, *, step, learning_rate=None,
                    assume_unique=False, delta=False, initial_rows=None, inverse=None):
    """One sparse training step on ``variable``.

    Gradients of repeated ids are summed (in batch order); absent ids are
    inserted with their initial values (weights and slots) and then updated, so
    after the step every id of the batch is in the table; ids not in the batch
    are untouched.  Slot columns are created on first use.

    Args:
      variable: a :class:`numbaemb.Variable`.
      optimizer: ``SGD`` / ``Adagrad`` / ``Adam`` / ``Ftrl`` / ``RMSprop``.
      ids: integer array of any shape (B, ...).
      grads: real array of shape ``ids.shape + (dim,)``.
      step: 1-based iteration count (Adam's bias correction), an int >= 1.
      learning_rate: overrides ``optimizer.learning_rate`` (e.g. a schedule's value).
      assume_unique: the caller guarantees that ``ids`` holds no id twice (e.g. the
        keys of a gradient already summed per id): the unique / segment-sum pass is
        skipped and ``grads`` is used as it is, without a copy.  Repeated ids then
        give an unspecified result (each of their rows is updated once per copy).
      delta: TFRA's ``bp_v2``: the new weights are computed into a scratch copy from
        the rows as they are when the step starts and their change ``new - old`` is
        added through ``variable.accum`` (absent ids are inserted with ``new``), so
        weight changes that other writers make meanwhile are kept, not overwritten.
        The slots (row-aligned columns of the same table, like the in-place path)
        are set, for every id present after the step.
      initial_rows: optional ``(rows, valid)``, ``rows`` of shape ``ids.shape + (dim,)``
        and ``valid`` bool of ``ids.shape``: an absent id ``i`` with ``valid[i]`` is
        inserted with ``rows[i]`` as its weights instead of its initializer's values
        (pass the initial values that a lookup already computed for it: they are the
        same, and computing them again can cost as much as the rest of the step);
        its slots start from their initial values as usual.  Used only with
        ``assume_unique`` and without ``delta``.  Ignored by a distributed variable,
        whose owners draw the initial values (the same ones) themselves.
      inverse: optional (n,) int array: ``ids`` (u,) are distinct and ``grads`` is
        (n, dim), one row per position of a batch whose position ``i`` looked up
        ``ids[inverse[i]]`` (a backward pass's output gradient, with the forward's
        ``unique_inverse``).  The rows are summed per id in position order inside this
        call: ``apply_gradients(ids, segment_sum(grads, inverse, u), assume_unique=True)``,
        bit for bit (rows are cast to the table's compute dtype first, as ``grads``
        always are), with no separate op and hand-off in a TF step (a CUDA table sums
        them in its update kernel).  An id without a position gets a zero gradient.
    Raises:
      TypeError / ValueError naming the bad argument; nothing is applied then.
    """
    if isinstance(variable, Variable) and variable.comm is not None:
        # collective: every check runs inside the exchange, so bad input on one rank
        # raises on every rank instead of leaving the others waiting
        variable._apply_gradients(optimizer, ids, grads, step, learning_rate, assume_unique,
                                  delta)
        return
    _check(variable, optimizer)
    step, lr = _step_and_rate(optimizer, step, learning_rate)
    if getattr(variable, "device", "cpu") != "cpu":
        from ._device_step import apply_on_device
        apply_on_device(variable, optimizer, ids, grads, step, lr, assume_unique, delta,
                        inverse)
        return
    keys = variable._host_keys(ids, insert=True, name="ids")
    if inverse is not None:                  # per-position rows: summed here, then applied
        inverse, g = _position_rows(variable, grads, inverse, keys.size)
        keys = keys.reshape(-1)
        assume_unique = True
        g = segment_sum(g, inverse, keys.shape[0], numba.get_num_threads())
    else:
        g = _checks.as_values(grads, keys.shape, variable.dim,
                              _checks.compute_dtype(variable.value_dtype), "grads")
    if initial_rows is not None and assume_unique and not delta:
        init_vals, init_ok = _initial_rows(variable, initial_rows, keys.shape)
    else:
        init_vals = init_ok = None
    if keys.size == 0:
        return
    with variable._lock.write():                  # ids an admission filter holds back
        ok = admitted(variable, keys, _checks.flat_int64(keys))
    if ok is not None:                            # drop their gradients
        keys, g = _checks.flat_int64(keys)[ok], g.reshape(-1, variable.dim)[ok]
        if init_vals is not None:
            init_vals, init_ok = init_vals.reshape(-1, variable.dim)[ok], init_ok.reshape(-1)[ok]
        if keys.size == 0:
            return
    if assume_unique:
        uniq, sums = _checks.flat_int64(keys), g
    else:
        uniq, inverse = unique_inverse(_checks.flat_int64(keys))
        sums = segment_sum(g, inverse, uniq.shape[0], numba.get_num_threads())
    variable._check_room(uniq)
    if delta:
        _apply_delta(variable, optimizer, uniq, sums, lr, step)
        return
    with variable._lock.write():
        _add_slot_columns(variable, optimizer)
        names = [optimizer.column(name) for name, _ in optimizer.slots()]
        variable._last_step = step                  # the default epoch of bounded tables
        kw = variable._bound_kw(None, uniq.shape)
        for shard, pos, k in variable._parts(uniq.astype(variable._id_dtype, copy=False), uniq):
            fresh = w0 = None
            if init_vals is None:
                rows, _ = shard.find_or_insert(k, **kw)
            else:       # new rows are started by the update itself, in one pass
                rows, fresh, w0 = shard.find_or_insert_for_update(
                    k, init_vals if pos is None else init_vals[pos],
                    init_ok if pos is None else init_ok[pos], names, **kw)
            g = sums if pos is None else sums[pos]
            ok = rows >= 0          # a bounded table drops the ids it did not admit
            if not ok.all():
                rows, g = rows[ok], g[ok]
                fresh, w0 = (None, None) if fresh is None else (fresh[ok], w0[ok])
            cols = {name: shard.columns[optimizer.column(name)].data
                    for name, _ in optimizer.slots()}
            optimizer._update(shard.values, cols, rows, g, lr, step, fresh, w0)
            mark_updated(shard, rows, step)         # (steps_to_live tables)


def _position_rows(variable, grads, inverse, n_keys, at=""):
    """``(inverse (n,), grads (n, dim))`` checked: one gradient row per position, in the
    table's compute dtype, and each position's index into ``n_keys`` distinct ids
    (``at``: the argument names' suffix, e.g. ``"[3]"``)."""
    inverse = _checks.as_inverse(inverse, n_keys, f"inverse{at}").reshape(-1)
    return inverse, _checks.as_values(grads, inverse.shape, variable.dim,
                                      _checks.compute_dtype(variable.value_dtype), f"grads{at}",
                                      shape_of=f"inverse{at}")


def _initial_rows(variable, initial_rows, shape, at=""):
    """``initial_rows = (rows, valid)`` checked for ids of ``shape``: rows as stored."""
    rows, valid = initial_rows
    return (variable._values(rows, shape, f"initial_rows{at}[0]"),
            _checks.as_exists(valid, shape, f"initial_rows{at}[1]"))


def _add_slot_columns(variable, optimizer):
    """Create ``optimizer``'s slot columns in every shard (caller holds the write lock)."""
    for shard in variable.shards:
        for name, init in optimizer.slots():
            if optimizer.column(name) not in shard.columns:
                shard.add_column(optimizer.column(name), variable.dim,
                                 _checks.compute_dtype(variable.value_dtype),
                                 _slot_init(init, variable.dim))


def _apply_delta(variable, optimizer, uniq, sums, lr, step):
    """``apply_gradients(delta=True)`` on distinct int64 ``uniq`` and their ``sums``."""
    keys = uniq.astype(variable._id_dtype, copy=False)
    slots = optimizer.slots()
    n, dim, store = uniq.shape[0], variable.dim, variable._store
    dtype = _checks.compute_dtype(variable.value_dtype)     # slots' and the math's dtype
    old = np.empty((n, dim), store)
    exists = np.empty(n, np.bool_)
    cols = {name: np.empty((n, dim), dtype) for name, _ in slots}
    with variable._lock.write():
        _add_slot_columns(variable, optimizer)
    with variable._lock.read():             # the rows as the step starts
        for shard, pos, k in variable._parts(keys, uniq):
            o, e = (old, exists) if pos is None else (np.empty((k.shape[0], dim), store),
                                                      np.empty(k.shape[0], np.bool_))
            shard.lookup(k, o, e)           # absent: initial weights
            rows = shard.find_rows(k)
            hit = rows >= 0
            for name, init in slots:        # absent (or new to the table): initial slots
                s = np.full((k.shape[0], dim), init, dtype)
                s[hit] = shard.columns[optimizer.column(name)].data[rows[hit]]
                if pos is None:
                    cols[name][...] = s
                else:
                    cols[name][pos] = s
            if pos is not None:
                old[pos], exists[pos] = o, e
    old = variable._shown(old).astype(dtype, copy=False)    # 16-bit floats: exact in float32
    new = old.copy()
    optimizer._update(new, cols, np.arange(n, dtype=np.int64), sums, lr, step)
    variable.accum(keys, old, new, exists)
    with variable._lock.write():            # slots are set (last writer wins), as TFRA's
        for shard, pos, k in variable._parts(keys, uniq):
            rows = shard.find_rows(k)
            hit = rows >= 0
            mark_updated(shard, rows[hit], step)
            for name, _ in slots:
                src = cols[name] if pos is None else cols[name][pos]
                shard.columns[optimizer.column(name)].data[rows[hit]] = src[hit]


def slot_values(variable, optimizer, slot_name, ids):
    """Slot ``slot_name`` of ``optimizer`` for ``ids`` (shape ``ids.shape + (dim,)``);
    ids without the slot yet get its initial value."""
    if isinstance(variable, Variable) and variable.comm is not None:     # collective
        return variable._slot_values(optimizer, slot_name, ids)
    _check_slot(variable, optimizer, slot_name)
    keys = variable._host_keys(ids, name="ids")
    flat = _checks.flat_int64(keys)
    init = dict(optimizer.slots())[slot_name]
    out = np.full((flat.shape[0], variable.dim), init, _checks.compute_dtype(variable.value_dtype))
    with variable._lock.read():
        for shard, pos, k in variable._parts(keys, flat):
            col = shard.columns.get(optimizer.column(slot_name))
            if col is None:
                continue
            hit, rows = shard.read_rows(optimizer.column(slot_name), k)
            out[hit if pos is None else variable._arrays.host(pos)[hit]] = rows
    return out.reshape(keys.shape + (variable.dim,))
