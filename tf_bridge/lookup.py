"""The ``embedding_lookup`` family (TFRA names), differentiable through ``tf.custom_gradient``.

Forward (one ``tf.numpy_function``): the distinct ids of the batch
(:func:`jit_kernels.segment.unique_inverse`, for the backward) and every
position's row, looked up straight into the output (absent ids get initial
values, nothing is inserted; ``DIRECT_FORWARD = False``: the distinct ids' rows
looked up once and spread).  Backward: the output gradient summed per distinct
id through the forward's position -> id map (``segment_sum``, no second unique),
returned for the variable as ``tf.IndexedSlices(values (u, dim), indices (u,))``
whose indices are tagged distinct (:func:`is_distinct`), so the optimizer
wrapper applies it (and inserts the ids) without a unique pass of its own.  The
sum op is pure and tagged (:func:`positions_of`): ``DynamicEmbeddingOptimizer``
sums the rows inside its own op instead, and the graph drops the sum op.

>>> import tensorflow as tf, tf_bridge as de
>>> v = de.Variable(dim=2, name="doc_lookup", initializer=1.0)
>>> ids = tf.constant([[3, 3], [4, 3]], tf.int64)
>>> with tf.GradientTape() as tape:
...     loss = tf.reduce_sum(de.embedding_lookup(v, ids))
>>> g = tape.gradient(loss, v)
>>> g.indices.numpy().tolist(), g.values.numpy().tolist()
([3, 4], [[3.0, 3.0], [1.0, 1.0]])

Sparse lookups look the distinct ids up once and combine them with TF's own
``tf.nn.embedding_lookup_sparse`` / ``safe_embedding_lookup_sparse`` applied to
the looked-up rows, so the math (combiners, weights, shapes) is TF's.
"""
import threading
import weakref

import numba
import numpy as np
import tensorflow as tf

from jit_kernels.segment import gather_rows, segment_sum_into, unique_inverse
from numbaemb import aligned_empty
from numbaemb import multi as ne_multi
from numbaemb._checks import storage_dtype

from . import mode
from .dlpack import from_tf, numpy_call, to_tf
from .serving_hooks import _SERVING, register_serving, serve_unique_forward
from .variable import Variable, _pool

__all__ = ["embedding_lookup", "embedding_lookup_unique", "embedding_lookup_sparse",
           "safe_embedding_lookup_sparse", "unique_lookup", "lookup_many", "sum_by_key",
           "is_distinct", "positions_of"]

COMBINERS = ("sum", "mean", "sqrtn")
# training lookups take the positions' rows straight from the table into their output (a
# buffer of the variable's pool), not the distinct ids' rows then a spread (see forward)
DIRECT_FORWARD = True


def _check_params(params):
    """``params``: one ``tf_bridge.Variable`` or a non-empty list / tuple of them (the
    same dim and dtypes), as ``tf.nn``'s ``params``."""
    if isinstance(params, (list, tuple)):
        if not params:
            raise ValueError("params must be a tf_bridge.Variable or a non-empty list of them, "
                             "got an empty list")
        for i, p in enumerate(params):
            if not isinstance(p, Variable):
                raise TypeError(f"params[{i}] must be a tf_bridge.Variable, got "
                                f"{type(p).__name__}")
        kinds = {(p.dim, p.key_dtype, p.value_dtype) for p in params}
        if len(kinds) > 1:
            raise ValueError(f"params: the variables of a list must have one dim, key dtype "
                             f"and value dtype, got {sorted(map(str, kinds))}")
        return
    if not isinstance(params, Variable):
        raise TypeError(f"params must be a tf_bridge.Variable (or a list of them), got "
                        f"{type(params).__name__}")


def _first(params):
    return params[0] if isinstance(params, (list, tuple)) else params


def _single(params):
    """A one-element list of variables is its variable (as in ``tf.nn``)."""
    return params[0] if isinstance(params, (list, tuple)) and len(params) == 1 else params


