"""``Variable``: a numbaemb table with TensorFlow tensors in and out (TFRA's ``de.Variable``).

Every method works eagerly (zero-copy DLPack hand-off) and inside
``tf.function`` (one ``tf.numpy_function`` op).  Keys of any shape; rows come
back as ``keys.shape + [dim]``.

>>> import tensorflow as tf, tf_bridge as de
>>> v = de.Variable(dim=2, name="doc_var")
>>> v.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
>>> v.lookup(tf.constant([[1, 99]], tf.int64)).numpy().tolist()   # 99 absent: not inserted
[[[1.0, 1.0], [0.0, 0.0]]]
>>> int(v.size())
2

Gradients: the variable owns a tiny trainable ``tf.Variable``
(``trainable_handle``, shape ``(1, dim)``, never updated) that
``embedding_lookup`` reads, so the tape watches it.  Because this class has
``_should_act_as_resource_variable``, ``GradientTape.gradient`` swaps the
variable for ``.handle`` (the handle's resource) like any resource variable, so
``tape.gradient(loss, [v])`` gives one ``tf.IndexedSlices`` per variable:
``indices`` the keys (u,), ``values`` their gradient rows (u, dim),
``dense_shape`` None (the key space has no dense shape).  Several lookups of
one variable are concatenated by the tape; keys may repeat across lookups.

Ids: int64 and int32 are accepted for either key dtype (int64 keys into an
int32 table must fit, else ValueError); floats, bools and strings raise
``numbaemb.DtypeError`` (both a TypeError and, as TFRA raises, a ValueError).

Only ``de.DynamicEmbeddingOptimizer`` can apply those gradients.  A plain Keras
optimizer given the variable or its ``trainable_handle`` raises a TypeError
saying so (:class:`DynamicHandle`) before it changes anything:

>>> import keras
>>> with tf.GradientTape() as tape:
...     loss = tf.reduce_sum(de.embedding_lookup(v, tf.constant([1, 2], tf.int64)))
>>> keras.optimizers.SGD().apply_gradients(zip(tape.gradient(loss, [v]), [v]))
... # doctest: +ELLIPSIS
Traceback (most recent call last):
TypeError: de.Variable 'doc_var' cannot be updated by a plain Keras or TF1 optimizer: ...
"""
import inspect
import threading
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.ops.resource_variable_ops import ResourceVariable

import numbaemb
from jit_kernels.segment import unique_inverse
from numbaemb import initializers as ne_init
from numbaemb import DtypeError, _checks
from numbaemb._memory import BufferPool
from numbaemb.string_keys import Packed

from .dlpack import from_tf, numpy_call
from .initializers import translate
from .restrict import make_policy
from .serving_hooks import _SERVING, register_serving

__all__ = ["Variable", "get_variable", "as_ids", "as_string_keys", "owner_of", "DynamicHandle"]


VALUE_DTYPES = tuple(tf.as_dtype(d) for d in _checks.VALUE_DTYPES)   # numbaemb's


def _dtype(dtype, what, allowed):
    try:
        dt = tf.as_dtype(dtype)
    except TypeError:
        dt = None
    if dt not in allowed:
        raise DtypeError(f"{what} must be one of {[a.name for a in allowed]}, got {dtype!r}")
    return dt


def as_ids(ids, name="ids"):
    """``ids`` as an int64 or int32 tensor of any shape; TypeError otherwise."""
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"{name} must be a dense tensor; use embedding_lookup_sparse for "
                        f"{type(ids).__name__}")
    if not isinstance(ids, (tf.Tensor, tf.Variable)):
        arr = np.asarray(ids)
        if arr.dtype.kind not in "iu" and arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
            raise DtypeError(f"{name} must hold int64 or int32 values, got dtype {arr.dtype}")
        ids = tf.constant(arr if arr.dtype in (np.int32, np.int64) else arr.astype(np.int64))
    if ids.dtype not in (tf.int64, tf.int32):
        raise DtypeError(f"{name} must be an int64 or int32 tensor, got {ids.dtype.name}")
    return ids


