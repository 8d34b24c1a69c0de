"""Keras 3 ``Embedding`` layer over a dynamic table (``de.keras.layers.Embedding``).

Ids of any shape ``(B, ..., L)`` (int64 / int32, no vocabulary size) give
``(B, ..., L, dim)`` rows, or with a ``combiner`` ("sum", "mean", "sqrtn") the
last id axis reduced: ``(B, ..., dim)``.  ``tf.SparseTensor`` and
``tf.RaggedTensor`` ids (e.g. ``keras.Input((None,), sparse=True)`` or
``ragged=True``) give one combined vector per row, ``(B, dim)``, with
``de.embedding_lookup_sparse``'s math (weights 1; a row without ids gives
zeros; negative ids are keys like any other, nothing is pruned); ragged ids
without a combiner give ragged rows ``(B, None, dim)``.  Lookups never insert;
the optimizer step does.  Train it with ``de.DynamicEmbeddingOptimizer``:

    inp = tf.keras.Input((3,), dtype="int64")
    x = de.keras.layers.Embedding(16, name="item")(inp)                 # (B, 3, 16)
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(x)))
    model.compile(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3)), "mse")
    model.fit(ds, epochs=2)

The layer's only Keras weight is a ``(1, dim)`` handle: Keras differentiates
it, and its gradient is ``tf.IndexedSlices(rows (u, dim), keys (u,))`` that the
wrapper applies to the table (``layer.params``, a ``de.Variable``).  A plain
Keras optimizer cannot apply that: it raises a TypeError at the first training
step instead of silently not training.

>>> import tensorflow as tf, tf_bridge as de
>>> layer = de.keras.layers.Embedding(4, combiner="mean", name="doc_emb")
>>> layer(tf.constant([[1, 2, 3], [4, 5, 6]], tf.int64)).shape
TensorShape([2, 4])
>>> int(layer.params.size())                      # lookups do not insert
0
>>> layer(tf.ragged.constant([[1, 2, 3], [], [-4]], tf.int64)).shape    # one vector per row
TensorShape([3, 4])
"""
import weakref

import keras
import numpy as np
import tensorflow as tf

from . import mode
from .checkpoint import KerasTableSaving
from .lookup import unique_lookup
from .restrict import FrequencyRestrictPolicy, TimestampRestrictPolicy
from .variable import DynamicHandle, Variable, owner_of, unwrapped_optimizer_error

__all__ = ["Embedding"]

COMBINERS = (None, "sum", "mean", "sqrtn")
_POLICIES = {c.__name__: c for c in (TimestampRestrictPolicy, FrequencyRestrictPolicy)}


class _Handle(DynamicHandle, keras.Variable):
    """The layer's ``(1, dim)`` trainable weight.  A plain Keras optimizer reads
    ``overwrite_with_gradient`` of each variable before updating: this one raises
    (:class:`tf_bridge.variable.DynamicHandle`, as ``de.Variable.trainable_handle``)."""

    def _unwrapped_error(self):
        owner = owner_of(self)
        return unwrapped_optimizer_error(
            f"weight {self.path!r} of de.keras.layers.Embedding (table "
            f"{getattr(owner, 'name', '?')!r})", how=" in model.compile(optimizer=..., ...)")