def _split_lookup(params, ids, max_norm):
    """Rows of ``ids`` from a list of N variables: id ``k`` lives in ``params[k mod N]``
    (floor mod, so negative ids too; a string in ``params[fingerprint mod N]``, the
    fingerprint of ``tf.strings.to_hash_bucket_fast``), under its own key (ids are keys, not row numbers,
    so TF's ``partition_strategy`` has no meaning here).  Differentiable per variable."""
    n = len(params)
    flat = tf.reshape(ids, [-1])
    if flat.dtype == tf.string:          # string keys: by fingerprint (the level-0 id) mod n
        part = tf.cast(tf.strings.to_hash_bucket_fast(flat, n), tf.int32)
    else:
        part = tf.cast(tf.math.floormod(flat, tf.cast(n, flat.dtype)), tf.int32)
    pieces = tf.dynamic_partition(flat, part, n)
    positions = tf.dynamic_partition(tf.range(tf.size(flat)), part, n)
    rows = [embedding_lookup(p, piece, max_norm=max_norm) for p, piece in zip(params, pieces)]
    out = tf.dynamic_stitch(positions, rows)
    return tf.reshape(out, tf.concat([tf.shape(ids, out_type=tf.int32), [params[0].dim]], 0))


def embedding_lookup(params, ids, partition_strategy=None, name=None, validate_indices=None,
                     max_norm=None, return_trainable=False):
    """Rows of ``ids`` (int64/int32, any shape; ``tf.string`` for a string-key table) as
    ``ids.shape + [dim]``.

    Differentiable in train mode when ``params.trainable``; ``max_norm`` clips each
    row's L2 norm (as ``tf.nn.embedding_lookup``).  ``partition_strategy`` and
    ``validate_indices`` are ignored.  With ``return_trainable`` returns
    ``(embeddings, params)``: ``params`` is what to differentiate and apply.

    ``params`` may be a list of variables, as ``tf.nn.embedding_lookup``'s: one
    variable's list is that variable; with N variables id ``k`` lives in
    ``params[k mod N]`` under its own key (ids are keys, not row numbers).
    """
    _check_params(params)
    params = _single(params)
    ids = _first(params).keys_in(ids, "ids")
    if isinstance(params, (list, tuple)):
        with tf.name_scope(name or "embedding_lookup"):
            emb = _split_lookup(params, ids, max_norm)
            emb.set_shape(ids.shape.concatenate([params[0].dim]))
        return (emb, params) if return_trainable else emb
    with tf.name_scope(name or "embedding_lookup"):
        if mode.is_training() and params.trainable:
            emb = _differentiable_lookup(params, ids)
        else:
            emb = params._lookup(ids, False, record=False)
        if max_norm is not None:
            emb = tf.clip_by_norm(emb, max_norm, axes=[-1])
    return (emb, params) if return_trainable else emb


def _differentiable_lookup(params, ids):
    return unique_lookup(params, ids, params.trainable_handle.value())


def unique_lookup(params, ids, handle=None):
    """Rows of ``ids`` (int64/int32 tensor, any shape) as ``ids.shape + [dim]``, from one
    ``tf.numpy_function``: the distinct ids of the batch (Numba, first-occurrence order)
    and every position's row (absent ids get initial values, nothing is inserted; see
    the module docstring).  No ``tf.unique`` / ``tf.gather`` ops.

    With ``handle`` (the value of a trainable handle, read under the tape: a Keras
    layer's weight or ``params.trainable_handle``) the result is differentiable: the
    gradient for ``handle`` is ``IndexedSlices(sums (u, dim), distinct ids (u,))``, the
    output gradient summed per distinct id through the forward's position -> id map
    (one more ``tf.numpy_function``, no second unique).  Its indices are tagged
    distinct (:func:`is_distinct`), so ``DynamicEmbeddingOptimizer`` applies them
    without a unique pass; the initial rows the forward computed for absent ids are
    kept for that step (:func:`take_fresh`), so they are not drawn twice.
    """
    train = handle is not None
    if getattr(_SERVING, "hook", None) is not None:       # serving export traces this
        if not train:
            return params._lookup(ids, False, record=False)

        @tf.custom_gradient
        def plain(ids, handle_value):
            def grad(dy):
                return None, sum_by_key(params, ids, dy)
            return params._lookup(ids, False, record=True), grad
        return plain(ids, handle)

    forward = _forward(params, train)
    eager = tf.executing_eagerly()
    if eager:                            # the backward keeps the numpy arrays
        out = forward(*[from_tf(x) for x in params._key_inputs(ids)])
        out = [to_tf(out[0]), *out[1:]]
    else:
        out = numpy_call(forward, params._key_inputs(ids), _tout(params, train),
                         name="unique_lookup", collective=params.distributed)
        register_serving(out[0], lambda table_for, inputs: serve_unique_forward(
            params, train, table_for, inputs))
    return _finish(params, ids, out, handle)


