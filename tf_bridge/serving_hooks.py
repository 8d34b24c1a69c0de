"""How lookups are served without Python: the hooks the two serving exports use.

- ``_SERVING.hook(variable, keys, return_exists)``: set by :mod:`tf_bridge.export`
  while it traces a ``tf.function``; lookups then read TF-native ServingTables
  instead of calling back into Python.
- :func:`register_serving`: each lookup op of a TF1 graph records how TF ops compute
  its outputs from a frozen table, which :mod:`tf_bridge.graph_export` puts in its
  place.

>>> import tensorflow as tf
>>> with tf.Graph().as_default() as g:
...     x = tf.constant([1.0])
...     register_serving(x, lambda table_for, inputs: [inputs[0]])
>>> list(_SERVE_OPS[g])
['Const']
"""
import threading
import weakref

import tensorflow as tf

__all__ = ["register_serving", "serve_unique_forward"]

_SERVING = threading.local()
_SERVE_OPS = weakref.WeakKeyDictionary()     # graph -> {op name: serve(table_for, inputs)}


def register_serving(output, serve):
    """Record how to serve the numpy-function op of ``output`` (its first output; graphs
    only, eagerly a no-op): ``serve(table_for, inputs) -> [tensors]`` gives the op's
    outputs from its input tensors, where ``table_for(variable)`` is the variable's
    frozen ServingTable."""
    if not tf.executing_eagerly():
        _SERVE_OPS.setdefault(output.graph, {})[output.op.name] = serve


def serve_unique_forward(params, train, table_for, inputs):
    """The outputs of :func:`tf_bridge.lookup.unique_lookup`'s op from TF ops on a
    frozen table: the rows, and training, the distinct ids and each position's index."""
    flat = tf.reshape(params._keys_of_inputs(inputs), [-1])
    rows = table_for(params).lookup(flat)
    if not train:
        return [rows]
    ids = tf.strings.to_hash_bucket_fast(flat, 2 ** 63 - 1) if params.string_keys else flat
    uniq, inverse = tf.unique(ids, out_idx=tf.int64)
    return [rows, uniq, inverse]