def as_string_keys(keys, name="keys"):
    """``keys`` as a ``tf.string`` tensor of any shape (a string-key table's keys: a
    string tensor, or ``bytes`` / ``str`` values); TypeError otherwise."""
    if isinstance(keys, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"{name} must be a dense tensor; use embedding_lookup_sparse for "
                        f"{type(keys).__name__}")
    if not isinstance(keys, (tf.Tensor, tf.Variable)):
        arr = np.asarray(keys, dtype=object if isinstance(keys, (list, tuple)) else None)
        if arr.size == 0:
            return tf.constant(np.empty(arr.shape, object), tf.string)
        bad = arr.dtype.kind not in "OSU"
        if not bad:
            try:                    # TF's conversion checks each object (in C)
                keys = tf.constant(arr, tf.string)
            except (TypeError, ValueError):
                bad = True
        if bad:
            raise DtypeError(f"{name} must hold strings (bytes or str) for a string-key table, "
                             f"got {arr.dtype if arr.dtype.kind != 'O' else 'other objects'}")
    if keys.dtype != tf.string:
        raise DtypeError(f"{name} must be a tf.string tensor for a string-key table, got "
                         f"{keys.dtype.name}")
    return keys


def _as_real(values, name, dtype):
    if not isinstance(values, (tf.Tensor, tf.Variable)):
        values = np.asarray(values)
        if not _checks.is_real(values.dtype):
            raise DtypeError(f"{name} must hold real numbers, got dtype {values.dtype}")
    values = tf.convert_to_tensor(values)
    if not (values.dtype.is_floating or values.dtype.is_integer):
        raise DtypeError(f"{name} must be a real tensor ({dtype.name}), got {values.dtype.name}")
    if dtype.is_integer and values.dtype.is_floating:      # no silent truncation
        raise DtypeError(f"{name} must hold integers ({dtype.name} for this table), got "
                         f"{values.dtype.name}")
    if dtype.is_integer and values.dtype.is_integer:       # numbaemb checks the range
        return values
    return tf.cast(values, dtype) if values.dtype != dtype else values


def _check_shape(t, want, name, what):
    if not t.shape.is_compatible_with(want):
        raise ValueError(f"{name} must have shape {what} = {want}, got {t.shape}")


# ---- handles: what the tape differentiates, and what a plain optimizer must refuse -------
_UNWRAPPED = ("{what} cannot be updated by a plain Keras or TF1 optimizer: its gradient is a "
              "tf.IndexedSlices of rows keyed by the ids of a dynamic table, which only "
              "de.DynamicEmbeddingOptimizer can apply (an unwrapped optimizer would fail on it, "
              "or scatter it into the (1, dim) handle and train nothing). Wrap the optimizer in "
              "de.DynamicEmbeddingOptimizer, e.g. "
              "de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3)){how}")


def unwrapped_optimizer_error(what, how=""):
    """The TypeError a plain (unwrapped) optimizer meets on a dynamic variable or handle."""
    return TypeError(_UNWRAPPED.format(what=what, how=how))


class DynamicHandle:
    """Mixin for the ``(1, dim)`` trainable handle of a dynamic table.

    A plain Keras 3 optimizer reads ``overwrite_with_gradient`` of every variable
    after building its slots and before updating anything: here that raises a
    TypeError telling to wrap the optimizer in ``de.DynamicEmbeddingOptimizer``
    (which never asks: it routes the handle's gradient to the table).  Used by
    ``Variable.trainable_handle`` and by ``de.keras.layers.Embedding``'s weight.
    """

    def _unwrapped_error(self):
        owner = owner_of(self)
        return unwrapped_optimizer_error(
            f"the trainable_handle of de.Variable {getattr(owner, 'name', '?')!r}")

    @property
    def overwrite_with_gradient(self):
        raise self._unwrapped_error()

    @overwrite_with_gradient.setter
    def overwrite_with_gradient(self, value):
        if value:
            raise ValueError("overwrite_with_gradient cannot be set on a dynamic embedding handle")


class _TableHandle(DynamicHandle, ResourceVariable):
    """``Variable.trainable_handle``: a ``tf.Variable`` (resource variable) that plain
    Keras optimizers refuse (:class:`DynamicHandle`).

    A plain ``tf.compat.v1.train`` optimizer reads ``constraint`` of the variable just
    before it writes a sparse gradient through the variable's resource (which would
    fail at run time with "Index ... out of range", or worse): here that raises the
    TypeError telling to wrap it.  Nothing else of ours reads it."""

    @property
    def constraint(self):
        raise unwrapped_optimizer_error(
            f"the trainable_handle of de.Variable {getattr(owner_of(self), 'name', '?')!r}",
            " (TF1: de.DynamicEmbeddingOptimizer(tf.compat.v1.train.FtrlOptimizer(...)))")