def _tout(params, train):
    return [params.value_dtype] + ([params.id_dtype, tf.int64] if train else [])


def _forward(params, train):
    """``forward(*key arrays) -> (rows,)`` or, training, ``(rows, distinct ids,
    inverse)``: :func:`unique_lookup`'s numpy side (see the module docstring)."""
    key_np, dim = params.id_dtype.as_numpy_dtype, params.dim
    strings = params.string_keys
    # kernel initializers: rows are f(key); a distributed table's owners draw them themselves
    stash = train and params._pending is None and not params.distributed

    def forward(*arrays):
        keys = params._np_keys(*arrays)
        if strings:                      # their ids; training registers new strings
            keys = params.table.ids(keys, insert=train)
        flat = keys.reshape(-1)
        n = flat.shape[0]
        uniq, inverse = unique_inverse(flat, out=(aligned_empty(n, np.int64),
                                                  aligned_empty(n, np.int64)))
        distinct = uniq.shape[0] == n    # then uniq is flat, in order
        out = params._pooled(flat)
        if out is not None and (distinct or DIRECT_FORWARD and params._rows_per_position):
            # every position's row straight from the table into the output (absent ids'
            # initial rows drawn per position: the same values); callable initializers
            # record their rows; _np_lookup checks the key range
            rows, exists = params._np_lookup(flat, True, train, out=out)
            if stash:
                _keep_fresh_positions(params, uniq, inverse, rows, exists)
            return (rows, uniq.astype(key_np, copy=False), inverse) if train else (rows,)
        rows, exists = params._np_lookup(flat if distinct else uniq, True, train)
        if stash:
            _keep_fresh(params, uniq, rows, exists, shared=distinct)
        if not distinct:                 # spread the rows to every position
            shown, store = rows.dtype, storage_dtype(rows.dtype)   # 16-bit floats: bits
            out = _pool(params).empty((n, dim), store)
            rows = gather_rows(rows.view(store), inverse, out).view(shown)
        rows = rows.reshape(n, dim)
        return (rows, uniq.astype(key_np, copy=False), inverse) if train else (rows,)

    return forward


def _finish(params, ids, out, handle):
    """The embedding ``ids.shape + [dim]`` from a forward's outputs ``out`` (tensors;
    eagerly the distinct ids and inverse stay numpy), differentiable through
    ``handle`` when given."""
    dim = params.dim
    rows = out[0]

    def shaped(rows):
        emb = tf.reshape(rows, tf.concat([tf.shape(ids, out_type=tf.int64), [dim]], 0))
        emb.set_shape(ids.shape.concatenate([dim]))
        return emb

    if handle is None:
        return shaped(rows)
    uniq, inverse = out[1:]
    if not tf.executing_eagerly():
        uniq.set_shape([None])
        inverse.set_shape([None])
        _mark_distinct(uniq)

    @tf.custom_gradient
    def lookup(rows, handle_value):     # handle_value: read under the tape, so it is watched
        def grad(dy):
            return None, _sum_by_inverse(params, uniq, inverse, dy)
        return shaped(rows), grad

    return lookup(rows, handle)


