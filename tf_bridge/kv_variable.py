"""DeepRec's ``get_kv_variable`` (seed 002) over ``tf_bridge.Variable``.

``de.get_kv_variable(name, embedding_dim, ...)`` honours ``tf.compat.v1.variable_scope``
(the name is scoped; ``reuse=True`` / ``tf.compat.v1.AUTO_REUSE`` give back the same
variable, as ``tf.compat.v1.get_variable`` does) and a ``partitioner``
(``tf.compat.v1.fixed_size_partitioner(n)``: a table of ``n`` shards).  In a TF1 graph
the variable's state joins the ``SAVEABLE_OBJECTS`` collection
(:func:`tf_bridge.checkpoint.saveable`), so
``tf.compat.v1.train.Saver()`` saves and restores its keys, rows and optimizer slots under
``<scoped name>/...`` (into any shard count).  Train it
with ``de.DynamicEmbeddingOptimizer(tf.compat.v1.train.XOptimizer(...))``.

>>> import tensorflow as tf
>>> with tf.compat.v1.variable_scope("doc_kv", reuse=tf.compat.v1.AUTO_REUSE):
...     v = get_kv_variable("emb", embedding_dim=4)
...     w = get_kv_variable("emb", embedding_dim=4)
>>> v is w, v.name
(True, 'doc_kv/emb')
"""
import tensorflow as tf

from ._args import int_at_least
from .variable import Variable, _registry

__all__ = ["get_kv_variable"]

_NOMINAL_ROWS = 1 << 20       # the row count partitioners are shown (tables have no shape)
_MAX_SHARDS = 256


def get_kv_variable(name, embedding_dim=None, key_dtype=tf.int64, value_dtype=tf.float32,
                    initializer=None, trainable=None, collections=None, partitioner=None,
                    constraint=None):
    """A dynamic table ``key -> row of embedding_dim values`` named ``name`` in the
    current variable scope (DeepRec's arguments; ``trainable`` None means True)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    embedding_dim = int_at_least(embedding_dim, "embedding_dim")
    if constraint is not None:
        raise NotImplementedError("constraint is not supported on a dynamic table")
    if isinstance(initializer, tf.Tensor) and not initializer.shape.is_fully_defined():
        raise ValueError(f"an initializer tensor must have a defined shape, got "
                         f"{initializer.shape}")
    scope = tf.compat.v1.get_variable_scope()
    full = f"{scope.name}/{name}" if scope.name else name
    names = _registry()
    old = names.get(full)
    if old is not None:
        if not scope.reuse:
            raise ValueError(f"Variable {full} already exists, disallowed. Did you mean to set "
                             "reuse=True or reuse=tf.compat.v1.AUTO_REUSE in VarScope?")
        if (old.dim, old.key_dtype, old.value_dtype) != (embedding_dim, tf.as_dtype(key_dtype),
                                                         tf.as_dtype(value_dtype)):
            raise ValueError(f"Variable {full} exists with dim {old.dim} and dtypes "
                             f"{old.key_dtype.name}/{old.value_dtype.name}")
        return old
    if scope.reuse is True:
        raise ValueError(f"Variable {full} does not exist, or was not created with "
                         "get_kv_variable(). Did you mean to set "
                         "reuse=tf.compat.v1.AUTO_REUSE in VarScope?")
    shards = 1
    if partitioner is not None:
        parts = partitioner(shape=tf.TensorShape([_NOMINAL_ROWS, embedding_dim]),
                            dtype=tf.as_dtype(value_dtype))
        shards = max(1, min(int(parts[0]), _MAX_SHARDS))
    var = Variable(key_dtype, value_dtype, embedding_dim, name=full, initializer=initializer,
                   trainable=True if trainable is None else bool(trainable), num_shards=shards)
    names[full] = var
    if not tf.executing_eagerly() and not tf.inside_function():
        for c in collections or ():          # (SAVEABLE_OBJECTS: the Variable joins it)
            tf.compat.v1.add_to_collection(c, var)
    return var
