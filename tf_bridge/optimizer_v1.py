"""``de.DynamicEmbeddingOptimizer(tf.compat.v1.train.XOptimizer(...))``: TF1 optimizers
(graph mode and eager) training dynamic tables, as TFRA's wrapper does for TF1 code.

Dense variables go to the wrapped optimizer unchanged; each dynamic variable's gradient
(the ``tf.IndexedSlices`` of its lookups) goes to numbaemb's row kernels with the wrapped
optimizer's hyper-parameters and math: ``GradientDescentOptimizer``,
``MomentumOptimizer`` (``use_nesterov``), ``AdagradOptimizer`` (``acc += g^2; w -= lr
g / sqrt(acc)``), ``AdamOptimizer`` and ``FtrlOptimizer``.  The step count of Adam's bias
correction is the wrapper's own int64 variable (``iterations``), saved with the graph's
variables.  ``compute_gradients`` / ``apply_gradients`` / ``minimize`` take TF1's
arguments::

    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.FtrlOptimizer(0.005))
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())

A plain (unwrapped) TF1 optimizer cannot update a dynamic table: it writes through the
variable's resource handle with TF's own kernels, and TF has no hook for another kind
of variable there.
"""
import tensorflow as tf

from numbaemb import optimizers as ne_opt

from .optimizer import apply_dynamic_all

__all__ = ["DynamicEmbeddingOptimizerV1", "translate_v1"]

_V1 = tf.compat.v1.train


def _lr(opt):
    lr = getattr(opt, "_learning_rate", getattr(opt, "_lr", None))
    return lr() if callable(lr) else lr


def translate_v1(opt):
    """``(numbaemb optimizer, learning-rate tensor or number)`` for a TF1 optimizer."""
    t = type(opt)
    if t is _V1.GradientDescentOptimizer:
        rule = ne_opt.SGD()
    elif t is _V1.MomentumOptimizer:
        rule = ne_opt.SGD(momentum=float(opt._momentum), nesterov=bool(opt._use_nesterov))
    elif t is _V1.AdagradOptimizer:
        rule = ne_opt.Adagrad(initial_accumulator_value=float(opt._initial_accumulator_value),
                              epsilon=0.0)
    elif t is _V1.AdamOptimizer:
        rule = ne_opt.Adam(beta_1=float(opt._beta1), beta_2=float(opt._beta2),
                           epsilon=float(opt._epsilon))
    elif t is _V1.FtrlOptimizer:
        rule = ne_opt.Ftrl(
            learning_rate_power=float(opt._learning_rate_power),
            initial_accumulator_value=float(opt._initial_accumulator_value),
            l1_regularization_strength=float(opt._l1_regularization_strength),
            l2_regularization_strength=float(opt._l2_regularization_strength),
            l2_shrinkage_regularization_strength=float(
                opt._l2_shrinkage_regularization_strength),
            beta=float(getattr(opt, "_beta", 0.0) or 0.0))
    else:
        raise TypeError("DynamicEmbeddingOptimizer supports tf.compat.v1.train's "
                        "GradientDescentOptimizer, MomentumOptimizer, AdagradOptimizer, "
                        f"AdamOptimizer and FtrlOptimizer; got {t.__module__}.{t.__name__}")
    return rule, _lr(opt)


class DynamicEmbeddingOptimizerV1:
    """A TF1 optimizer that also trains dynamic variables (see the module docstring)."""

    def __init__(self, optimizer, bp_v2=None, name=None):
        self._opt = optimizer
        self._rule, _ = translate_v1(optimizer)
        self._bp_v2 = bp_v2
        self._name = name or f"dynamic_{optimizer.get_name()}"
        self._iterations = None

    inner_optimizer = property(lambda self: self._opt)
    rule = property(lambda self: self._rule)

    def get_name(self):
        return self._name

    @property
    def iterations(self):
        """Steps applied (int64 variable, created with the first step)."""
        if self._iterations is None:
            with tf.init_scope():
                self._iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                                               name=f"{self._name}/iterations")
        return self._iterations

    def compute_gradients(self, loss, var_list=None, **kwargs):
        """The wrapped optimizer's ``compute_gradients`` (dynamic variables: the tape
        source is their trainable handle; pass ``var.trainable_variables`` in var_list)."""
        if var_list is not None:
            var_list = [h for v in var_list for h in getattr(v, "trainable_variables", [v])]
        return self._opt.compute_gradients(loss, var_list=var_list, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """One step: dense pairs through the wrapped optimizer, dynamic ones here; then
        ``global_step`` (if given) += 1.  Returns the train op (eager: None)."""
        from .variable import owner_of
        dense, dynamic = [], {}
        for g, v in grads_and_vars:
            if g is None:
                continue
            owner = owner_of(v)
            if owner is None:
                dense.append((g, v))
            else:
                dynamic.setdefault(owner, []).append(g)
        if not dense and not dynamic:
            raise ValueError("No gradients provided for any variable.")
        with tf.name_scope(name or self._name):
            step = self.iterations.assign_add(1)
            ops = [self._opt.apply_gradients(dense)] if dense else []
            lr = tf.cast(tf.convert_to_tensor(_lr(self._opt)), tf.float64)
            with tf.control_dependencies([step]):
                ops += [self._op(out) for out in apply_dynamic_all(
                    list(dynamic.items()), tf.identity(step), lr, self._rule, self._bp_v2)]
            ops = [op for op in ops if op is not None]
            if global_step is not None:
                with tf.control_dependencies(ops):
                    ops = [tf.compat.v1.assign_add(global_step, 1)]
            return None if tf.executing_eagerly() else tf.group(*ops, name="train")

    def minimize(self, loss, global_step=None, var_list=None, name=None, **kwargs):
        grads_and_vars = self.compute_gradients(loss, var_list=var_list, **kwargs)
        return self.apply_gradients(grads_and_vars, global_step=global_step, name=name)

    @staticmethod
    def _op(out):
        if isinstance(out, tf.Operation):
            return out
        return None if tf.executing_eagerly() else tf.group(out)