def lookup_many(params, ids, handles=None, name=None):
    """Rows of several tables at once, ``[ids[t].shape + [dim_t] for each table t]``,
    from one ``tf.numpy_function`` (one hand-off into Python a step, not one per
    table: a model with many small tables spends most of its embedding time in
    those hand-offs).

    ``params``: list of ``tf_bridge.Variable`` (any dims, dtypes and key types);
    ``ids``: one id tensor per table (any shapes).  ``handles``: None, or one entry
    per table: a trainable handle's value (training, as :func:`unique_lookup` with
    ``handle``; each table's gradient is its own ``IndexedSlices``) or None
    (inference: every position looked up directly, as ``params[t]._lookup``).
    Plain CPU tables are looked up together in one kernel call
    (:func:`numbaemb.multi.lookup_many`).  Results are the per-table calls' bit for bit.  Split (MPI) tables, eager calls
    and serving exports take the per-table path.

    >>> import tensorflow as tf, tf_bridge as de
    >>> a = de.Variable(dim=2, name="doc_many_a", initializer=1.0)
    >>> b = de.Variable(dim=3, name="doc_many_b", initializer=2.0)
    >>> ea, eb = lookup_many([a, b], [tf.constant([1, 2], tf.int64),
    ...                               tf.constant([[5]], tf.int64)])
    >>> ea.shape, eb.numpy().tolist()
    (TensorShape([2, 2]), [[[2.0, 2.0, 2.0]]])
    """
    params, ids = list(params), list(ids)
    for t, p in enumerate(params):
        if not isinstance(p, Variable):
            raise TypeError(f"params[{t}] must be a tf_bridge.Variable, got {type(p).__name__}")
    if len(ids) != len(params):
        raise ValueError(f"ids must have one tensor per table ({len(params)}), got {len(ids)}")
    handles = [None] * len(params) if handles is None else list(handles)
    if len(handles) != len(params):
        raise ValueError(f"handles must be None or one entry per table ({len(params)}), got "
                         f"{len(handles)}")
    ids = [p.keys_in(i, f"ids[{t}]") for t, (p, i) in enumerate(zip(params, ids))]
    if (len(params) < 2 or tf.executing_eagerly() or getattr(_SERVING, "hook", None) is not None
            or any(p.distributed for p in params)):
        return [p._lookup(i, False, record=False) if h is None else unique_lookup(p, i, h)
                for p, i, h in zip(params, ids, handles)]
    forwards = [(lambda *a, p=p: p._np_direct(a)) if h is None else _forward(p, True)
                for p, h in zip(params, handles)]
    inputs = [p._key_inputs(i) for p, i in zip(params, ids)]
    together = [_joins(p, h is not None) for p, h in zip(params, handles)]

    def run(*arrays):
        parts, at = [], 0
        for given in inputs:
            parts.append(arrays[at:at + len(given)])
            at += len(given)
        outs = [None] * len(params)
        for train in (True, False):      # plain tables: one kernel call for all (each mode)
            group = [t for t in range(len(params)) if together[t] and
                     (handles[t] is not None) == train]
            if len(group) > 1:
                for t, got in zip(group, _lookup_group([params[t] for t in group],
                                                       [parts[t][0] for t in group], train)):
                    outs[t] = got
        for t, forward in enumerate(forwards):
            if outs[t] is None:
                outs[t] = forward(*parts[t])
        return [x for out in outs for x in out]

    touts = [_tout(p, h is not None) for p, h in zip(params, handles)]
    out = numpy_call(run, [x for given in inputs for x in given], [d for t in touts for d in t],
                     name=name or "lookup_many")
    embs, at = [], 0
    for p, i, h, tout in zip(params, ids, handles, touts):
        embs.append(_finish(p, i, out[at:at + len(tout)], h))
        at += len(tout)
    return embs


def _joins(params, train):
    """Whether ``params`` may be looked up in one kernel call with other tables
    (:func:`numbaemb.multi.lookup_many`): a plain CPU table whose training lookup
    takes every position's row (:data:`DIRECT_FORWARD`) and keeps the absent ids'
    initial rows."""
    return (not params.string_keys and not params.distributed and params._pending is None
            and (not train or DIRECT_FORWARD and params._rows_per_position)
            and ne_multi.fits(params.table))


def _lookup_group(params, arrays, train):
    """The forwards' outputs (:func:`_forward` training, else ``Variable._np_direct``) of the
    tables ``params`` for their key arrays, from one kernel call."""
    keys = [np.asarray(a).reshape(-1) for a in arrays]
    looked = ne_multi.lookup_many([p.table for p in params], keys, unique=train,
                                  outs=[p._pooled(k) for p, k in zip(params, keys)])
    if not train:
        return [(got.rows,) for got in looked]
    out = []
    for p, got in zip(params, looked):
        _set_fresh(p, None if got.absent is None else (got.uniq, got.absent[1], got.absent[0]))
        out.append((got.rows, got.uniq.astype(p.id_dtype.as_numpy_dtype, copy=False),
                    got.inverse))
    return out


