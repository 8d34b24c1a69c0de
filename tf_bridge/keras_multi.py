"""Many tables in one layer, looked up in one op (``de.keras.layers.MultiEmbedding``).

A CTR model has tens of categorical features, each with its own table.  As
separate ``de.keras.layers.Embedding`` layers each table costs one hand-off into
Python a step for its lookup (a ``tf.numpy_function``; about 0.3 ms on a 2-core
VM, more than the lookup of a 4,096-id batch itself).  ``MultiEmbedding`` holds
one ``Embedding`` per feature and looks them all up in one op
(:func:`tf_bridge.lookup.lookup_many`); with ``de.DynamicEmbeddingOptimizer``
all tables' updates are one op too, so a step hands off twice whatever the
number of tables.  Each table's rows, gradients and optimizer state are exactly
those of separate ``Embedding`` layers of the same names.

    inp = {f: keras.Input((1,), dtype="int64", name=f) for f in ("user", "item", "city")}
    emb = de.keras.layers.MultiEmbedding({"user": 16, "item": 32, "city": 8}, name="emb")
    out = emb(inp)                          # {"user": (B, 1, 16), "item": (B, 1, 32), ...}

>>> import tensorflow as tf, tf_bridge as de
>>> layer = de.keras.layers.MultiEmbedding([4, 2], combiner="sum", name="doc_multi")
>>> a, b = layer([tf.constant([[1, 2]], tf.int64), tf.constant([[7], [8]], tf.int64)])
>>> a.shape, b.shape, [t.name for t in layer.tables]
(TensorShape([1, 4]), TensorShape([2, 2]), ['doc_multi_0', 'doc_multi_1'])
"""
import keras
import tensorflow as tf

from . import mode
from .keras_layers import Embedding
from .lookup import lookup_many

__all__ = ["MultiEmbedding"]


@keras.saving.register_keras_serializable(package="tf_bridge")
class MultiEmbedding(keras.layers.Layer):
    """One dynamic table per feature, all looked up in one op.

    Args:
      embedding_sizes: each table's row width: a list (tables ``<name>_0``,
        ``<name>_1``, ...; call the layer with a list or tuple of id tensors, one per
        table, in that order) or a dict (tables ``<name>_<key>``; call it with a dict
        of the same keys).  The result has the structure of the input: for each
        table what ``de.keras.layers.Embedding`` gives for its ids.
      name: layer name (each table's ``Embedding`` is named after it, and its
        default initializer is seeded by that name).
      trainable: Keras' flag, for every table.
      **kwargs: ``de.keras.layers.Embedding``'s arguments (``key_dtype``,
        ``combiner``, ``initializer``, ``init_size``, ``max_capacity``, ...), the same
        for every table.

    The tables are ``layer.tables`` (``Embedding`` layers, in order; ``.params`` is
    each one's ``de.Variable``).  Sparse or ragged ids, split (MPI) tables and eager
    calls are looked up table by table (same results, one op each).
    """

    def __init__(self, embedding_sizes, name=None, trainable=True, **kwargs):
        if isinstance(embedding_sizes, dict):
            keys = list(embedding_sizes)
            bad = [k for k in keys if not isinstance(k, str)]
            if bad:
                raise TypeError(f"embedding_sizes: dict keys must be str, got {bad[0]!r}")
            sizes = [embedding_sizes[k] for k in keys]
        elif isinstance(embedding_sizes, (list, tuple)):
            keys, sizes = None, list(embedding_sizes)
        else:
            raise TypeError("embedding_sizes must be a list of ints or a dict of feature name "
                            f"-> int, got {type(embedding_sizes).__name__}")
        if not sizes:
            raise ValueError("embedding_sizes must name at least one table, got none")
        super().__init__(name=name, trainable=trainable)
        self._keys = keys
        self._table_kwargs = dict(kwargs)
        suffixes = keys if keys is not None else [str(t) for t in range(len(sizes))]
        self.tables = [Embedding(size, name=f"{self.name}_{s}", trainable=trainable, **kwargs)
                       for size, s in zip(sizes, suffixes)]
        self.supports_jit = False

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # tf.train.Checkpoint: each table under ``table_<key or index>`` (Keras' list of
        # sublayers is not a TensorFlow dependency of its own)
        children = super()._trackable_children(save_type, **kwargs)
        suffixes = self._keys if self._keys is not None else range(len(self.tables))
        children.update({f"table_{s}": t for s, t in zip(suffixes, self.tables)})
        return children

    @property
    def embedding_sizes(self):
        sizes = [t.embedding_size for t in self.tables]
        return sizes if self._keys is None else dict(zip(self._keys, sizes))

    def _flat(self, structure, what):
        """The entries of ``structure`` (list or dict, as ``embedding_sizes``) in table
        order; raises a ValueError / TypeError naming ``what`` on a mismatch."""
        n = len(self.tables)
        if self._keys is None:
            if not isinstance(structure, (list, tuple)) or len(structure) != n:
                raise ValueError(f"layer {self.name!r}: {what} must be a list of {n} id tensors "
                                 f"(one per table), got {_describe(structure)}")
            return list(structure)
        if not isinstance(structure, dict) or set(structure) != set(self._keys):
            raise ValueError(f"layer {self.name!r}: {what} must be a dict with keys "
                             f"{sorted(self._keys)}, got {_describe(structure)}")
        return [structure[k] for k in self._keys]

    def _packed(self, flat):
        return list(flat) if self._keys is None else dict(zip(self._keys, flat))

    def build(self, input_shape=None):
        for t in self.tables:
            if not t.built:
                t.build()
        self.built = True

    def call(self, inputs, training=None):
        ids = self._flat(inputs, "inputs")
        if not self.built:
            self.build()
        if any(isinstance(i, (tf.SparseTensor, tf.RaggedTensor)) for i in ids):
            return self._packed([t(i, training=training) for t, i in zip(self.tables, ids)])
        train = training is not False and mode.is_training()
        handles = [tf.convert_to_tensor(t.handle) if train and t.trainable else None
                   for t in self.tables]
        if any(h is None and t.with_unique for t, h in zip(self.tables, handles)):
            # with_unique inference: per table, as the Embedding layer does
            return self._packed([t(i, training=training) for t, i in zip(self.tables, ids)])
        keys = [t._dense_ids(i, f"inputs[{n}]") for n, (t, i) in enumerate(zip(self.tables, ids))]
        embs = lookup_many([t.params for t in self.tables], keys, handles,
                           name=f"{self.name}_lookup")
        return self._packed([t._finish_rows(e) for t, e in zip(self.tables, embs)])

    def compute_output_spec(self, inputs, *args, **kwargs):
        return self._packed([t.compute_output_spec(i)
                             for t, i in zip(self.tables, self._flat(inputs, "inputs"))])

    def get_config(self):
        config = super().get_config()
        config.pop("dtype", None)
        table = self.tables[0].get_config()
        for k in ("name", "embedding_size", "trainable", "dtype"):
            table.pop(k, None)
        config.update(embedding_sizes=self.embedding_sizes, tables=table)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        table = dict(config.pop("tables", None) or {})
        if table.get("initializer") is not None:
            table["initializer"] = keras.initializers.deserialize(table["initializer"])
        return cls(**config, **table)


def _describe(x):
    if isinstance(x, dict):
        return f"a dict with keys {sorted(map(str, x))}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)}"
    return type(x).__name__
