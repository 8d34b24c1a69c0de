"""TF-native serving copies of dynamic tables, for SavedModels that load anywhere.

A SavedModel that calls back into Python (``tf.numpy_function``) cannot be
loaded in a fresh process, so serving export freezes each table into plain TF
objects: a ``tf.lookup.StaticHashTable`` ``key -> row``, a ``tf.Variable`` of
rows, and :mod:`tf_bridge.tf_init` to compute the initializer's value of
unknown ids, exactly as training would have.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=2); v.upsert(np.array([5]), np.ones((1, 2), np.float32))
>>> t = ServingTable(v)
>>> t(tf.constant([[5, 6]], tf.int64)).numpy().tolist()
[[[1.0, 1.0], [0.0, 0.0]]]
"""
import numpy as np
import tensorflow as tf

from .tf_init import init_values

__all__ = ["ServingTable"]


class ServingTable(tf.Module):
    """Frozen, TF-only copy of a numbaemb ``Variable`` (its keys, rows and initializer).

    Call it with int ids of any shape to get ``ids.shape + [dim]`` rows.
    """

    def __init__(self, variable, name=None, feeds=None):
        """``feeds`` (TF1 graphs): a dict that receives ``placeholder -> array`` for the
        keys and rows, which then live in variables initialized from those
        placeholders (a graph holds no copy of the table, so no 2 GB GraphDef limit);
        run ``tf.compat.v1.global_variables_initializer()`` with ``feed_dict=feeds``."""
        super().__init__(name=name or (variable.name or "table").replace("/", "_"))
        keys, rows = variable.export()
        host = getattr(getattr(variable, "_arrays", None), "host", np.asarray)   # GPU tables
        keys, rows = np.asarray(host(keys)), np.asarray(host(rows))
        self.dim = int(variable.dim)
        self.strings = keys.dtype.kind in "OSU"
        self.key_dtype = tf.string if self.strings else tf.as_dtype(variable.key_dtype)
        self.value_dtype = tf.as_dtype(variable.value_dtype)
        self._init = variable.initializer.params(variable.dim, variable.seed)
        keys = keys if self.strings else keys.astype(np.int64)
        index = np.arange(keys.shape[0], dtype=np.int64)
        if not keys.shape[0]:    # TF refuses empty tables; a key -> -1 means "absent" anyway
            keys = np.array([b""], object) if self.strings else np.zeros(1, np.int64)
            index = np.full(1, -1, np.int64)
            rows = np.zeros((1, self.dim), rows.dtype)   # gather needs a row to read
        key_dtype = self.key_dtype if self.strings else tf.int64
        rows = rows.reshape(-1, self.dim)
        if feeds is None:
            keys_t, index_t = tf.constant(keys, key_dtype), tf.constant(index)
            self.rows = tf.Variable(rows, trainable=False, name="rows")
        else:
            fed = [tf.compat.v1.placeholder(d, a.shape, name=n) for d, a, n in
                   ((key_dtype, keys, "keys_value"), (tf.int64, index, "index_value"),
                    (tf.as_dtype(rows.dtype), rows, "rows_value"))]
            feeds.update(zip(fed, (keys, index, rows)))
            self.keys, self.index, self.rows = (tf.Variable(p, trainable=False, name=n) for p, n
                                                in zip(fed, ("keys", "index", "rows")))
            keys_t, index_t = self.keys.read_value(), self.index.read_value()
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys_t, index_t), default_value=-1)

    def __call__(self, ids):
        return self.lookup(ids)

    def lookup(self, ids, return_exists=False):
        """Rows ``ids.shape + [dim]`` of int ``ids`` (any shape; strings for a string-key
        table); with ``return_exists`` also a bool tensor ``ids.shape`` telling which ids
        the table holds.

        Unknown strings get the initializer's value of their level-0 id (the
        fingerprint ``tf.strings.to_hash_bucket_fast(s, 2**63 - 1)``): what training
        gives them too, unless another string already holds that id (chance about
        ``size / 2**63``)."""
        ids = tf.convert_to_tensor(ids)
        if self.strings != (ids.dtype == tf.string) or not (self.strings or ids.dtype.is_integer):
            raise TypeError(f"ids must be a {'string' if self.strings else 'integer'} tensor, "
                            f"got {ids.dtype.name}")
        flat = tf.reshape(ids if self.strings else tf.cast(ids, tf.int64), [-1])
        idx = self.table.lookup(flat)
        out = tf.gather(self.rows, tf.maximum(idx, 0))
        miss = tf.where(idx < 0)
        absent = tf.gather_nd(flat, miss)
        if self.strings:
            absent = tf.strings.to_hash_bucket_fast(absent, 2 ** 63 - 1)
        defaults = init_values(absent, self.dim, self._init, self.value_dtype)
        out = tf.tensor_scatter_nd_update(out, miss, defaults)
        out = tf.reshape(out, tf.concat([tf.shape(ids), [self.dim]], 0))
        out.set_shape(ids.shape.concatenate([self.dim]))
        if return_exists:
            return out, tf.reshape(idx >= 0, tf.shape(ids))
        return out