# ---- initial rows of absent ids, from the forward to the optimizer step ---------------------
# A training lookup computes the initial rows of the ids absent from the table; the optimizer
# step then inserts those ids.  Initial values are a pure function of (seed, key), so the step
# may insert the forward's rows instead of drawing them again: kept here per variable (the
# last training lookup's), used only when the step's keys are exactly that lookup's distinct ids.
_FRESH = weakref.WeakKeyDictionary()
_FRESH_LOCK = threading.Lock()


def _keep_fresh(params, uniq, rows, exists, shared):
    """``rows`` (u, dim) of the distinct ids ``uniq``; ``exists`` marks the ones found.
    ``shared``: ``rows`` is handed to TensorFlow too (keep a copy of the absent ids' rows)."""
    exists = exists.reshape(-1)
    entry = None
    if not exists.all():
        if shared:                       # TF may reuse its buffer: keep the absent ids' rows
            miss = ~exists
            kept = np.empty_like(rows)   # rows of present ids are never read
            kept[miss] = rows[miss]
            rows = kept
        entry = (uniq, rows, ~exists)
    _set_fresh(params, entry)


def _keep_fresh_positions(params, uniq, inverse, rows, exists):
    """As :func:`_keep_fresh` from the rows of every position (``rows`` (n, dim),
    ``exists`` (n,), ``uniq[inverse]`` the positions' ids): the absent ids' rows, copied
    from one of their positions (all hold the same initial row)."""
    miss = np.flatnonzero(~exists.reshape(-1))
    entry = None
    if miss.size:
        ids = inverse[miss]
        valid = np.zeros(uniq.shape[0], np.bool_)
        valid[ids] = True
        kept = np.empty((uniq.shape[0], rows.shape[-1]), rows.dtype)  # present ids': unread
        kept[ids] = rows.reshape(-1, rows.shape[-1])[miss]
        entry = (uniq, kept, valid)
    _set_fresh(params, entry)


def _set_fresh(params, entry):
    """Keep ``(uniq, rows, valid)`` for ``params``' next step (None: nothing to keep)."""
    with _FRESH_LOCK:
        if entry is None:
            _FRESH.pop(params, None)
        else:
            _FRESH[params] = entry


def take_fresh(params, keys):
    """For an optimizer step on the distinct ``keys`` (numpy) of ``params``: ``(rows,
    valid)`` for ``numbaemb.optimizers.apply_gradients(initial_rows=...)``, the initial
    rows that the last training lookup computed for the ids it found absent, when
    ``keys`` are that lookup's distinct ids; else None (the step draws them)."""
    with _FRESH_LOCK:
        entry = _FRESH.pop(params, None)
    if entry is None:
        return None
    uniq, rows, valid = entry
    keys = keys.reshape(-1)
    if keys.shape != uniq.shape or not np.array_equal(keys, uniq):
        return None
    return rows, valid


def _tag(tensor, attr, value):
    """Set a Python attribute on a graph tensor (eager tensors take none: no tag)."""
    try:
        setattr(tensor, attr, value)
    except AttributeError:
        pass
    return tensor


def _mark_distinct(keys):
    """Tag ``keys`` (a tensor) as holding no key twice: an optimizer wrapper may then skip
    its own unique pass (``tf_bridge.optimizer``).  A tensor derived from it (a concat of
    several gradients by the tape, say) is a new object and carries no tag."""
    return _tag(keys, "_de_distinct", True)


def positions_of(sums):
    """``(inverse (n,), rows (n, dim))`` behind the gradient sums ``sums`` (the values
    of a training lookup's gradient, in a graph): its output gradient per position and
    each position's index into the distinct ids; None for any other tensor.  An
    optimizer may then sum the rows in its own update pass instead
    (``numbaemb.optimizers.apply_gradients(inverse=...)``) and the graph prunes the
    op that computes ``sums``."""
    return getattr(sums, "_de_positions", None)


def is_distinct(keys) -> bool:
    """Whether ``keys`` is known to hold no key twice: tagged by this module, or the
    first output of a ``tf.unique`` op in a graph."""
    if getattr(keys, "_de_distinct", False):
        return True
    try:
        return keys.op.type in ("Unique", "UniqueV2") and keys.value_index == 0
    except AttributeError:       # eager tensors have no op
        return False


