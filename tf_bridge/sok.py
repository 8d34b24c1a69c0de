"""SOK's names over numbaemb tables (``from tf_bridge import sok``, or ``de.sok``).

``All2AllDenseEmbedding`` places each id's row on rank ``id mod size`` (the
ranks of :mod:`tf_bridge.distributed`) and moves ids and rows all-to-all, as
SOK's layer does between GPUs; with one process it is a local table.

``DynamicVariable``, ``export``, ``assign``, ``OptimizerWrapper``, ``lookup_sparse``
and ``init`` are SOK's dynamic-variable API (``import sparse_operation_kit as sok``
becomes ``from tf_bridge import sok``); ``tf.nn.embedding_lookup(v, ids)`` works on a
``DynamicVariable`` (see :mod:`tf_bridge.tf_nn`)::

    v = sok.DynamicVariable(dimension=3, initializer="13")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))   # inserts absent ids
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(1.0))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))     # rows of ids: 12

>>> import tensorflow as tf, tf_bridge as de
>>> layer = de.sok.All2AllDenseEmbedding(100, 4, slot_num=2, nnz_per_slot=3)
>>> layer(tf.zeros([5, 2, 3], tf.int64)).shape
TensorShape([5, 2, 3, 4])
"""
import itertools
import zlib

import keras
import numpy as np
import tensorflow as tf

from numbaemb import initializers as ne_init
from numbaemb.admission import RandomFilter

from . import distributed as hvd
from ._args import int_at_least
from .keras_layers import Embedding
from .lookup import embedding_lookup_sparse_many
from .optimizer import DynamicEmbeddingOptimizer
from .variable import Variable

__all__ = ["All2AllDenseEmbedding", "DynamicVariable", "export", "assign", "OptimizerWrapper",
           "lookup_sparse", "init"]

_STRING_INITIALIZERS = {
    "random_uniform": lambda: keras.initializers.RandomUniform(-0.05, 0.05),
    "random_normal": lambda: keras.initializers.RandomNormal(stddev=0.05),
    "zeros": keras.initializers.Zeros, "ones": keras.initializers.Ones,
}


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
        self.max_vocabulary_size_per_gpu = int_at_least(max_vocabulary_size_per_gpu,
                                                     "max_vocabulary_size_per_gpu")
        self.slot_num = int_at_least(slot_num, "slot_num")
        self.nnz_per_slot = int_at_least(nnz_per_slot, "nnz_per_slot")
        self.dynamic_input = bool(dynamic_input)
        self.use_hashtable = bool(use_hashtable)
        self._sok_initializer = embedding_initializer
        for k in ("distributed", "initializer", "combiner", "embedding_size"):
            kwargs.pop(k, None)          # from_config: set by this layer itself
        super().__init__(int_at_least(embedding_vec_size, "embedding_vec_size"),
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


# ---- SOK's dynamic variable API --------------------------------------------------------------
_NAMES = itertools.count()


def _variable_initializer(init):
    """SOK's forms: ``"random"`` (uniform in [-0.05, 0.05], per key), a float or the string
    of one (a constant), or a Keras / TF initializer."""
    if init is None or (isinstance(init, str) and init == "random"):
        return ne_init.RandomUniform(-0.05, 0.05)
    if isinstance(init, str):
        try:
            return float(init)
        except ValueError:
            raise ValueError(f"initializer must be 'random', the string of a float, or an "
                             f"initializer, got {init!r}") from None
    return init


# HKV's eviction strategies (SOK's ``evict_strategy``) and its settings that place a table
# in GPU memory (accepted, without effect on a host table)
_HKV_EVICT = {"kLru": "lru", "kLfu": "lfu", "kEpochLru": "epoch_lru", "kEpochLfu": "epoch_lfu"}
_HKV_PLACEMENT = ("max_hbm_for_vectors", "max_bucket_size", "max_load_factor", "block_size",
                  "io_block_size", "device_id", "io_by_cpu")


def _hkv_bound(var_type, max_capacity, evict_strategy, kwargs, name):
    """``Variable``'s bounding arguments for SOK's settings (``{}``: not bounded); drops
    HKV's placement settings from ``kwargs``.  As in SOK, the HKV settings are read for
    ``"hybrid"`` only (DET ignores them); unlike SOK's HKV table, whose default bound is
    2**26 keys, a ``"hybrid"`` table without ``max_capacity`` grows.  ``filter_ratio``
    below 1 admits new ids by :class:`numbaemb.admission.RandomFilter`, seeded by the
    variable's ``name``."""
    for k in _HKV_PLACEMENT:
        kwargs.pop(k, None)
    ratio = kwargs.pop("filter_ratio", 1.0)
    strategy = "kLru" if evict_strategy is None else evict_strategy
    if strategy == "kCustomized":
        raise NotImplementedError("evict_strategy='kCustomized' needs scores with every "
                                  "insert, which SOK's lookups do not take")
    if strategy not in _HKV_EVICT:
        raise ValueError(f"evict_strategy must be one of {sorted(_HKV_EVICT)}, got "
                         f"{evict_strategy!r}")
    if var_type != "hybrid":
        return {}
    out = dict(max_capacity=max_capacity, evict=_HKV_EVICT[strategy]) if max_capacity else {}
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.integer, np.floating)) \
            or not 0.0 < float(ratio) <= 1.0:
        raise ValueError(f"filter_ratio must be a probability in (0, 1], got {ratio!r}")
    if ratio < 1.0:             # HKV admits a new id with probability filter_ratio
        if kwargs.get("admit") is not None:
            raise ValueError("pass filter_ratio or admit, not both")
        out["admit"] = RandomFilter(float(ratio), seed=zlib.crc32(name.encode()))
    return out