# each variable's per-step outputs handed to TensorFlow (embeddings, gradient sums) come from
# its own BufferPool: reused once TF has dropped them, so a training step does not fault in a
# fresh 16 MB mapping; one pool a variable, so a model with many tables still reuses them all
_POOLS = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def _pool(params):
    with _POOLS_LOCK:
        pool = _POOLS.get(params)
        if pool is None:
            pool = _POOLS[params] = BufferPool()
        return pool


class Variable(tf.__internal__.tracking.Trackable):
    """A dynamic embedding table ``key -> row of dim values`` (TFRA's signature).

    Args:
      key_dtype: ``tf.int64`` (default), ``tf.int32`` or ``tf.string`` (keys are
        strings, stored under int64 ids: see :mod:`numbaemb.string_keys`; one process).
      value_dtype: ``tf.float32`` (default) or ``tf.float64``; ``tf.int8`` / ``tf.int32`` /
        ``tf.int64`` for tables that are read and written but not trained (id maps,
        counters: lookups are plain reads, optimizers refuse them).
      dim: row width.
      devices: only its length is used (one shard per device); tables live in host memory.
      partitioner: numpy ``f(keys, n) -> shard ids``; default key mod n (unsigned).
      shared_name: unused (TFRA compatibility).
      name: the variable's name; also the default seed of random initializers.
      initializer: None (zeros), a number, an array ``(dim,)``, a Keras/TF initializer
        (see :mod:`tf_bridge.initializers`) or any callable ``f(shape, dtype)``.
      trainable: False makes lookups plain reads (no gradient).
      checkpoint: whether checkpoints save the table.
      init_size: keys to make room for up front (index and rows allocated and their
        pages faulted in at creation: see ``numbaemb.Variable``).
      kv_creator: must be None (no other backends).
      restrict_policy: None or a policy class (``de.TimestampRestrictPolicy``,
        ``de.FrequencyRestrictPolicy``); ``restrict`` then bounds the size.
      bp_v2: optimizer steps add the weight change through ``accum`` (TFRA's bp_v2).
      num_shards, seed: numbaemb options (keyword only).
      max_capacity, evict, evict_window: a bounded table (keyword only): at most
        ``max_capacity`` keys, an insert into a full table (or bucket) evicting the
        lowest-scored key of its bucket (``evict``: "lru", "lfu", "epoch_lru",
        "epoch_lfu"; see :mod:`numbaemb.bounded`; ``evict_window``: "bucket" (default,
        HierarchicalKV's buckets) or a window of slots, see ``numbaemb.Variable``).
        Optimizer steps drop the gradients of ids that were not admitted.
      admit: an admission filter (keyword only; :mod:`numbaemb.admission`).
      steps_to_live: keep each key's last update step (keyword only); :meth:`expire`
        drops the keys no step updated in that many steps.
      distributed: split the keys across the MPI ranks of ``tf_bridge.distributed``
        (keyword only; each id's row on rank ``id mod size``, ``num_shards`` local
        shards on each).  Creating it, lookups, ``size()``, writes and optimizer steps
        are then collective: every rank makes them, in the same order (see
        :mod:`tf_bridge.distributed`); ``export()`` gives this rank's keys.  Needs an
        initializer whose rows depend on the key only (None, a number, an array or a
        seeded Keras random initializer).  A ``restrict_policy``'s updates (made by
        the optimizer step) and ``restrict`` are collective too (each rank keeps its
        share of ``num_reserved``, see :class:`tf_bridge.restrict.RestrictPolicy`).
        With one process it is an ordinary table.

    Checkpoints: the variable is trackable; ``tf.train.Checkpoint(emb=v)`` (or a
    Keras layer / ``tf.Module`` holding it) saves keys, values and every extra
    column (optimizer slots) and restores them into any shard count, see
    :mod:`tf_bridge.checkpoint`.  Created in a TF1 graph, it joins the
    ``SAVEABLE_OBJECTS`` collection: ``tf.compat.v1.train.Saver()`` saves it too.
    SavedModels: use ``tf_bridge.export_for_serving``.
    """

    _should_act_as_resource_variable = True   # tape.gradient(loss, [v]) uses v.handle

    def __init__(self, key_dtype=tf.int64, value_dtype=tf.float32, dim=1, devices=None,
                 partitioner=None, shared_name=None, name="DynamicEmbedding_Variable",
                 initializer=None, trainable=True, checkpoint=True, init_size=0,
                 kv_creator=None, restrict_policy=None, bp_v2=False, *, num_shards=None,
                 seed=None, distributed=False, max_capacity=None, evict="lru", admit=None,
                 steps_to_live=None, evict_window=None):
        if kv_creator is not None:
            raise ValueError("kv_creator must be None: tables are numbaemb shards in host memory")
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        self.key_dtype = _dtype(key_dtype, "key_dtype", (tf.int64, tf.int32, tf.string))
        self.value_dtype = _dtype(value_dtype, "value_dtype", VALUE_DTYPES)
        self.initializer = translate(initializer)
        kernel_init = isinstance(self.initializer, ne_init.Initializer)
        self.devices = list(devices) if devices else ["/CPU:0"]
        self.shared_name = shared_name
        # integer tables (id maps, counters) are read and written, never trained
        self.trainable = bool(trainable) and self.value_dtype.is_floating
        self.checkpoint, self.bp_v2 = bool(checkpoint), bool(bp_v2)
        string = self.key_dtype == tf.string
        opts = dict(key_dtype="string" if string else self.key_dtype.as_numpy_dtype,
                    value_dtype=self.value_dtype.as_numpy_dtype)
        comm = _distributed_comm(distributed, kernel_init, initializer)
        self.table = numbaemb.Variable(
            dim, num_shards=len(self.devices) if num_shards is None else num_shards,
            partitioner=partitioner, name=name, init_size=init_size, seed=seed,
            initializer=self.initializer if kernel_init else None, comm=comm,
            **_bounded_opts(max_capacity, evict, admit, steps_to_live, evict_window), **opts)
        self.distributed = self.table.comm is not None     # split across more than one rank
        # callable initializers: initial rows handed out by training lookups, kept until
        # an optimizer step inserts them (insert_initial_values), so it trains what the loss saw
        self._pending = None if kernel_init else numbaemb.Variable(
            dim, **dict(opts, key_dtype=self.id_dtype.as_numpy_dtype))
        with tf.init_scope():
            self.trainable_handle = _TableHandle(tf.zeros((1, self.dim), self.value_dtype),
                                                 trainable=self.trainable, name=f"{name}_handle")
        self.trainable_handle._de_owner = weakref.ref(self)
        self.restrict_policy = make_policy(restrict_policy, self)   # needs self.table
        if self.checkpoint and not self.distributed and not (tf.executing_eagerly()
                                                             or tf.inside_function()):
            from .checkpoint import saveable      # TF1 graph: tf.compat.v1.train.Saver()
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                           saveable(self))

    # ---- properties ----------------------------------------------------------------
    name = property(lambda self: self.table.name)
    dim = property(lambda self: self.table.dim)
    dtype = property(lambda self: self.value_dtype)
    handle = property(lambda self: self.trainable_handle.handle,
                      doc="The trainable handle's resource: what the tape differentiates.")
    string_keys = property(lambda self: self.key_dtype == tf.string,
                           doc="Whether keys are strings (``key_dtype=tf.string``).")
    grad_dtype = property(lambda self: tf.as_dtype(_checks.compute_dtype(
                              self.value_dtype.as_numpy_dtype)),
                          doc="The dtype of gradients and optimizer math: the value dtype, "
                              "float32 for float16 / bfloat16 tables (rounded once on store).")
    id_dtype = property(lambda self: tf.int64 if self.string_keys else self.key_dtype,
                        doc="The dtype of the ids rows are stored under (gradient "
                            "indices): the key dtype, int64 for string keys.")

    def keys_in(self, keys, name="keys"):
        """``keys`` checked for this table: an int tensor (:func:`as_ids`), or a
        ``tf.string`` tensor for a string-key table (:func:`as_string_keys`)."""
        return as_string_keys(keys, name) if self.string_keys else as_ids(keys, name)

    def ids(self, keys, insert=False, name=None):
        """int64 ids (``keys.shape``) of a string-key table's ``keys``: the ids its rows are
        stored under (gradient indices are ids); an absent string gets the id it would
        be inserted under (``insert`` registers it).  Int tables: ``keys`` themselves."""
        keys = self.keys_in(keys, "keys")
        if not self.string_keys:
            return keys
        out, = numpy_call(lambda *a: (self.table.ids(self._np_keys(*a), insert),),
                          self._key_inputs(keys), [tf.int64], name=name or "string_ids")
        out.set_shape(keys.shape)
        return out

    @property
    def _unique_id(self):
        # What a plain Keras optimizer reads first from each variable (to key its slots):
        # a dynamic variable is not one it can update.
        raise unwrapped_optimizer_error(f"de.Variable {self.name!r}")

    @property
    def trainable_variables(self):
        """``[trainable_handle]`` (or ``[]``): sources for tape.gradient / Keras."""
        return [self.trainable_handle] if self.trainable else []

    def _config(self):
        return dict(self.table.config(), trainable=self.trainable, initializer=self.initializer,
                    key_dtype=self.key_dtype, value_dtype=self.value_dtype, bp_v2=self.bp_v2,
                    restrict_policy=type(self.restrict_policy))

    # ---- reads ---------------------------------------------------------------------
    def lookup(self, keys, return_exists=False, name=None):
        """Rows of ``keys`` (any shape) as ``keys.shape + [dim]``; absent keys get their
        initial value and are not inserted.  With ``return_exists`` also a bool tensor."""
        return self._lookup(self.keys_in(keys, "keys"), return_exists, record=False, name=name)

    def _lookup(self, keys, return_exists, record, name=None):
        serve = getattr(_SERVING, "hook", None)
        if serve is not None:
            return serve(self, keys, return_exists)
        tout = [self.value_dtype, tf.bool] if return_exists else [self.value_dtype]
        out = numpy_call(lambda *arrays: self._np_direct(arrays, return_exists, record),
                         self._key_inputs(keys), tout, name=name, collective=self.distributed)
        register_serving(out[0], lambda table_for, inputs: list(table_for(self).lookup(
            self._keys_of_inputs(inputs), return_exists=return_exists)) if return_exists
            else [table_for(self).lookup(self._keys_of_inputs(inputs))])
        out[0].set_shape(keys.shape.concatenate([self.dim]))
        if return_exists:
            out[1].set_shape(keys.shape)
            return out[0], out[1]
        return out[0]

    # ---- limits (de.sok.All2AllDenseEmbedding sets them): the table's own ------------------
    key_range = property(lambda self: self.table.key_range,
                         lambda self, r: setattr(self.table, "key_range", r),
                         doc="None, or ``(lo, hi)``: ops reject keys outside ``[lo, hi)`` "
                             "with a ValueError (on every rank); see ``numbaemb.Variable``.")
    max_keys = property(lambda self: self.table.max_keys,
                        lambda self, n: setattr(self.table, "max_keys", n),
                        doc="None, or the most keys the table (distributed: each rank) may "
                            "hold: an optimizer step that would insert past it raises "
                            "ValueError and applies nothing.")

    # a training lookup may look every position up (tf_bridge.lookup.DIRECT_FORWARD)
    _rows_per_position = True

    def _pooled(self, keys):
        """A buffer of this variable's pool for the rows of int ``keys`` (None for other
        keys, or a split table, whose lookup allocates its own)."""
        if self.distributed or not (isinstance(keys, np.ndarray) and keys.dtype.kind in "iu"):
            return None
        return _pool(self).empty((keys.size, self.dim), self.value_dtype.as_numpy_dtype)

    def _np_direct(self, arrays, return_exists=False, record=False):
        """:meth:`_lookup`'s numpy side: every position's row of the key arrays
        ``arrays`` (:meth:`_key_inputs`), into a buffer of the pool."""
        keys = self._np_keys(*arrays)
        return self._np_lookup(keys, return_exists, record, out=self._pooled(keys))

    def _np_lookup(self, keys, return_exists, record, out=None):
        if self.string_keys and not (isinstance(keys, np.ndarray) and keys.dtype.kind in "iu"):
            keys = self.table.ids(keys)          # strings: their ids (nothing registered)
        kw = {} if out is None else {"out": out}
        rows, exists = self.table.lookup(keys, return_exists=True, **kw)
        if self._pending is not None and not exists.all():
            self._fill_missing(keys, rows, exists, record)
        return (rows, exists) if return_exists else (rows,)

    def _fill_missing(self, keys, rows, exists, record):
        """Missing keys get the callable initializer's rows (one draw per distinct key,
        reused until inserted when ``record``)."""
        miss = np.flatnonzero(~exists.reshape(-1))
        uniq, inverse = unique_inverse(np.asarray(keys, np.int64).reshape(-1)[miss])
        vals, known = self._pending.lookup(uniq, return_exists=True)
        fresh = np.flatnonzero(~known)
        if fresh.size:
            vals[fresh] = self._draw(fresh.size)
            if record:
                self._pending.upsert(uniq[fresh], vals[fresh])
        rows.reshape(-1, self.dim)[miss] = vals[inverse]

    def _draw(self, n):
        shape, fn = (int(n), self.dim), self.initializer
        try:
            params = inspect.signature(fn).parameters.values()
            takes_dtype = any(p.name == "dtype" or p.kind == p.VAR_KEYWORD for p in params)
        except (TypeError, ValueError):
            takes_dtype = False
        out = fn(shape, dtype=self.value_dtype) if takes_dtype else fn(shape)
        arr = np.asarray(out, self.value_dtype.as_numpy_dtype)
        if arr.shape != shape:
            raise ValueError(f"initializer returned shape {arr.shape} for shape {shape}")
        return arr

    def size(self, index=None, name=None):
        """Number of keys (int64 scalar tensor), in all shards or in shard ``index``.

        Distributed: keys on every rank (collective), or in this rank's local shard
        ``index``."""
        if index is not None or not self.distributed:
            self.table.size(index)     # validates index now, also when tracing
        return numpy_call(lambda: (np.array(self.table.size(index), np.int64),), [],
                          [tf.int64], name=name,
                          collective=self.distributed and index is None)[0]

    def export(self, name=None):
        """``(keys (n,), values (n, dim))`` tensors of every key (distributed: of every
        key this rank owns; not collective)."""
        keys, values = numpy_call(self.table.export, [], [self.key_dtype, self.value_dtype],
                                  name=name)
        keys.set_shape([None])
        values.set_shape([None, self.dim])
        return keys, values

    # ---- writes --------------------------------------------------------------------
    def _write(self, fn, inputs, name, keys=None):
        """Run ``fn(*arrays)`` on ``inputs``; with ``keys``, ``fn(np_keys, *arrays)``.
        Returns the op in a TF1 graph (nothing runs until a session runs it, as TFRA's
        ops), None eagerly and in ``tf.function`` (where it runs in program order)."""
        if keys is None:
            out = numpy_call(lambda *a: (fn(*a), ())[1], inputs, [], name=name,
                             collective=self.distributed)
        else:
            parts = self._key_inputs(keys)
            m = len(parts)
            out = numpy_call(lambda *a: (fn(self._np_keys(*a[:m]), *a[m:]), ())[1],
                             parts + list(inputs), [], name=name, collective=self.distributed)
        return out if isinstance(out, tf.Operation) and not tf.inside_function() else None

    # ---- keys to the numpy side: int tensors as they are, strings as one buffer ------------
    def _key_inputs(self, keys):
        """The tensors that carry ``keys`` to a numpy call: ``[keys]``; for string keys
        ``[their bytes back to back (a scalar), their lengths (keys' shape)]`` (TF ops,
        so no Python object is made per string); :meth:`_np_keys` takes them back."""
        if not self.string_keys:
            return [keys]
        return [tf.strings.reduce_join(tf.reshape(keys, [-1])), tf.strings.length(keys)]

    def _keys_of_inputs(self, tensors):
        """The keys tensor that :meth:`_key_inputs` made ``tensors`` from (string keys:
        the input of the lengths op)."""
        return tensors[1].op.inputs[0] if self.string_keys else tensors[0]

    def _np_keys(self, *arrays):
        """numpy keys from the arrays of :meth:`_key_inputs` (string keys: ``Packed``)."""
        if not self.string_keys:
            return arrays[0]
        joined, lengths = arrays
        if isinstance(joined, np.ndarray):
            joined = joined.item()
        return Packed.from_lengths(joined, lengths)

    def _forget(self, keys):
        if self._pending is not None:
            self._pending.remove(self.table.ids(keys) if self.string_keys else keys)

    def upsert(self, keys, values, name=None):
        """Insert or overwrite ``keys`` with ``values`` (``keys.shape + [dim]``)."""
        keys = self.keys_in(keys, "keys")
        values = _as_real(values, "values", self.value_dtype)
        _check_shape(values, keys.shape.concatenate([self.dim]), "values", "keys.shape + [dim]")
        return self._write(lambda k, v: (self.table.upsert(k, v), self._forget(k)), [values],
                           name, keys=keys)

    def accum(self, keys, old_values, new_values, exists, name=None):
        """TFRA accum: add ``new - old`` where the key exists and ``exists``; insert
        ``new`` where it is absent and not ``exists``; ignore the rest."""
        keys = self.keys_in(keys, "keys")
        want = keys.shape.concatenate([self.dim])
        old = _as_real(old_values, "old_values", self.value_dtype)
        new = _as_real(new_values, "new_values", self.value_dtype)
        exists = tf.convert_to_tensor(exists)
        if exists.dtype != tf.bool:
            raise DtypeError(f"exists must be a bool tensor, got {exists.dtype.name}")
        _check_shape(old, want, "old_values", "keys.shape + [dim]")
        _check_shape(new, want, "new_values", "keys.shape + [dim]")
        _check_shape(exists, keys.shape, "exists", "keys.shape")
        return self._write(lambda k, o, n, e: (self.table.accum(k, o, n, e), self._forget(k)),
                           [old, new, exists], name, keys=keys)

    def remove(self, keys, name=None):
        """Remove ``keys``; absent keys are ignored."""
        return self._write(lambda k: (self.table.remove(k), self._forget(k)), [], name,
                           keys=self.keys_in(keys, "keys"))

    def clear(self, name=None):
        """Remove every key."""
        return self._write(lambda: (self.table.clear(), self._forget_all()), [], name)

    def _forget_all(self):
        if self._pending is not None:
            self._pending.clear()

    def insert_initial_values(self, ids):
        """For optimizer wrappers, before a step: insert the absent ``ids`` (numpy or eager
        tensor, any shape) with the rows training lookups returned for them.  Needed only
        for callable initializers (kernel initializers give the same rows again)."""
        if self._pending is None:
            return
        keys = from_tf(ids).reshape(-1)
        vals, known = self._pending.lookup(keys, return_exists=True)
        absent = ~self.table.lookup(keys, return_exists=True)[1]
        take = known & absent
        if take.any():
            self.table.accum(keys[take], vals[take], vals[take], np.zeros(int(take.sum()), bool))
        self._pending.remove(keys)

    # ---- tf.train.Checkpoint (tf_bridge.checkpoint) ------------------------------------
    _shared_name = property(lambda self: self.name)   # read by TF for resource-like objects

    def _serialize_to_tensors(self):
        """``{"keys", "values", "columns", "column_bytes"}``: see :mod:`tf_bridge.checkpoint`."""
        if not self.checkpoint:
            return {}
        from .checkpoint import serialize_to_tensors
        return serialize_to_tensors(self)

    def _restore_from_tensors(self, restored_tensors):
        from .checkpoint import restore_from_tensors
        return restore_from_tensors(self, restored_tensors)

    def _copy_trackable_to_cpu(self, object_map):    # async checkpoints
        from .checkpoint import copy_to_cpu
        copy_to_cpu(self, object_map)

    def _write_object_proto(self, proto, options):   # TF calls it for resource-like objects
        raise ValueError(f"de.Variable {self.name!r} cannot be saved in a SavedModel (its "
                         "lookups call back into Python); use tf.train.Checkpoint to save "
                         "training state and tf_bridge.export_for_serving for serving")

    def expire(self, step=None):
        """Remove the keys no optimizer step updated in the last ``steps_to_live`` steps
        (eager; :func:`numbaemb.expiry.expire`); returns how many."""
        from numbaemb.expiry import expire
        return expire(self.table, step)

    def prune_small(self, min_norm):
        """Remove the keys whose row's L2 norm is below ``min_norm`` (eager); returns how
        many (:func:`numbaemb.expiry.prune_small`)."""
        from numbaemb.expiry import prune_small
        return prune_small(self.table, min_norm)

    def restrict(self, num_reserved, trigger=None, name=None, **kwargs):
        """Evict keys by ``restrict_policy`` (TFRA): once size exceeds ``trigger``
        (default ``num_reserved``) keep the ``num_reserved`` best-scored keys; removed
        keys leave the table and every optimizer slot.  Returns an int64 scalar tensor
        (keys removed), or None without a policy.  ``kwargs`` are ignored (TFRA)."""
        if self.restrict_policy is None:
            return None
        return self.restrict_policy.apply_restriction(num_reserved, trigger, name=name)

    def __repr__(self):
        size = (f"local_size={self.table.local_size()}, rank={self.table.rank}"
                if self.distributed else f"size={self.table.size()}")
        return (f"de.Variable(name={self.name!r}, dim={self.dim}, key_dtype={self.key_dtype.name}, "
                f"value_dtype={self.value_dtype.name}, {size})")