def _sum_by_inverse(params, uniq, inverse, dy):
    """``IndexedSlices(sums (u, dim), uniq)``: ``dy`` (positions x dim, dense or
    IndexedSlices over positions) summed per distinct id through ``inverse``."""
    if isinstance(dy, tf.IndexedSlices) and dy.values.shape.rank == 2:
        inverse = tf.gather(inverse, dy.indices)           # only the positions with rows
        values, every = dy.values, False
    else:
        values, every = tf.convert_to_tensor(dy), True
    values = tf.cast(tf.reshape(values, [-1, params.dim]), params.grad_dtype)
    return _segment_sums(params, uniq, inverse, values, every)


def _segment_sums(params, keys, inverse, values, every):
    """Sum ``values`` (m, dim) into the rows ``inverse`` (m,) of distinct ``keys`` (u,).

    ``every``: every key has at least one row (skip the check); otherwise keys without
    a row are dropped, so they are not trained with a zero gradient."""
    key_np, dim = params.id_dtype.as_numpy_dtype, params.dim

    def sums_of(k, inv, vals):
        out = _pool(params).empty((k.shape[0], dim), vals.dtype)
        return segment_sum_into(np.ascontiguousarray(vals), inv, out, numba.get_num_threads())

    if every:
        # pure, so a graph whose optimizer sums the rows itself prunes it (see positions_of)
        sums, = numpy_call(lambda k, inv, vals: (sums_of(k, inv, vals),),
                           [keys, inverse, values], [values.dtype], name="sum_by_key",
                           stateful=False)
        _tag(sums, "_de_positions", (inverse, values))
        keys_out = tf.identity(keys)     # graph: a node of the gradient graph, not a capture
    else:
        def run(k, inv, vals):
            out = sums_of(k, inv, vals)
            seen = np.zeros(k.shape[0], np.bool_)
            seen[inv] = True
            if not seen.all():           # (rare: the rows are then copied once more)
                k, out = k[seen], out[seen]
            keys_out = aligned_empty(k.shape[0], key_np)
            keys_out[...] = k
            return keys_out, out

        keys_out, sums = numpy_call(run, [keys, inverse, values],
                                    [params.id_dtype, values.dtype], name="sum_by_key")
        keys_out.set_shape([None])
    sums.set_shape([None, dim])
    return tf.IndexedSlices(sums, _mark_distinct(keys_out))


def sum_by_key(params, ids, dy, distinct=None):
    """``tf.IndexedSlices``: ``dy`` (``ids.shape + [dim]``, dense or IndexedSlices over
    the first axis) summed per distinct id (Numba kernels, in batch order).

    ``distinct``: whether ``ids`` holds no id twice (e.g. the first output of
    ``tf.unique``); None (default) works it out (:func:`is_distinct`).  Distinct ids
    skip the unique pass: a dense ``dy`` is the answer as it is, an IndexedSlices one
    is summed by its indices.
    """
    if ids.dtype == tf.string:           # a string table's keys: their (registered) ids
        ids = params.ids(ids, insert=True)
    flat = tf.reshape(ids, [-1])
    if distinct is None:
        distinct = is_distinct(ids)
    if distinct:
        if isinstance(dy, tf.IndexedSlices) and ids.shape.rank == 1:
            return _segment_sums(params, flat, dy.indices, tf.cast(
                tf.reshape(dy.values, [-1, params.dim]), params.grad_dtype), False)
        values = tf.cast(tf.reshape(tf.convert_to_tensor(dy), [-1, params.dim]),
                         params.grad_dtype)
        return tf.IndexedSlices(values, _mark_distinct(tf.identity(flat)))
    if isinstance(dy, tf.IndexedSlices):
        if ids.shape.rank == 1:        # rows of the output are ids: keep it sparse
            flat, dy = tf.gather(flat, dy.indices), dy.values
        else:
            dy = tf.convert_to_tensor(dy)
    dy = tf.cast(tf.reshape(dy, [-1, params.dim]), params.grad_dtype)   # 16-bit: float32
    key_np = params.id_dtype.as_numpy_dtype

    def run(keys, grads):
        n = keys.shape[0]
        uniq, inverse = unique_inverse(keys, out=(aligned_empty(n, np.int64),
                                                  np.empty(n, np.int64)))
        out = aligned_empty((uniq.shape[0], grads.shape[1]), grads.dtype)
        segment_sum_into(np.ascontiguousarray(grads), inverse, out, numba.get_num_threads())
        return uniq.astype(key_np, copy=False), out

    keys, sums = numpy_call(run, [flat, dy], [params.id_dtype, dy.dtype], name="sum_by_key")
    keys.set_shape([None])
    sums.set_shape([None, params.dim])
    return tf.IndexedSlices(sums, _mark_distinct(keys))