class DynamicVariable(Variable):
    """SOK's ``sok.DynamicVariable``: a dynamic table ``key -> row of dimension values``.

    Args:
      dimension: row width.  initializer: ``"random"`` (default: uniform in
        [-0.05, 0.05], a function of the key), a float or its string (``"13"``), or a
        Keras / TF initializer.
      var_type: ``"hbm"`` (default: SOK's DET table) or ``"hybrid"`` (SOK's
        HierarchicalKV table); both keep the table in host memory (tf_bridge tables are
        host tables; numbaemb's GPU tables are not wired to TF yet).
      key_type: ``tf.int64`` (default) or ``tf.int32``; dtype: ``tf.float32`` (default)
        or ``tf.float64``.  init_capacity: keys to make room for up front.
      max_capacity: 0 (unbounded) or the most keys the table (distributed: each rank)
        may hold.  ``"hbm"``: a hard limit, an optimizer step or lookup that would
        insert past it raises ``ValueError`` and inserts nothing.  ``"hybrid"``: as
        HierarchicalKV, a bounded table that evicts: an id inserted into a full table
        takes the row of the lowest-scored key of its window (or, scoring lower
        itself, gets no row), see :mod:`numbaemb.bounded`.
      evict_strategy: ``"hybrid"`` with ``max_capacity`` only: HKV's ``"kLru"``
        (default), ``"kLfu"``, ``"kEpochLru"`` or ``"kEpochLfu"`` (the epoch is the
        last optimizer step unless ``v.table.set_epoch(n)``).
      HKV's other settings (``max_hbm_for_vectors``, ``max_bucket_size``,
        ``max_load_factor``, ``block_size``, ``io_block_size``, ``device_id``,
        ``io_by_cpu``) place an HKV table in GPU memory: accepted, without effect on a
        host table.  filter_ratio: ``"hybrid"`` only, HKV's random admission: a new id
        gets a row with probability ``filter_ratio`` at each insert
        (:class:`numbaemb.admission.RandomFilter`, seeded by the name; default 1: all);
        ``admit=`` takes numbaemb's counter and Bloom filters instead.  name: default
        ``sok_dynamic_variable_<n>``.
      mode: None or ``"distributed"``: under mpiexec (after ``sok.init()``) the keys are
        split across the ranks (``id mod size``), as SOK's; with one process a local
        table.

    As in SOK, a training-mode lookup (``tf.nn.embedding_lookup(v, ids)`` under a
    tape, in ``de.ModelMode.TRAIN``) inserts the absent ids with their initial rows.
    ``shape`` is ``TensorShape([None, dimension])``; ``size`` (a property, as SOK's) the
    number of keys as an int64 scalar tensor.

    >>> v = DynamicVariable(dimension=3, initializer="13")
    >>> v.shape, int(v.size)
    (TensorShape([None, 3]), 0)
    """

    def __init__(self, dimension, initializer=None, var_type=None, name=None, constraint=None,
                 trainable=True, key_type=None, dtype=None, mode=None, init_capacity=0,
                 max_capacity=0, evict_strategy=None, **kwargs):
        var_type = "hbm" if var_type is None else var_type
        if var_type not in ("hbm", "hybrid"):
            raise ValueError(f"var_type must be 'hbm' or 'hybrid', got {var_type!r}")
        if constraint is not None:
            raise NotImplementedError("constraint is not supported on a DynamicVariable")
        if mode not in (None, "distributed"):
            raise NotImplementedError(f"mode must be None or 'distributed', got {mode!r} "
                                      "(localized tables are not supported)")
        init_capacity = int_at_least(init_capacity, "init_capacity", minimum=0)
        max_capacity = int_at_least(max_capacity, "max_capacity", minimum=0)
        name = name or f"sok_dynamic_variable_{next(_NAMES)}"
        bounded = _hkv_bound(var_type, max_capacity, evict_strategy, kwargs, name)
        self.var_type = var_type
        super().__init__(key_dtype=tf.int64 if key_type is None else key_type,
                         value_dtype=tf.float32 if dtype is None else dtype,
                         dim=int_at_least(dimension, "dimension"),
                         name=name,
                         initializer=_variable_initializer(initializer), trainable=trainable,
                         init_size=init_capacity, distributed=hvd.size() > 1, **bounded,
                         **kwargs)
        if max_capacity and "max_capacity" not in bounded:
            self.max_keys = max_capacity       # "hbm": a hard limit (per rank when split)

    shape = property(lambda self: tf.TensorShape([None, self.dim]))
    dimension = property(lambda self: self.dim)
    key_type = property(lambda self: self.key_dtype)

    @property
    def size(self):
        """Number of keys (int64 scalar tensor; distributed: on every rank, collective)."""
        return Variable.size(self)

    _rows_per_position = False        # training lookups insert their distinct keys

    def _np_lookup(self, keys, return_exists, record, out=None):
        """Training lookups (``record``) insert the absent keys with their initial rows."""
        if not record:
            return super()._np_lookup(keys, return_exists, record, out)
        self.table._check_room(keys, "this lookup (max_capacity)")   # keys: distinct here
        if self._pending is None:                  # rows are a function of the key
            rows = self.table.find_or_insert(keys, **({} if out is None else {"out": out}))
        else:                                      # a callable initializer: draw, then keep
            rows = super()._np_lookup(keys, False, True)[0]
            self.insert_initial_values(keys)
        rows = rows.reshape(tuple(keys.shape) + (self.dim,))
        return (rows, np.ones(keys.shape, np.bool_)) if return_exists else (rows,)


