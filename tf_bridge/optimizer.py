"""``DynamicEmbeddingOptimizer``: a Keras 3 optimizer that also trains dynamic variables.

Wrap a Keras ``SGD`` (momentum, Nesterov), ``Adagrad``, ``Adam``, ``Ftrl`` or
``RMSprop``.  Each step splits the ``(gradient, variable)`` pairs:

* pairs whose variable is a ``de.Variable`` or the trainable handle of one
  (``de.owner_of``): the gradient is ``tf.IndexedSlices(values (u, dim), keys (u,))``
  from ``embedding_lookup``; one ``tf.numpy_function`` per variable per step runs
  :func:`numbaemb.optimizers.apply_gradients`: one hash probe per distinct id,
  then one Numba row update over the weight row and its row-aligned slot rows.
  Absent ids are inserted first (weights and slots), so after the step every id
  of the batch is in the table and in its slots (TFRA semantics).  Keys that the
  lookup already made distinct (:func:`tf_bridge.lookup.is_distinct`: one gradient
  per variable, straight from its backward pass) are applied with
  ``assume_unique=True``: no second unique pass, no copy of the rows;
* every other pair goes to the wrapped optimizer unchanged.

The wrapped optimizer's hyper-parameters are translated once into the matching
frozen :mod:`numbaemb.optimizers` dataclass; its learning rate (a float, a
variable, a schedule or a callable) is read at every step, and the step number
is its ``iterations + 1`` (Adam's bias correction), so dense and dynamic
variables see the same learning rate and step.  ``iterations`` and
``learning_rate`` are the wrapped optimizer's.

>>> import tensorflow as tf, tf_bridge as de
>>> user = de.Variable(dim=2, name="doc_opt", initializer=1.0)
>>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
>>> with tf.GradientTape() as tape:
...     loss = tf.reduce_sum(de.embedding_lookup(user, tf.constant([3, 3, 4], tf.int64)))
>>> _ = opt.apply_gradients(zip(tape.gradient(loss, [user]), [user]))
>>> user.lookup(tf.constant([3, 4, 5], tf.int64)).numpy().tolist()   # 5 was never trained
[[0.0, 0.0], [0.5, 0.5], [1.0, 1.0]]
>>> int(opt.iterations)
1

``bp_v2`` (TFRA): the weight change is computed from the rows as they are when
the step starts and added through ``Variable.accum`` (insert where absent)
instead of being written in place
(``numbaemb.optimizers.apply_gradients(..., delta=True)``); the slots are
row-aligned columns of the variable's own table either way, so
``tf.train.Checkpoint`` and ``.keras`` files save and restore them.  Without
``bp_v2`` the in-place row kernels run under the shard's write lock, which
already adds each step's change to the current row for every optimizer whose
update is additive (all but FTRL).
"""
import os

import keras
import numpy as np
import tensorflow as tf

from numbaemb import multi as ne_multi
from numbaemb import optimizers as ne_opt
from numbaemb._deferred import defer

from .dlpack import from_tf, numpy_call
from .lookup import is_distinct, positions_of, take_fresh
from .variable import owner_of

__all__ = ["DynamicEmbeddingOptimizer", "translate", "drop_stale_slots"]

# Keras 3 class -> (numbaemb class, hyper-parameters read from the Keras optimizer)
_RULES = {
    keras.optimizers.SGD: (ne_opt.SGD, ("momentum", "nesterov")),
    keras.optimizers.Adagrad: (ne_opt.Adagrad, ("initial_accumulator_value", "epsilon")),
    keras.optimizers.Adam: (ne_opt.Adam, ("beta_1", "beta_2", "epsilon", "amsgrad")),
    keras.optimizers.Ftrl: (ne_opt.Ftrl, (
        "learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
        "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta")),
    keras.optimizers.RMSprop: (ne_opt.RMSprop, ("rho", "momentum", "epsilon", "centered")),
}
_SUPPORTED = ", ".join(f"keras.optimizers.{c.__name__}" for c in _RULES)