def embedding_lookup_unique(params, ids, partition_strategy=None, name=None,
                            validate_indices=None, max_norm=None, return_trainable=False):
    """``embedding_lookup`` that looks each distinct id up once (:func:`unique_lookup`)."""
    _check_params(params)
    params = _single(params)
    if isinstance(params, (list, tuple)):
        return embedding_lookup(params, ids, name=name or "embedding_lookup_unique",
                                max_norm=max_norm, return_trainable=return_trainable)
    ids = params.keys_in(ids, "ids")
    with tf.name_scope(name or "embedding_lookup_unique"):
        train = mode.is_training() and params.trainable
        emb = unique_lookup(params, ids, params.trainable_handle.value() if train else None)
        if max_norm is not None:
            emb = tf.clip_by_norm(emb, max_norm, axes=[-1])
    return (emb, params) if return_trainable else emb


# ---- sparse ------------------------------------------------------------------------------
def _values(sp, name):
    if isinstance(sp, tf.SparseTensor):
        return sp.values
    if isinstance(sp, tf.RaggedTensor):
        return sp.flat_values
    raise TypeError(f"{name} must be a tf.SparseTensor or tf.RaggedTensor, got {type(sp).__name__}")


def _with_values(sp, values):
    if isinstance(sp, tf.SparseTensor):
        return tf.SparseTensor(sp.indices, values, sp.dense_shape)
    return sp.with_flat_values(values)


def _retain(sp, keep):
    if sp is None:
        return None
    if isinstance(sp, tf.SparseTensor):
        return tf.sparse.retain(sp, keep)
    return tf.ragged.boolean_mask(sp, sp.with_flat_values(keep))


def _check_sparse(params, sp_ids, sp_weights, combiner):
    """The ids tensor of ``sp_ids``; raises TypeError / ValueError naming the argument."""
    _check_params(params)
    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of {COMBINERS}, got {combiner!r}")
    ids = _first(params).keys_in(_values(sp_ids, "sp_ids"), "sp_ids")
    if sp_weights is not None:
        if type(sp_weights) is not type(sp_ids):
            raise TypeError(f"sp_weights must be None or a {type(sp_ids).__name__} like sp_ids, "
                            f"got {type(sp_weights).__name__}")
        w = _values(sp_weights, "sp_weights")
        if not w.dtype.is_floating:
            raise TypeError(f"sp_weights must hold floats, got {w.dtype.name}")
        same = (w.shape.is_compatible_with(ids.shape) and
                (sp_weights.indices.shape.is_compatible_with(sp_ids.indices.shape)
                 if isinstance(sp_ids, tf.SparseTensor)
                 else sp_weights.shape.is_compatible_with(sp_ids.shape)))
        if not same:
            raise ValueError("sp_weights must have the shape of sp_ids (one weight per id), "
                             f"got {w.shape} weights for {ids.shape} ids")
    return ids


def embedding_lookup_sparse(params, sp_ids, sp_weights, partition_strategy=None, name=None,
                            combiner=None, max_norm=None, return_trainable=False):
    """Combined rows of a ``tf.SparseTensor`` / ``tf.RaggedTensor`` of ids, one per
    row of ``sp_ids`` (shape ``[d0, dim]``), as ``tf.nn.embedding_lookup_sparse``.

    ``combiner``: "sum", "mean" (default) or "sqrtn"; ``sp_weights`` (same structure
    as ``sp_ids``, floats) or None for weight 1.
    """
    combiner = combiner or "mean"
    ids = _check_sparse(params, sp_ids, sp_weights, combiner)
    with tf.name_scope(name or "embedding_lookup_sparse"):
        uniq, idx = tf.unique(ids, out_idx=tf.int64)
        rows = embedding_lookup(params, uniq, max_norm=max_norm)
        emb = tf.nn.embedding_lookup_sparse(rows, _with_values(sp_ids, idx), sp_weights,
                                            combiner=combiner)
    return (emb, params) if return_trainable else emb