def _distributed_comm(distributed, kernel_init, initializer):
    """The communicator a ``distributed`` table is split over (None: one process).

    The limits of distributed tables hold with one process too, so a script that
    runs on one machine runs under mpiexec unchanged."""
    if not isinstance(distributed, (bool, np.bool_)):
        raise TypeError(f"distributed must be a bool, got {type(distributed).__name__}")
    if not distributed:
        return None
    if not kernel_init:
        raise TypeError("a distributed table needs an initializer whose rows depend on the key "
                        "only (None, a number, an array, or a Keras RandomNormal / "
                        "RandomUniform / TruncatedNormal / Zeros / Constant), so that every "
                        f"rank draws the same rows; got {initializer!r}")
    from . import distributed as hvd
    return hvd.comm()


def _bounded_opts(max_capacity, evict, admit, steps_to_live, evict_window=None):
    """numbaemb's arguments for bounding a table (none for a plain one)."""
    opts = {k: v for k, v in dict(max_capacity=max_capacity, admit=admit,
                                  steps_to_live=steps_to_live,
                                  evict_window=evict_window).items() if v is not None}
    if max_capacity is not None or evict != "lru":     # (numbaemb refuses evict alone)
        opts["evict"] = evict
    return opts


def owner_of(obj):
    """The ``Variable`` that ``obj`` is, or whose ``trainable_handle`` it is; else None.

    For optimizer wrappers: gradients may come paired with either."""
    if isinstance(obj, Variable):
        return obj
    ref = getattr(obj, "_de_owner", None)
    return ref() if ref is not None else None