def translate(optimizer) -> ne_opt.Optimizer:
    """The :mod:`numbaemb.optimizers` dataclass with ``optimizer``'s hyper-parameters.

    Exact classes only (a subclass such as ``AdamW`` changes the math).  The learning
    rate is the current one when it is a number (it is read again at every step).

    >>> translate(keras.optimizers.SGD(0.5, momentum=0.9, nesterov=True))
    SGD(learning_rate=0.5, momentum=0.9, nesterov=True)

    Raises:
      TypeError: ``optimizer`` is not one of the supported Keras 3 optimizers.
    """
    rule = _RULES.get(type(optimizer))
    if rule is None:
        raise TypeError(f"DynamicEmbeddingOptimizer supports {_SUPPORTED}; got "
                        f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    cls, names = rule
    kwargs = {n: getattr(optimizer, n) for n in names}
    lr = optimizer.get_config().get("learning_rate")
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0:
        kwargs["learning_rate"] = float(lr)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"cannot translate {type(optimizer).__name__}: {e}") from None


def _check_options(optimizer):
    bad = [f"{a}={getattr(optimizer, a)!r}" for a in (
        "weight_decay", "use_ema", "gradient_accumulation_steps", "global_clipnorm")
        if getattr(optimizer, a, None)]
    if bad:
        raise ValueError(f"DynamicEmbeddingOptimizer does not support {', '.join(bad)} on the "
                         f"wrapped {type(optimizer).__name__}: these act on whole dense "
                         "variables, which a dynamic table is not")


class _Vars:
    """A plain holder, so Keras' attribute tracking does not adopt model variables."""

    def __init__(self, items):
        self.items = list(items)