def embedding_lookup_sparse_many(params, sp_ids, sp_weights, combiners):
    """``[embedding_lookup_sparse(params[t], sp_ids[t], sp_weights[t], combiner=
    combiners[t]) for each t]`` (the same math and results), with every table's
    distinct ids looked up in one op (:func:`lookup_many`); a list of variables in
    ``params`` (an id-split table) is looked up on its own.  SOK's
    ``lookup_sparse`` (``de.sok``)."""
    if any(isinstance(p, (list, tuple)) for p in params):
        return [embedding_lookup_sparse(p, i, w, combiner=c)
                for p, i, w, c in zip(params, sp_ids, sp_weights, combiners)]
    parts = [tf.unique(_check_sparse(p, i, w, c), out_idx=tf.int64)
             for p, i, w, c in zip(params, sp_ids, sp_weights, combiners)]
    train = mode.is_training()
    handles = [p.trainable_handle.value() if train and p.trainable else None for p in params]
    rows = lookup_many(params, [u for u, _ in parts], handles)
    return [tf.nn.embedding_lookup_sparse(r, _with_values(i, idx), w, combiner=c)
            for r, (_, idx), i, w, c in zip(rows, parts, sp_ids, sp_weights, combiners)]


def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None,
                                 combiner="mean", default_id=None, name=None,
                                 partition_strategy="div", max_norm=None, return_trainable=False):
    """As ``tf.nn.safe_embedding_lookup_sparse``, with TFRA's rule for ids: every id is
    a key, negative ones included (``tf.nn`` prunes ids < 0 as invalid row numbers of a
    dense table; a hash table has no invalid key).  Unless ``combiner == "sum"``, ids
    of weight <= 0 are pruned; a row left empty gets the row of ``default_id``, or
    zeros.  ``sparse_ids`` of rank > 2 give ``[d0, ..., d(n-1), dim]``.
    A ``tf.RaggedTensor`` must have rank 2 (as TF's); it may have int32 or int64 row
    splits and any number of rows, zero included.
    """
    params = embedding_weights
    ids = _check_sparse(params, sparse_ids, sparse_weights, combiner)
    if isinstance(sparse_ids, tf.RaggedTensor):
        # Combined as the SparseTensor it describes (same math, values in the same order):
        # TF's ragged kernels need int64 row splits and fail on a batch of zero rows.
        if sparse_ids.shape.rank != 2:
            raise ValueError(f"sparse_ids: a tf.RaggedTensor must have rank 2 [rows, ids], got "
                             f"shape {sparse_ids.shape}; pass .to_sparse() for higher ranks")
        sparse_ids = sparse_ids.to_sparse()
        sparse_weights = None if sparse_weights is None else sparse_weights.to_sparse()
    with tf.name_scope(name or "safe_embedding_lookup_sparse"):
        if sparse_weights is not None and combiner != "sum":
            keep = _values(sparse_weights, "sparse_weights") > 0
            sparse_ids, sparse_weights = _retain(sparse_ids, keep), _retain(sparse_weights, keep)
        ids = _values(sparse_ids, "sparse_ids")
        if default_id is not None:     # first, so tf.unique gives it position 0
            ids = tf.concat([tf.constant([default_id], ids.dtype), ids], 0)
        uniq, idx = tf.unique(ids, out_idx=tf.int64)
        rows = embedding_lookup(params, uniq, max_norm=max_norm)
        if default_id is None:         # position 0: a zero row, for rows TF fills and zeroes
            rows, idx = tf.pad(rows, [[1, 0], [0, 0]]), idx + 1
        else:
            idx = idx[1:]
        emb = tf.nn.safe_embedding_lookup_sparse(
            rows, _with_values(sparse_ids, idx), sparse_weights, combiner=combiner,
            default_id=None if default_id is None else 0)
    return (emb, params) if return_trainable else emb
