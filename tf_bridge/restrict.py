"""Restrict policies (TFRA's ``de.TimestampRestrictPolicy`` / ``de.FrequencyRestrictPolicy``).

A policy bounds a variable's size.  Pass the policy *class* when creating the
variable; the variable makes its instance, the optimizer wrapper records every
step's ids in it, and ``var.restrict(num_reserved, trigger=None)`` evicts the
worst-scored keys.  Scores live in a column of the table that shares each key's
row (:mod:`numbaemb.policies`), so evicting a key removes its embedding, every
optimizer slot and its score at once.

>>> import tensorflow as tf, tf_bridge as de
>>> v = de.Variable(dim=2, name="doc_restrict", restrict_policy=de.TimestampRestrictPolicy)
>>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
>>> for ids in ([1, 2, 3], [3]):                  # 3 is the most recently trained id
...     with tf.GradientTape() as tape:
...         loss = tf.reduce_sum(de.embedding_lookup(v, tf.constant(ids, tf.int64)))
...     _ = opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
>>> int(v.restrict(1)), v.export()[0].numpy().tolist()   # keys removed, keys kept
(2, [3])
"""
import numpy as np
import tensorflow as tf

import numbaemb
from numbaemb import policies as ne_policies

from .dlpack import numpy_call

__all__ = ["RestrictPolicy", "TimestampRestrictPolicy", "FrequencyRestrictPolicy"]


def _count(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


class RestrictPolicy:
    """Base class: binds a numbaemb policy to the table of a ``de.Variable``.

    Args:
      var: the ``tf_bridge.Variable`` to restrict (variables create their policy
        themselves from ``restrict_policy=<class>``).
    """

    _impl = None      # the numbaemb.policies class

    def __init__(self, var):
        table = getattr(var, "table", None)
        if not isinstance(table, numbaemb.Variable):
            raise TypeError(f"var must be a tf_bridge.Variable, got {type(var).__name__}")
        if self._impl is None:
            raise TypeError("RestrictPolicy is abstract: use TimestampRestrictPolicy or "
                            "FrequencyRestrictPolicy")
        self.var = var
        self.policy = self._impl(table)

    def update(self, ids):
        """numpy: record that ``ids`` (any shape, the variable's key dtype) were trained,
        each distinct id once (as TFRA's policies count).  On a table split across
        ranks (``distributed=True``) collective: every rank records its step's ids, and
        the owners record each id once, whichever ranks trained it (one process fed
        the global batch does the same)."""
        self.policy.update(ids, once=True)

    def apply_update(self, ids, name=None):
        """Record that ``ids`` (a tensor of any shape) were trained (the optimizer
        wrapper does this after every step)."""
        from .variable import as_ids
        numpy_call(lambda k: (self.update(k), ())[1], [as_ids(ids, "ids")], [], name=name)

    def apply_restriction(self, num_reserved, trigger=None, name=None):
        """Keep the ``num_reserved`` best-scored keys once size exceeds ``trigger``
        (default ``num_reserved``); the removed keys leave the table and every slot.
        On a table split across ranks (collective: call it on every rank) each rank
        keeps its best ``num_reserved / world size`` keys (the remainder to the first
        ranks) once the whole table's size exceeds ``trigger``, as TFRA restricts each
        partition; it returns the keys removed from the whole table.

        Returns an int64 scalar tensor: how many keys were removed.
        """
        num_reserved = _count(num_reserved, "num_reserved")
        trigger = num_reserved if trigger is None else _count(trigger, "trigger")
        if num_reserved < 0:
            raise ValueError(f"num_reserved must be >= 0, got {num_reserved}")
        if trigger < num_reserved:
            raise ValueError(f"trigger must be >= num_reserved ({num_reserved}), got {trigger}")

        def run():
            removed = self.policy.apply_restriction(num_reserved, trigger)
            if removed:
                from .optimizer import drop_stale_slots
                drop_stale_slots(self.var)
            return (np.array(removed, np.int64),)

        return numpy_call(run, [], [tf.int64], name=name)[0]

    def __repr__(self):
        return f"{type(self).__name__}(var={self.var.name!r})"


class TimestampRestrictPolicy(RestrictPolicy):
    """Evict the keys trained least recently (a logical clock ticks once per step)."""

    _impl = ne_policies.TimestampRestrictPolicy


class FrequencyRestrictPolicy(RestrictPolicy):
    """Evict the keys trained least often (one count per step that trains the key)."""

    _impl = ne_policies.FrequencyRestrictPolicy


def make_policy(restrict_policy, var):
    """The policy instance for ``Variable(restrict_policy=...)``: None, or a
    ``RestrictPolicy`` subclass (TFRA passes the class)."""
    if restrict_policy is None:
        return None
    if not (isinstance(restrict_policy, type) and issubclass(restrict_policy, RestrictPolicy)):
        raise TypeError("restrict_policy must be None or a RestrictPolicy subclass such as "
                        f"de.TimestampRestrictPolicy, got {restrict_policy!r}")
    return restrict_policy(var)