@keras.saving.register_keras_serializable(package="tf_bridge")
class DynamicEmbeddingOptimizer(keras.optimizers.Optimizer):
    """Keras optimizer wrapper that applies ``optimizer``'s math to dynamic variables.

    Usable wherever a Keras optimizer is (``model.compile``, ``apply_gradients``,
    ``apply``), eagerly and inside ``tf.function``.

    Args:
      optimizer: a Keras 3 ``SGD``, ``Adagrad``, ``Adam``, ``Ftrl`` or ``RMSprop``.
        Its ``clipnorm`` / ``clipvalue`` / ``loss_scale_factor`` apply to dynamic
        gradients too (per distinct id, after summing duplicates); ``weight_decay``,
        ``use_ema``, ``gradient_accumulation_steps`` and ``global_clipnorm`` are refused.
      bp_v2: None (default): each variable's own ``bp_v2``; True / False: for all.
      name: optional name.

    Raises:
      TypeError: ``optimizer`` is not a supported Keras 3 optimizer (named in the message).
      ValueError: an unsupported option is set on it.
    """

    def __new__(cls, optimizer=None, *args, **kwargs):
        # TF1 optimizers (tf.compat.v1.train.*): the TF1 wrapper, as TFRA's wrapper does
        if isinstance(optimizer, tf.compat.v1.train.Optimizer):
            from .optimizer_v1 import DynamicEmbeddingOptimizerV1
            return DynamicEmbeddingOptimizerV1(optimizer, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, optimizer, bp_v2=None, name=None):
        if isinstance(optimizer, DynamicEmbeddingOptimizer):
            raise TypeError("optimizer is already a DynamicEmbeddingOptimizer")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"optimizer must be a Keras 3 optimizer ({_SUPPORTED}), got "
                            f"{type(optimizer).__module__}.{type(optimizer).__name__}")
        rule = translate(optimizer)
        _check_options(optimizer)
        if bp_v2 is not None and not isinstance(bp_v2, bool):
            raise TypeError(f"bp_v2 must be None or a bool, got {type(bp_v2).__name__}")
        super().__init__(learning_rate=0.0, name=name or f"dynamic_{optimizer.name}")
        self._inner = optimizer
        self._rule = rule
        self._bp_v2 = bp_v2
        self._var_list = _Vars(())

    # ---- the wrapped optimizer's state is the state --------------------------------
    @property
    def inner_optimizer(self):
        """The wrapped Keras optimizer (it updates the dense variables)."""
        return self._inner

    @property
    def rule(self) -> ne_opt.Optimizer:
        """The numbaemb dataclass applied to dynamic variables."""
        return self._rule

    @property
    def iterations(self):
        return self._inner.iterations

    @property
    def learning_rate(self):
        return self._inner.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self._inner.learning_rate = value

    @property
    def loss_scale_factor(self):
        inner = self.__dict__.get("_inner")
        return None if inner is None else inner.loss_scale_factor

    @loss_scale_factor.setter
    def loss_scale_factor(self, value):
        inner = self.__dict__.get("_inner")
        if inner is not None:        # Keras' __init__ sets None before _inner exists
            inner.loss_scale_factor = value

    @property
    def variables(self):
        return self._variables[:] + self._inner.variables

    # ---- Keras entry points -----------------------------------------------------------
    def build(self, var_list):
        """Builds the wrapped optimizer on the dense variables of ``var_list``."""
        var_list = list(var_list)
        dense = [v for v in var_list if owner_of(v) is None]
        if dense and not self._inner.built:
            self._inner.build(dense)
        self._var_list = _Vars(var_list)
        self.built = True

    def apply_gradients(self, grads_and_vars):
        """``[(gradient, variable)]``; returns ``iterations``."""
        grads, variables = zip(*grads_and_vars) if grads_and_vars else ((), ())
        self.apply(list(grads), list(variables))
        return self.iterations

    def apply(self, grads, trainable_variables=None):
        """One step: dynamic variables here, the others through the wrapped optimizer.

        ``grads`` match ``trainable_variables`` one to one (None: no gradient).
        """
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError("call build(variables) or pass trainable_variables first")
            trainable_variables = self._var_list.items
        trainable_variables = list(trainable_variables)
        if not self.built:
            self.build(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise ValueError(f"got {len(grads)} gradients for {len(trainable_variables)} variables")
        dense_g, dense_v, dynamic = [], [], {}
        for g, v in zip(grads, trainable_variables):
            owner = owner_of(v)
            if g is None:
                continue
            if owner is None:
                dense_g.append(g)
                dense_v.append(v)
            else:
                dynamic.setdefault(owner, []).append(g)
        if not dense_g and not dynamic:
            raise ValueError("No gradients provided for any variable.")
        with tf.name_scope(self.name):
            step = tf.cast(tf.convert_to_tensor(self._inner.iterations), tf.int64) + 1
            lr = tf.cast(tf.convert_to_tensor(self._inner.learning_rate), tf.float64)
            inner = self._inner
            changes = (inner.loss_scale_factor is not None or inner.clipnorm or
                       inner.clipvalue)
            apply_dynamic_all(list(dynamic.items()), step, lr, self._rule, self._bp_v2,
                              self._prepare if changes else None)
            if dense_g:
                self._inner.apply(dense_g, dense_v)     # advances the inner iterations
            else:
                self._inner.iterations.assign_add(1)
            self._iterations.assign_add(1)

    def finalize_variable_values(self, var_list):
        """Keras calls this when ``fit`` ends: the dynamic tables' last (deferred) update
        is waited for here, so ``fit`` returns with every step applied and raises a
        failed update's error."""
        dense = [v for v in var_list if owner_of(v) is None]
        for v in var_list:
            owner = owner_of(v)
            if owner is not None and not owner.distributed:
                owner.table.block_until_ready()
        self._inner.finalize_variable_values(dense)

    # ---- dynamic variables --------------------------------------------------------------
    def _prepare(self, values):
        """Loss-scale and clipping of the wrapped optimizer, on summed per-id rows."""
        inner = self._inner
        if inner.loss_scale_factor is not None:
            values = values / tf.cast(inner.loss_scale_factor, values.dtype)
        if inner.clipnorm:
            values = tf.clip_by_norm(values, inner.clipnorm)
        elif inner.clipvalue:
            values = tf.clip_by_value(values, -inner.clipvalue, inner.clipvalue)
        return values

    def get_slot(self, var, slot_name, ids):
        """Slot ``slot_name`` (e.g. ``"m"`` for Adam) of dynamic variable ``var`` for
        ``ids``: ``ids.shape + [dim]``; ids without the slot get its initial value."""
        var = owner_of(var)
        if var is None:
            raise TypeError("var must be a tf_bridge.Variable or its trainable handle")
        ids = np.asarray(from_tf(ids))
        return tf.constant(ne_opt.slot_values(var.table, self._rule, slot_name, ids))

    def get_config(self):
        return {"name": self.name, "bp_v2": self._bp_v2,
                "optimizer": keras.saving.serialize_keras_object(self._inner)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"),
                                                      custom_objects=custom_objects)
        return cls(inner, **config)


# ---- one step of one dynamic variable (the Keras and the TF1 wrapper) ------------------------
# Sum a training lookup's output gradient per id inside the optimizer's update pass (one op,
# no (u, dim) sums tensor; see _fused_parts).  False: the separate sum op, as before (the
# same results bit for bit; for A/B measurements).  Read when a step is traced.
FUSED = True
# One numpy_call a step for all of a process's tables (False: one per table, as before).
BATCHED = True
# A Keras step's fused update of plain CPU tables runs after the step's op returns, on
# numbaemb's worker thread (numbaemb._deferred): it overlaps Keras' loop and the next
# batch's first ops, and every later call on those tables waits for it, so results are
# bit for bit the same.  Read at every step; env NUMBAEMB_DEFERRED=0 turns it off.
DEFERRED = os.environ.get("NUMBAEMB_DEFERRED", "1").strip() != "0"

def apply_dynamic_all(items, step, lr, rule, bp_v2=None, prepare=None):
    """Apply each ``(var, grads)`` of ``items`` (``grads``: the ``tf.IndexedSlices`` of
    ``var``'s lookups) with numbaemb optimizer ``rule`` at ``step`` (int64 tensor) and
    learning rate ``lr`` (float64 tensor); ``prepare``: what to do to the summed rows
    first (loss scale, clipping).  The tables of this process go in ONE ``numpy_call``
    (a step's hand-off into Python once, not once per table; ``BATCHED``), each table
    split across MPI ranks in its own collective call.  Returns the calls' results."""
    plans = [(var, *_plan(var, grads, rule, bp_v2, prepare)) for var, grads in items]
    groups = [[p] for p in plans if p[0].distributed]
    local = [p for p in plans if not p[0].distributed]
    if local:
        groups += [local] if BATCHED else [[p] for p in local]
    out = []
    for group in groups:
        sizes = [len(inputs) for _, inputs, _ in group]

        def run(s, r, *arrays, group=group, sizes=sizes):
            s, r, at = int(s), float(r), 0
            parts = []
            for (var, _, fn), n in zip(group, sizes):
                part = arrays[at:at + n]
                at += n
                # the initial rows the last lookup drew, taken now (the next lookup
                # replaces them; see take_fresh)
                parts.append((var, part, fn, take_fresh(var, part[0]) if fn.fresh else None))
            if DEFERRED and all(fn.defers() for _, _, fn, _ in parts):
                names = ", ".join(repr(p[0].name) for p in parts)
                defer([p[0].table._lock for p in parts], lambda: _run_parts(rule, parts, s, r),
                      f"the optimizer step {s} of dynamic table(s) {names}")
            else:
                _run_parts(rule, parts, s, r)
            return ()

        var = group[0][0]
        name = f"{var.name}_apply" if len(group) == 1 else "dynamic_tables_apply"
        out.append(numpy_call(run, [step, lr] + [x for _, inputs, _ in group for x in inputs],
                              [], name=name, collective=var.distributed))
    return out


def _run_parts(rule, parts, s, r):
    """The steps of ``parts`` ``[(var, arrays, fn, fresh)]``: plain tables' fused steps
    in one kernel call (:func:`_step_many`), the others one by one."""
    together = []
    for var, part, fn, fresh in parts:
        if fn.joins:
            together.append((var, part, fn, fresh))
        else:
            fn(s, r, *part, fresh=fresh)
    if len(together) == 1:
        _, part, fn, fresh = together[0]
        fn(s, r, *part, fresh=fresh)
    elif together:
        _step_many(rule, [(var, part, fresh) for var, part, _, fresh in together], s, r)


def _plan(var, grads, rule, bp_v2, prepare):
    """``(input tensors, fn(step, lr, *arrays, fresh=))`` of one table's step (checked);
    ``fn.fresh``: it takes the initial rows the last lookup drew for its keys (``fresh=``,
    :func:`take_fresh`'s); ``fn.joins``: it may run in one kernel call with other tables'
    (:func:`_step_many`); ``fn.defers()``: it may run deferred (:data:`DEFERRED`)."""
    bp_v2 = var.bp_v2 if bp_v2 is None else bp_v2
    fused = _fused_parts(var, grads, bp_v2, prepare)
    if fused is not None:
        def fused_step(s, r, k, inv, rows, fresh=None):
            _step(var, rule, k, rows, s, r, False, True, inverse=inv, fresh=fresh)
        fused_step.fresh = True
        # plain tables' fused steps run in one kernel call (_step_many)
        fused_step.joins = (not var.string_keys and var._pending is None
                            and ne_multi.trains_with_others(var.table))
        fused_step.defers = lambda: _defers(var)     # (asked every step: max_keys may change)
        return list(fused), fused_step
    keys, values = [], []
    for g in grads:
        if not isinstance(g, tf.IndexedSlices):
            raise TypeError(f"the gradient of dynamic variable {var.name!r} must be the "
                            "tf.IndexedSlices of de.embedding_lookup, got "
                            f"{type(g).__name__} (was its trainable_handle used directly?)")
        if g.values.shape.rank != 2 or g.values.shape[1] not in (None, var.dim):
            raise ValueError(f"the gradient of {var.name!r} must have values of shape "
                             f"(n, {var.dim}), got {g.values.shape}")
        keys.append(g.indices)
        values.append(tf.cast(g.values, var.grad_dtype))   # 16-bit tables: float32
    distinct = len(keys) == 1 and is_distinct(keys[0])
    keys = keys[0] if len(keys) == 1 else tf.concat(keys, 0)
    values = values[0] if len(values) == 1 else tf.concat(values, 0)
    if prepare is not None:
        values = prepare(values)

    def plain_step(s, r, k, g, fresh=None):
        _step(var, rule, k, g, s, r, bp_v2, distinct, fresh=fresh)
    plain_step.fresh = distinct and not bp_v2
    plain_step.joins = False
    plain_step.defers = lambda: False
    return [keys, values], plain_step


def _fused_parts(var, grads, bp_v2, prepare):
    """``(distinct keys, inverse, output gradient rows)`` of one training lookup's
    gradient, for a step that sums the rows itself (:func:`tf_bridge.lookup.positions_of`:
    the op that summed them is then pruned).  None when the gradient is not that
    (several lookups, eager tensors) or the rows must be summed first (clipping, loss
    scale, bp_v2, a table split across processes)."""
    if not FUSED or len(grads) != 1 or prepare is not None or bp_v2 or var.distributed:
        return None
    g = grads[0]
    if not isinstance(g, tf.IndexedSlices) or not is_distinct(g.indices):
        return None
    parts = positions_of(g.values)
    if parts is None:
        return None
    inverse, rows = parts
    return g.indices, inverse, rows


# ---- numpy side: one call per dynamic variable per step -------------------------------------
def _defers(var):
    """Whether ``var``'s fused step may run deferred (:data:`DEFERRED`): a plain table in
    this process's memory whose step cannot fail on its input (no ``max_keys``) and
    touches nothing but the table (no callable initializer's rows, no string names)."""
    table = var.table
    return (not var.distributed and not var.string_keys and var._pending is None
            and table.device == "cpu" and table.max_keys is None)


def _step_many(rule, items, step, lr):
    """The fused steps (``_step(..., inverse=...)``) of several plain tables, ``items``
    ``[(var, (keys, inverse, rows), fresh)]`` (``fresh``: :func:`take_fresh`'s), in one
    kernel call (:func:`numbaemb.multi.apply_many`; the same results as one ``_step`` a
    table)."""
    ne_multi.apply_many([v.table for v, _, _ in items], rule, [p[0] for _, p, _ in items],
                        [p[2] for _, p, _ in items], [p[1] for _, p, _ in items],
                        [f for _, _, f in items], step=step, learning_rate=lr)
    for var, (keys, _, _), _ in items:
        _restricted(var, keys)


def _step(var, rule, keys, grads, step, lr, bp_v2, distinct=False, inverse=None, fresh=None):
    """``fresh``: the initial rows the last lookup drew (:func:`take_fresh`) or None."""
    var.insert_initial_values(keys)          # callable initializers: rows the loss saw
    ne_opt.apply_gradients(var.table, rule, keys, grads, step=step, learning_rate=lr,
                           assume_unique=distinct, delta=bp_v2, inverse=inverse,
                           initial_rows=fresh)   # initial rows the lookup drew: not redrawn
    _restricted(var, keys)


def _restricted(var, keys):
    """After a step on ``keys``: ``var``'s restrict policy records them."""
    if var.restrict_policy is not None:
        var.restrict_policy.update(keys)


def drop_stale_slots(var):
    """Kept for callers of the old bp_v2 layout: slots are columns of ``var``'s own
    table now, so removing a key removes its slots; nothing is left to drop."""


class _SlotColumns:
    """Read-only view of the bp_v2 slots of ``var`` as the former companion table's
    ``export`` showed them: the table's keys, ``rule``'s slots side by side."""

    def __init__(self, var, rule):
        self._var, self._rule = var, rule

    def export(self):
        keys = self._var.table.export()[0]
        parts = [ne_opt.slot_values(self._var.table, self._rule, n, keys)
                 for n, _ in self._rule.slots()]
        width = self._var.dim * len(parts)
        return keys, (np.concatenate(parts, axis=1) if parts
                      else np.empty((keys.shape[0], width), self._var.table.value_dtype))


def _slot_table(var, rule):
    """Compatibility view of ``var``'s slot columns for ``rule`` (see ``_SlotColumns``)."""
    return _SlotColumns(var, rule)
