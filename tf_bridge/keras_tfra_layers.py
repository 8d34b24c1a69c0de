"""TFRA's other Keras layers over :class:`tf_bridge.keras_layers.Embedding`.

* ``SquashedEmbedding``: ids of any shape, rows reduced over every axis but the batch
  (``(batch, ...)`` ids give ``(batch, dim)``; ``(n,)`` ids give ``(dim,)``);
* ``FieldWiseEmbedding``: ``slot_map_fn(ids)`` puts each id in one of ``nslots`` fields;
  a sample's rows are combined per field: ``(batch, n)`` ids give ``(batch, nslots, dim)``;
* ``HvdAllToAllEmbedding``: the layer split across the MPI ranks
  (``Embedding(distributed=True)``, see :mod:`tf_bridge.distributed`).

All train like ``Embedding`` (``de.DynamicEmbeddingOptimizer``; one distinct-id lookup
a step) and save like it (``model.save`` / ``tf.train.Checkpoint``).

>>> import tensorflow as tf
>>> layer = SquashedEmbedding(8, initializer=tf.keras.initializers.Ones())
>>> layer(tf.constant([[15, 2], [4, 92], [22, 4]], tf.int64)).shape
TensorShape([3, 8])
"""
import keras
import tensorflow as tf

from ._args import int_at_least
from .keras_layers import COMBINERS, Embedding

__all__ = ["SquashedEmbedding", "FieldWiseEmbedding", "HvdAllToAllEmbedding"]

_REDUCE = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "min": tf.reduce_min,
           "max": tf.reduce_max, "prod": tf.reduce_prod, "std": tf.math.reduce_std}


def _dense_ids(inputs, layer):
    if isinstance(inputs, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"{type(layer).__name__} takes dense ids, got a "
                        f"{type(inputs).__name__}; use Embedding(combiner=...) for sparse or "
                        "ragged ids")
    return layer.params.keys_in(inputs, "inputs")


class _DenseOutput(Embedding):
    """Layers whose output is dense whatever the input: the symbolic output follows
    ``compute_output_shape``."""

    def compute_output_spec(self, inputs, *args, **kwargs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype=self.compute_dtype)


@keras.saving.register_keras_serializable(package="tf_bridge")
class SquashedEmbedding(_DenseOutput):
    """TFRA's ``SquashedEmbedding``: rows of ids of any shape, reduced by ``combiner``
    ("sum" (default), "mean", "min", "max", "prod", "std") over every axis but the
    first, or over the ids for 1-D ids.  Other arguments: as ``Embedding``."""

    def __init__(self, embedding_size, combiner="sum", **kwargs):
        if combiner not in _REDUCE:
            raise ValueError(f"combiner must be one of {sorted(_REDUCE)}, got {combiner!r}")
        super().__init__(embedding_size, combiner=None, **kwargs)
        self.squash = combiner

    def call(self, inputs, training=None):
        ids = _dense_ids(inputs, self)
        rank = ids.shape.rank
        if rank is None or rank == 0:
            raise ValueError(f"SquashedEmbedding needs ids of known rank >= 1, got {ids.shape}")
        rows = self._rows(ids, training)                     # ids.shape + [dim]
        axes = list(range(1, rank)) if rank > 1 else [0]
        return _REDUCE[self.squash](rows, axis=axes)

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape)
        return (shape[0], self.embedding_size) if len(shape) > 1 else (self.embedding_size,)


    def get_config(self):
        return dict(super().get_config(), combiner=self.squash)


@keras.saving.register_keras_serializable(package="tf_bridge")
class FieldWiseEmbedding(_DenseOutput):
    """TFRA's ``FieldWiseEmbedding``: ``(batch, n)`` ids (or ``(batch,)``) give
    ``(batch, nslots, dim)``, field ``s`` of a sample holding its ids with
    ``slot_map_fn(id) == s`` combined by ``combiner`` ("sum" (default), "mean",
    "sqrtn"; a field without ids gives zeros).

    Args:
      embedding_size: row width.  nslots: number of fields.
      slot_map_fn: element-wise ``f(ids) -> fields`` (int tensor of ids' shape, values
        in ``[0, nslots)``; others raise ``InvalidArgumentError``).  For ``model.save``
        it must be a Keras-serializable function
        (``@keras.saving.register_keras_serializable()``).
      Others: as ``Embedding``.
    """

    def __init__(self, embedding_size, nslots, slot_map_fn=None, combiner="sum", **kwargs):
        if isinstance(slot_map_fn, dict):                 # from_config
            slot_map_fn = keras.saving.deserialize_keras_object(slot_map_fn)
        if not callable(slot_map_fn):
            raise ValueError(f"slot_map_fn must be callable, got {type(slot_map_fn).__name__}")
        nslots = int_at_least(nslots, "nslots")
        if combiner not in COMBINERS or combiner is None:
            raise ValueError(f"combiner must be one of {[c for c in COMBINERS if c]}, got "
                             f"{combiner!r}")
        super().__init__(embedding_size, combiner=combiner, **kwargs)
        self.nslots, self.slot_map_fn = nslots, slot_map_fn

    def call(self, inputs, training=None):
        ids = _dense_ids(inputs, self)
        if ids.shape.rank not in (1, 2):
            raise ValueError(f"FieldWiseEmbedding takes ids of shape (batch,) or (batch, n), "
                             f"got {ids.shape}")
        if ids.shape.rank == 1:
            ids = ids[:, None]
        batch = tf.shape(ids, out_type=tf.int64)[0]
        slots = tf.cast(self.slot_map_fn(ids), tf.int64)
        tf.debugging.assert_equal(tf.shape(slots), tf.shape(ids),
                                  message="slot_map_fn must keep the shape of the ids")
        tf.debugging.assert_non_negative(slots, message="slot_map_fn gave a field < 0")
        tf.debugging.assert_less(slots, tf.constant(self.nslots, tf.int64),
                                 message="slot_map_fn gave a field >= nslots")
        segments = tf.range(batch)[:, None] * self.nslots + slots
        rows = self._rows(tf.reshape(ids, [-1]), training)              # (batch * n, dim)
        out = self._segment_combine(rows, tf.reshape(segments, [-1]), batch * self.nslots)
        out = tf.reshape(out, tf.stack([batch, self.nslots, self.embedding_size]))
        out.set_shape([inputs.shape[0] if inputs.shape.rank else None, self.nslots,
                       self.embedding_size])
        return out

    def compute_output_shape(self, input_shape):
        return (tuple(input_shape)[0], self.nslots, self.embedding_size)


    def get_config(self):
        return dict(super().get_config(), nslots=self.nslots,
                    slot_map_fn=keras.saving.serialize_keras_object(self.slot_map_fn))


@keras.saving.register_keras_serializable(package="tf_bridge")
class HvdAllToAllEmbedding(Embedding):
    """TFRA's ``HvdAllToAllEmbedding``: ``Embedding(distributed=True)``, each id's row on
    rank ``id mod size`` of :mod:`tf_bridge.distributed`, ids and rows exchanged
    all-to-all.  ``mpi_size``, if given, must be the world size; ``with_secondary_unique``
    and ``batch_size`` are accepted (the exchange always sends each distinct id once)."""

    def __init__(self, with_unique=True, with_secondary_unique=True, mpi_size=None,
                 batch_size=None, *args, **kwargs):
        from . import distributed as hvd
        if mpi_size is not None and mpi_size != hvd.size():
            raise ValueError(f"mpi_size is {mpi_size} but the world has {hvd.size()} ranks")
        kwargs.pop("distributed", None)
        super().__init__(*args, with_unique=with_unique, distributed=True, **kwargs)