@keras.saving.register_keras_serializable(package="tf_bridge")
class Embedding(KerasTableSaving, keras.layers.Layer):
    """Dynamic embedding layer (TFRA's ``de.keras.layers.Embedding``).

    Saving: ``tf.train.Checkpoint(model=...)`` and ``model.save("m.keras")`` /
    ``keras.models.load_model`` keep the table (keys, rows, optimizer slots,
    policy scores; :class:`tf_bridge.checkpoint.KerasTableSaving`);
    ``de.export_for_serving(model, path)`` writes a TF-only SavedModel.

    Args:
      embedding_size: row width ``dim``.
      key_dtype: ``tf.int64`` (default), ``tf.int32`` or ``tf.string`` (string ids,
        e.g. raw feature values; see ``de.Variable``).
      value_dtype: ``tf.float32`` (default) or ``tf.float64``.
      combiner: None (default: ``ids.shape + [dim]``) or "sum" / "mean" / "sqrtn" over
        the last id axis (``ids.shape[:-1] + [dim]``); needed for ``tf.SparseTensor`` ids.
      initializer: value of ids never trained (see ``de.Variable``); default
        ``RandomNormal(stddev=0.05)``, seeded by the layer's name.
      devices: one shard per entry (host memory).
      name: layer name; the table is ``layer.params``, named ``<name>-parameter``.
      with_unique: outside training, find the batch's distinct ids first, look each
        up once and spread the rows (one Numba pass).  Default False: every position
        is looked up directly, which measured faster (``predict`` on the training
        benchmark's job: 8.0M against 6.5M ids/s, 2-core VM).  Training always
        finds the distinct ids (the gradient is summed per id).
      restrict_policy, bp_v2, init_size, num_shards, partitioner, seed, max_capacity,
      evict, evict_window, admit, steps_to_live: as ``de.Variable`` (``admit`` may also be the dict
      of ``numbaemb.admission.config_of``, as the layer's config holds it; its counts
      travel with the table's checkpoints)
        (``init_capacity``: TFRA's name for ``init_size``).
      max_norm: clip each looked-up row's L2 norm.
      distributed: split the table across the MPI ranks of ``tf_bridge.distributed``
        (each id's row on rank ``id mod size``); lookups and optimizer steps exchange
        ids and rows with the owners.  See ``de.Variable``.
      **kwargs: Keras layer arguments (``trainable``, ...).
    """

    def __init__(self, embedding_size, key_dtype=tf.int64, value_dtype=tf.float32,
                 combiner=None, initializer=None, devices=None, name=None, with_unique=False, *,
                 restrict_policy=None, bp_v2=False, init_size=0, num_shards=None,
                 partitioner=None, seed=None, max_norm=None, distributed=False,
                 init_capacity=None, max_capacity=None, evict="lru", admit=None,
                 steps_to_live=None, evict_window=None, **kwargs):
        if init_capacity is not None:        # TFRA's name for init_size
            if init_size:
                raise ValueError("pass init_size or init_capacity (TFRA's name), not both")
            init_size = init_capacity
        if isinstance(embedding_size, (bool, np.bool_)) or not isinstance(
                embedding_size, (int, np.integer)):
            raise TypeError(f"embedding_size must be an int, got {type(embedding_size).__name__}")
        if embedding_size < 1:
            raise ValueError(f"embedding_size must be >= 1, got {embedding_size}")
        if combiner not in COMBINERS:
            raise ValueError(f"combiner must be one of {COMBINERS}, got {combiner!r}")
        if isinstance(restrict_policy, str):
            restrict_policy = _POLICIES[restrict_policy]
        value_dtype = tf.as_dtype(value_dtype)
        super().__init__(name=name, dtype=value_dtype.name, **kwargs)
        self.embedding_size = int(embedding_size)
        self.combiner = combiner
        self.with_unique = bool(with_unique)
        self.max_norm = max_norm
        if initializer is None:
            initializer = keras.initializers.RandomNormal(stddev=0.05)
        self._initializer_arg = initializer
        self.params = Variable(key_dtype, value_dtype, self.embedding_size, devices=devices,
                               partitioner=partitioner, name=f"{self.name}-parameter",
                               initializer=initializer, trainable=self.trainable,
                               init_size=init_size, restrict_policy=restrict_policy,
                               bp_v2=bp_v2, num_shards=num_shards, seed=seed,
                               distributed=distributed, max_capacity=max_capacity,
                               evict=evict, admit=_admit_filter(admit), steps_to_live=steps_to_live,
                               evict_window=evict_window)
        self.distributed = bool(distributed)
        self.supports_jit = False        # tf.numpy_function cannot be XLA-compiled

    def build(self, input_shape=None):
        with keras.name_scope(self.name, caller=self):
            self.handle = _Handle(initializer="zeros", shape=(1, self.embedding_size),
                                  dtype=self.params.value_dtype.name, trainable=self.trainable,
                                  name="handle")
        self.handle._de_owner = weakref.ref(self.params)      # de.owner_of(handle) -> params
        self.built = True

    def call(self, inputs, training=None):
        if isinstance(inputs, tf.SparseTensor):
            return self._call_sparse(inputs, training)
        if isinstance(inputs, tf.RaggedTensor):
            return self._call_ragged(inputs, training)
        return self._finish_rows(self._rows(self._dense_ids(inputs), training), clipped=True)

    def _dense_ids(self, inputs, name="inputs"):
        """Dense int (or string) ids checked for this layer's table and combiner."""
        ids = self.params.keys_in(inputs, name)
        if self.combiner is not None and ids.shape.rank == 0:
            raise ValueError(f"combiner {self.combiner!r} needs ids of rank >= 1, got a scalar")
        return ids

    def _finish_rows(self, emb, clipped=False):
        """The layer's output from the rows of dense ids: ``max_norm`` (unless
        ``clipped``), then the combiner."""
        if not clipped and self.max_norm is not None:
            emb = tf.clip_by_norm(emb, self.max_norm, axes=[-1])
        return self._combine(emb)

    def _rows(self, ids, training):
        """Rows ``ids.shape + [dim]`` of int ids (any shape), ``max_norm`` applied;
        differentiable (through ``self.handle``) when training.  Training, and
        inference with ``with_unique``, use one ``tf.numpy_function`` that finds the
        batch's distinct ids, looks each up once and spreads the rows
        (:func:`tf_bridge.lookup.unique_lookup`); otherwise every position is looked
        up directly."""
        if training is not False and mode.is_training() and self.trainable:
            emb = unique_lookup(self.params, ids, tf.convert_to_tensor(self.handle))
        elif self.with_unique:
            emb = unique_lookup(self.params, ids)
        else:
            emb = self.params._lookup(ids, False, record=False)
        if self.max_norm is not None:
            emb = tf.clip_by_norm(emb, self.max_norm, axes=[-1])
        return emb

    # ---- tf.SparseTensor / tf.RaggedTensor ids: combine each row's ids ----------------------
    # The math of de.embedding_lookup_sparse with weights 1 (tf.nn's): sum, mean = sum / n,
    # sqrtn = sum / sqrt(n) over the ids of a row; a row without ids gives zeros (as
    # safe_embedding_lookup_sparse with default_id=None).  Every id is a key, negative ones
    # included: nothing is pruned.
    def _call_sparse(self, sp, training):
        if self.combiner is None:
            raise ValueError("a tf.SparseTensor input needs a combiner: create the layer with "
                             "combiner='sum', 'mean' or 'sqrtn' (each row's ids are combined "
                             "into one vector), or pass dense or ragged ids")
        rank = sp.shape.rank
        if rank is not None and rank < 2:
            raise ValueError(f"a tf.SparseTensor input must have rank >= 2 (rows, ids), got "
                             f"shape {sp.shape}")
        rows = self._rows(self.params.keys_in(sp.values, "inputs"), training)           # (nnz, dim)
        outer = sp.dense_shape[:-1]                           # one output row per index prefix
        strides = tf.math.cumprod(outer, exclusive=True, reverse=True)
        segments = tf.reduce_sum(sp.indices[:, :-1] * strides, axis=1)
        out = self._segment_combine(rows, segments, tf.reduce_prod(outer))
        out = tf.reshape(out, tf.concat([outer, [self.embedding_size]], 0))
        if rank is not None:
            out.set_shape(sp.shape[:-1].concatenate([self.embedding_size]))
        return out

    def _call_ragged(self, rt, training):
        rows = self._rows(self.params.keys_in(rt.flat_values, "inputs"), training)
        if self.combiner is None:                        # ragged rows: (B, None, ..., dim)
            return rt.with_flat_values(rows)
        if rt.flat_values.shape.rank != 1:               # the ids axis is uniform: dense math
            return rt.with_flat_values(self._combine(rows))

        def reduce(r):                                   # the innermost (ragged) axis
            if isinstance(r.values, tf.RaggedTensor):
                return r.with_values(reduce(r.values))
            return self._segment_combine(rows, r.value_rowids(), r.nrows())

        out = reduce(rt)
        if rt.ragged_rank == 1:
            out.set_shape([rt.shape[0], self.embedding_size])
        return out

    def _segment_combine(self, rows, segments, n):
        """``rows`` (nnz, dim) combined per segment id into (n, dim); empty segments: 0."""
        total = tf.math.unsorted_segment_sum(rows, segments, n)
        if self.combiner == "sum":
            return total
        count = tf.math.unsorted_segment_sum(tf.ones_like(segments, rows.dtype), segments, n)
        count = count[:, None]
        return tf.math.divide_no_nan(total, count if self.combiner == "mean" else tf.sqrt(count))

    def _combine(self, emb):
        if self.combiner is None:
            return emb
        if self.combiner == "mean":
            return tf.reduce_mean(emb, axis=-2)
        total = tf.reduce_sum(emb, axis=-2)
        if self.combiner == "sqrtn":
            n = tf.cast(tf.shape(emb)[-2], emb.dtype)
            total = total / tf.sqrt(tf.maximum(n, 1))
        return total

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape)
        if self.combiner is not None:
            shape = shape[:-1]
        return shape + (self.embedding_size,)

    def compute_output_spec(self, inputs, *args, **kwargs):
        """Symbolic (Keras functional) output: dense, or ragged for ragged ids that keep a
        ragged axis (no combiner, or rank > 2)."""
        if getattr(inputs, "sparse", False) and self.combiner is None:
            raise ValueError(f"layer {self.name!r}: a sparse input needs a combiner ('sum', "
                             "'mean' or 'sqrtn')")
        shape = self.compute_output_shape(inputs.shape)
        ragged = bool(getattr(inputs, "ragged", False)) and (
            self.combiner is None or len(inputs.shape) > 2)
        return keras.KerasTensor(shape, dtype=self.compute_dtype, ragged=ragged)

    def get_config(self):
        init = self._initializer_arg
        policy = self.params.restrict_policy
        config = super().get_config()
        config.pop("dtype", None)
        config.update(
            embedding_size=self.embedding_size, key_dtype=self.params.key_dtype.name,
            value_dtype=self.params.value_dtype.name, combiner=self.combiner,
            initializer=keras.initializers.serialize(init)
            if isinstance(init, keras.initializers.Initializer) else None,
            with_unique=self.with_unique, max_norm=self.max_norm, bp_v2=self.params.bp_v2,
            distributed=self.distributed,
            num_shards=self.params.table.num_shards,
            max_capacity=self.params.table.max_capacity, evict=self.params.table.evict,
            evict_window=self.params.table.evict_window
            if self.params.table.max_capacity is not None else None,
            steps_to_live=getattr(self.params.table, "steps_to_live", None),
            admit=_admit_config(getattr(self.params.table, "admit", None)),
            restrict_policy=None if policy is None else type(policy).__name__)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("initializer") is not None:
            config["initializer"] = keras.initializers.deserialize(config["initializer"])
        return cls(**config)


def _admit_config(f):
    if f is None:
        return None
    from numbaemb.admission import config_of
    return config_of(f)


def _admit_filter(admit):
    """``admit`` as given, or the filter of a layer config's dict."""
    if isinstance(admit, dict):
        from numbaemb.admission import from_config
        return from_config(admit)
    return admit
