"""``tf.nn``'s embedding lookups on dynamic tables, through TensorFlow's type dispatch.

Importing ``tf_bridge`` registers ``tf_bridge.Variable`` (and so ``de.sok.DynamicVariable``)
as a dispatchable type and these dispatch targets with
``tf.experimental.dispatch_for_api``; TensorFlow's functions are not replaced:

=============================================  ==========================================
``tf.nn.embedding_lookup`` (and ``compat.v1``)  :func:`tf_bridge.embedding_lookup`
``tf.nn.embedding_lookup_sparse`` (and v1)      :func:`tf_bridge.embedding_lookup_sparse`
``tf.nn.safe_embedding_lookup_sparse`` (and v1) :func:`tf_bridge.safe_embedding_lookup_sparse`
=============================================  ==========================================

``params`` may be one variable or a list of them (one variable's list is that variable;
with N, id ``k`` lives in ``params[k mod N]`` under its own key, whatever
``partition_strategy`` says: ids are keys, not row numbers).  The lookups are
differentiable like ours (``tape.gradient(loss, [v])`` gives what
``de.DynamicEmbeddingOptimizer`` applies), in eager mode, in ``tf.function`` and in
TF1 graphs.  ``validate_indices`` and ``allow_fast_lookup`` are accepted and ignored.

>>> import tensorflow as tf, tf_bridge as de
>>> v = de.Variable(dim=3, initializer=13.0)
>>> tf.nn.embedding_lookup(v, tf.constant([0, 1, 2**40], tf.int64)).numpy()[0].tolist()
[13.0, 13.0, 13.0]
"""
import typing

import tensorflow as tf

from . import lookup
from .variable import Variable

__all__ = []

try:        # the one name this needs outside tf.* (kept by TF for types such as ours)
    from tensorflow.python.util.dispatch import register_dispatchable_type
except ImportError:     # pragma: no cover  (a TF without it: tf.nn then rejects our variables)
    register_dispatchable_type = None

if register_dispatchable_type is not None:
    register_dispatchable_type(Variable)

    _PARAMS = ({"params": Variable}, {"params": typing.List[Variable]})
    _WEIGHTS = ({"embedding_weights": Variable},
                {"embedding_weights": typing.List[Variable]})

    @tf.experimental.dispatch_for_api(tf.nn.embedding_lookup, *_PARAMS)
    def _embedding_lookup(params, ids, max_norm=None, name=None):
        return lookup.embedding_lookup(params, ids, name=name, max_norm=max_norm)

    @tf.experimental.dispatch_for_api(tf.compat.v1.nn.embedding_lookup, *_PARAMS)
    def _embedding_lookup_v1(params, ids, partition_strategy="mod", name=None,
                             validate_indices=True, max_norm=None):
        return lookup.embedding_lookup(params, ids, name=name, max_norm=max_norm)

    @tf.experimental.dispatch_for_api(tf.nn.embedding_lookup_sparse, *_PARAMS)
    def _embedding_lookup_sparse(params, sp_ids, sp_weights, combiner=None, max_norm=None,
                                 name=None, allow_fast_lookup=False):
        return lookup.embedding_lookup_sparse(params, sp_ids, sp_weights, name=name,
                                              combiner=combiner, max_norm=max_norm)

    @tf.experimental.dispatch_for_api(tf.compat.v1.nn.embedding_lookup_sparse, *_PARAMS)
    def _embedding_lookup_sparse_v1(params, sp_ids, sp_weights, partition_strategy="mod",
                                    name=None, combiner=None, max_norm=None,
                                    allow_fast_lookup=False):
        return lookup.embedding_lookup_sparse(params, sp_ids, sp_weights, name=name,
                                              combiner=combiner, max_norm=max_norm)

    @tf.experimental.dispatch_for_api(tf.nn.safe_embedding_lookup_sparse, *_WEIGHTS)
    def _safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None,
                                      combiner="mean", default_id=None, max_norm=None,
                                      name=None, allow_fast_lookup=False):
        return lookup.safe_embedding_lookup_sparse(
            embedding_weights, sparse_ids, sparse_weights, combiner=combiner,
            default_id=default_id, name=name, max_norm=max_norm)

    @tf.experimental.dispatch_for_api(tf.compat.v1.nn.safe_embedding_lookup_sparse, *_WEIGHTS)
    def _safe_embedding_lookup_sparse_v1(embedding_weights, sparse_ids, sparse_weights=None,
                                         combiner="mean", default_id=None, name=None,
                                         partition_strategy="div", max_norm=None,
                                         allow_fast_lookup=False):
        return lookup.safe_embedding_lookup_sparse(
            embedding_weights, sparse_ids, sparse_weights, combiner=combiner,
            default_id=default_id, name=name, max_norm=max_norm)