_REGISTRY = {}
_GRAPH_REGISTRY = weakref.WeakKeyDictionary()   # tf.Graph -> {name: Variable}


def _registry():
    """Named variables of the eager context, or of the TF1 graph being built (each
    ``tf.Graph`` has its own names, as its variables)."""
    if tf.executing_eagerly() or tf.inside_function():
        return _REGISTRY
    graph = tf.compat.v1.get_default_graph()
    names = _GRAPH_REGISTRY.get(graph)
    if names is None:
        names = _GRAPH_REGISTRY[graph] = {}
    return names


def get_variable(name, key_dtype=tf.int64, value_dtype=tf.float32, dim=1, **kwargs) -> Variable:
    """The variable called ``name``, created on first use (arguments as ``Variable``).

    A second call with the same configuration returns the same object; a clashing one
    raises ValueError.
    """
    fresh = Variable(key_dtype, value_dtype, dim, name=name, **kwargs)
    old = _registry().setdefault(name, fresh)
    if old is not fresh and old._config() != fresh._config():
        a, b = old._config(), fresh._config()
        diff = ", ".join(f"{k}: existing {a[k]!r}, requested {b[k]!r}" for k in a if a[k] != b[k])
        raise ValueError(f"variable {name!r} already exists with another configuration: {diff}")
    return old
