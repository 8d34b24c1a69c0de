"""SOK's layer names over numbaemb tables (``de.sok``).

``All2AllDenseEmbedding`` places each id's row on rank ``id mod size`` (the
ranks of :mod:`tf_bridge.distributed`) and moves ids and rows all-to-all, as
SOK's layer does between GPUs; with one process it is a local table.

>>> import tensorflow as tf, tf_bridge as de
>>> layer = de.sok.All2AllDenseEmbedding(100, 4, slot_num=2, nnz_per_slot=3)
>>> layer(tf.zeros([5, 2, 3], tf.int64)).shape
TensorShape([5, 2, 3, 4])
"""
import keras
import numpy as np
import tensorflow as tf

from . import distributed as hvd
from .keras_layers import Embedding

__all__ = ["All2AllDenseEmbedding"]

_STRING_INITIALIZERS = {
    "random_uniform": lambda: keras.initializers.RandomUniform(-0.05, 0.05),
    "random_normal": lambda: keras.initializers.RandomNormal(stddev=0.05),
    "zeros": keras.initializers.Zeros, "ones": keras.initializers.Ones,
}


def _positive(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _initializer(init):
    if init is None:
        init = "random_uniform"
    if isinstance(init, str):
        if init not in _STRING_INITIALIZERS:
            raise ValueError(f"embedding_initializer must be one of "
                             f"{sorted(_STRING_INITIALIZERS)} or a Keras initializer, got {init!r}")
        return _STRING_INITIALIZERS[init]()
    return init


@keras.saving.register_keras_serializable(package="tf_bridge")
class All2AllDenseEmbedding(Embedding):
    """SOK's ``All2AllDenseEmbedding``: ids to rows, each id's row on rank ``id mod size``.

    Args:
      max_vocabulary_size_per_gpu: the keys each rank may hold.  It is a hard limit:
        an optimizer step that would insert past it on any rank raises ValueError on
        every rank and applies nothing (no eviction yet).
      embedding_vec_size: row width.
      slot_num, nnz_per_slot: inputs are ``[batch, slot_num, nnz_per_slot]`` ids.
      dynamic_input: inputs are ``[None]`` ids (e.g. from ``tf.unique``) instead.
      use_hashtable: False: ids are row numbers and must lie in
        ``[0, max_vocabulary_size_per_gpu * size)``; others raise ValueError (on
        every rank).  Rows still live in a hash table (only touched rows use memory).
      key_dtype: ``tf.int64`` (default) or ``tf.int32``.
      embedding_initializer: ``"random_uniform"`` (default: uniform in [-0.05, 0.05]),
        ``"random_normal"``, ``"zeros"``, ``"ones"`` or a Keras initializer whose rows
        depend on the key only (seeded random, constant).

    ``call(inputs)`` gives ``[batch, slot_num, nnz_per_slot, embedding_vec_size]``
    (``[None, embedding_vec_size]`` with ``dynamic_input``).  Train it with
    ``de.DynamicEmbeddingOptimizer`` (and ``hvd.DistributedGradientTape`` or
    ``hvd.DistributedOptimizer`` under mpiexec).
    """

    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num=1,
                 nnz_per_slot=1, dynamic_input=False, use_hashtable=True, key_dtype=None,
                 embedding_initializer=None, name=None, **kwargs):
        self.max_vocabulary_size_per_gpu = _positive(max_vocabulary_size_per_gpu,
                                                     "max_vocabulary_size_per_gpu")
        self.slot_num = _positive(slot_num, "slot_num")
        self.nnz_per_slot = _positive(nnz_per_slot, "nnz_per_slot")
        self.dynamic_input = bool(dynamic_input)
        self.use_hashtable = bool(use_hashtable)
        self._sok_initializer = embedding_initializer
        for k in ("distributed", "initializer", "combiner", "embedding_size"):
            kwargs.pop(k, None)          # from_config: set by this layer itself
        super().__init__(_positive(embedding_vec_size, "embedding_vec_size"),
                         key_dtype=tf.int64 if key_dtype is None else key_dtype,
                         initializer=_initializer(embedding_initializer), name=name,
                         distributed=True, **kwargs)
        world = hvd.size()
        self.params.max_keys = self.max_vocabulary_size_per_gpu
        if not self.use_hashtable:
            self.params.key_range = (0, self.max_vocabulary_size_per_gpu * world)

    @property
    def embedding_vec_size(self):
        return self.embedding_size

    def call(self, inputs, training=None):
        ids = tf.convert_to_tensor(inputs)
        want = [None] if self.dynamic_input else [None, self.slot_num, self.nnz_per_slot]
        if not ids.shape.is_compatible_with(want):
            raise ValueError(f"inputs must have shape {want} "
                             f"({'dynamic_input' if self.dynamic_input else '[batch, slot_num, nnz_per_slot]'}), "
                             f"got {ids.shape}")
        return super().call(ids, training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.embedding_size,)

    def get_config(self):
        config = super().get_config()
        init = self._sok_initializer
        config.update(
            max_vocabulary_size_per_gpu=self.max_vocabulary_size_per_gpu,
            embedding_vec_size=self.embedding_size, slot_num=self.slot_num,
            nnz_per_slot=self.nnz_per_slot, dynamic_input=self.dynamic_input,
            use_hashtable=self.use_hashtable,
            embedding_initializer=init if init is None or isinstance(init, str)
            else keras.initializers.serialize(init))
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        init = config.get("embedding_initializer")
        if isinstance(init, dict):
            config["embedding_initializer"] = keras.initializers.deserialize(init)
        return cls(**config)