def export(var):
    """``(indices, values)`` tensors of every key of ``var`` (distributed: this rank's)."""
    if not isinstance(var, Variable):
        raise TypeError(f"var must be a sok.DynamicVariable, got {type(var).__name__}")
    return var.export()


def assign(var, indices, values):
    """Write ``values`` (n, dimension) for ``indices`` (n,) into ``var``; returns ``var``."""
    if not isinstance(var, Variable):
        raise TypeError(f"var must be a sok.DynamicVariable, got {type(var).__name__}")
    var.upsert(indices, values)
    return var


def OptimizerWrapper(optimizer):  # noqa: N802  (SOK's name)
    """SOK's wrapper: a Keras optimizer that also updates dynamic variables (it is
    ``de.DynamicEmbeddingOptimizer``)."""
    return DynamicEmbeddingOptimizer(optimizer)


def lookup_sparse(params, sp_ids, sp_weights=None, combiners=None):
    """SOK's ``lookup_sparse``: for each variable of ``params`` its ``sp_ids``
    (``tf.SparseTensor`` / ``tf.RaggedTensor`` ``[batch, None]``) combined per row by
    ``combiners`` ("sum", "mean"; default "sum"), ``[batch, dimension]`` each.  A single
    variable (not a list) gives a single tensor.  As SOK's, one op looks every
    variable's ids up (:func:`tf_bridge.lookup.embedding_lookup_sparse_many`)."""
    single = not isinstance(params, (list, tuple))
    params, sp_ids = ([params], [sp_ids]) if single else (list(params), list(sp_ids))
    if len(sp_ids) != len(params):
        raise ValueError(f"sp_ids must have one entry per variable ({len(params)}), got "
                         f"{len(sp_ids)}")
    weights = [None] * len(params) if sp_weights is None else (
        [sp_weights] if single else list(sp_weights))
    combiners = ["sum"] * len(params) if combiners is None else (
        [combiners] if isinstance(combiners, str) else list(combiners))
    if len(weights) != len(params) or len(combiners) != len(params):
        raise ValueError("sp_weights and combiners must have one entry per variable")
    out = embedding_lookup_sparse_many(params, sp_ids, weights, combiners)   # one lookup op
    return out[0] if single else out


def init(comm_tool="horovod", use_legacy_optimizer=None, **kwargs):
    """SOK's ``sok.init``: MPI (:func:`tf_bridge.distributed.init`) when launched under
    mpiexec, else a world of one.  ``comm_tool`` must be "horovod" or "mpi"."""
    if comm_tool not in ("horovod", "mpi"):
        raise ValueError(f"comm_tool must be 'horovod' or 'mpi', got {comm_tool!r}")
    hvd.init()
