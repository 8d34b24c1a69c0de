"""Serving export: one call writes a SavedModel that needs nothing but TensorFlow.

:func:`export_for_serving` traces the model's forward pass with every dynamic
table frozen into a :class:`~tf_bridge.serving.ServingTable` (a
``tf.lookup.StaticHashTable`` ``key -> row`` plus a ``tf.Variable`` of rows,
and the initializer's value of unknown ids computed with TF ops, bit for bit
as training computes it).  The traced graph holds no ``tf.numpy_function``, so
the SavedModel loads and serves in a process that has only TensorFlow.

How tables are frozen: while tracing, ``tf_bridge.Variable`` lookups (so
``embedding_lookup``, ``embedding_lookup_sparse``,
``safe_embedding_lookup_sparse``, ``Variable.lookup`` and every Keras layer
built on them) read a ServingTable made on first use from a snapshot of the
table.  The sparse and ragged combiners are TF's own ops on the looked-up
rows, exactly as in training, so served outputs equal the live model's in
inference mode (unknown ids get the initializer's value, nothing is inserted).
While it traces, the process-wide de mode is inference (as TFRA requires for
export): do not train in another thread meanwhile.

>>> import os, tempfile, tensorflow as tf, tf_bridge as de
>>> v = de.Variable(dim=2, name="doc_export", initializer=tf.keras.initializers.Ones())
>>> v.upsert(tf.constant([7], tf.int64), tf.ones([1, 2]))
>>> class Model(tf.Module):
...     def __call__(self, ids):                        # ids: (batch, n) int64
...         return tf.reduce_sum(de.embedding_lookup(v, ids), axis=1)
>>> d = tempfile.TemporaryDirectory()
>>> path = export_for_serving(Model(), os.path.join(d.name, "sm"),
...                           [tf.TensorSpec([None, None], tf.int64, name="ids")])
>>> served = tf.saved_model.load(path)                 # a fresh process needs only TF
>>> served.serve(tf.constant([[7, 7]], tf.int64)).numpy().tolist()
[[2.0, 2.0]]
>>> sorted(served.signatures["serving_default"].structured_input_signature[1])
['ids']
>>> d.cleanup()

The SavedModel holds:

* ``serve(*inputs)``: the forward pass, taking the inputs as described by
  ``input_signature`` (dense ``tf.Tensor``, ``tf.SparseTensor`` and
  ``tf.RaggedTensor`` alike).
* ``signatures["serving_default"]`` (when the outputs are dense tensors): the
  same function with flat, named tensor inputs for TF Serving; a dense input
  ``x`` is ``x``, a sparse one is ``x_indices`` (nnz, rank) int64, ``x_values``
  (nnz,), ``x_dense_shape`` (rank,) int64, a ragged one is ``x_values`` (the
  flat values) and ``x_row_splits`` (``x_row_splits_1``, ... for inner ragged
  dimensions); outputs are ``output_0``, ... (or the model's dict keys).
* ``tables``: a dict ``table name -> ServingTable``; ``lookup_<name>(ids)``
  tf.functions (ids: int64 of any shape, or strings for a string-key table ->
  ``ids.shape + [dim]``).
"""
import contextlib
import re
import threading

import tensorflow as tf

from . import mode
from .serving import ServingTable
from .serving_hooks import _SERVING
from .variable import Variable

__all__ = ["export_for_serving", "serving_lookups"]

_PY_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
_EXPORT_LOCK = threading.RLock()    # the de mode is process-wide: one export at a time


def _identifier(name, taken):
    base = re.sub(r"\W", "_", name or "table") or "table"
    if base[0].isdigit():
        base = "t_" + base
    out, i = base, 1
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    return out


class _Freezer:
    """The lookup hook: one ServingTable per variable, made on first use."""

    def __init__(self, feeds=None):
        self.feeds = feeds        # TF1 graphs: tables' values fed (see ServingTable)
        self.tables = {}          # id(variable) -> (variable, name, ServingTable)
        self.used = set()         # ids of the variables a traced lookup read
        self.sources = {}         # id(variable) -> the table to freeze (split ones: gathered)

    def table(self, var):
        entry = self.tables.get(id(var))
        if entry is None:
            if var._pending is not None:
                raise ValueError(
                    f"de.Variable {var.name!r} has a callable initializer "
                    f"({type(var.initializer).__name__}): its values for unknown ids are random "
                    "draws that TensorFlow ops cannot reproduce.  Use None, a constant or a "
                    "Keras/numbaemb Zeros/Constant/RandomNormal/RandomUniform/TruncatedNormal "
                    "initializer to serve it")
            name = _identifier(var.name, {e[1] for e in self.tables.values()})
            with tf.init_scope():
                entry = (var, name, ServingTable(self.sources.get(id(var), var.table),
                                                 name=name, feeds=self.feeds))
            self.tables[id(var)] = entry
        return entry[2]

    @tf.autograph.experimental.do_not_convert        # plain TF ops: nothing to convert
    def __call__(self, var, keys, return_exists):
        self.used.add(id(var))
        return self.table(var).lookup(keys, return_exists=return_exists)


@contextlib.contextmanager
def serving_lookups():
    """Within this block (this thread), lookups of ``tf_bridge.Variable`` read frozen
    TF-native :class:`ServingTable` copies.  Yields the freezer;
    ``freezer.tables`` maps ``id(variable) -> (variable, name, ServingTable)``.

    The de mode (process-wide, as TFRA's) is inference inside the block, so lookups
    carry no training gradient; lookups in other threads that start meanwhile are
    not differentiable either: do not train while exporting.

    >>> import tensorflow as tf, tf_bridge as de
    >>> v = de.Variable(dim=1, name="doc_freeze", initializer=3.0)
    >>> spec = tf.TensorSpec([None], tf.int64)
    >>> with serving_lookups() as f:
    ...     graph = tf.function(lambda i: v.lookup(i)).get_concrete_function(spec).graph
    >>> [e[1] for e in f.tables.values()], [o.type for o in graph.get_operations() if "Py" in o.type]
    (['doc_freeze'], [])
    """
    if getattr(_SERVING, "hook", None) is not None:
        raise RuntimeError("serving_lookups() blocks do not nest")
    with _EXPORT_LOCK:
        freezer, old_mode = _Freezer(), mode.get_model_mode()
        _SERVING.hook = freezer
        mode.enable_inference_mode()
        try:
            yield freezer
        finally:
            _SERVING.hook = None
            if old_mode == mode.ModelMode.TRAIN:
                mode.enable_train_mode()


# ---- input signatures -------------------------------------------------------------------
def _spec_of_keras_tensor(kt):
    shape = [None] + list(kt.shape)[1:] if len(kt.shape) else []
    dtype = tf.as_dtype(kt.dtype)
    name = getattr(kt, "name", None)
    if getattr(kt, "sparse", False):
        return tf.SparseTensorSpec(shape, dtype)
    if getattr(kt, "ragged", False):
        rank = getattr(kt, "ragged_rank", None) or max(len(shape) - 1, 1)
        return tf.RaggedTensorSpec(shape, dtype, ragged_rank=rank, row_splits_dtype=tf.int64)
    return tf.TensorSpec(shape, dtype, name=name)


def _keras_input_names(model):
    struct = getattr(model, "_inputs_struct", None)
    if struct is None:
        struct = getattr(getattr(model, "_functional", None), "_inputs_struct", None)
    try:
        return [getattr(t, "name", None) for t in tf.nest.flatten(struct)] if struct else None
    except TypeError:
        return None


def _input_signature(model, input_signature):
    if input_signature is not None:
        if isinstance(input_signature, tf.TypeSpec):
            input_signature = [input_signature]
        if not isinstance(input_signature, (list, tuple)):
            raise TypeError("input_signature must be a list of tf.TensorSpec / "
                            "tf.SparseTensorSpec / tf.RaggedTensorSpec (nested structures "
                            f"allowed), one per positional argument; got "
                            f"{type(input_signature).__name__}")
        for s in tf.nest.flatten(input_signature):
            if not isinstance(s, tf.TypeSpec):
                raise TypeError(f"input_signature must hold tf.TypeSpecs, got {s!r}")
        return list(input_signature)
    struct = getattr(model, "_inputs_struct", None)     # Keras functional
    if struct is None:                                 # Keras sequential
        struct = getattr(getattr(model, "_functional", None), "_inputs_struct", None)
    if struct is None and getattr(model, "inputs", None):
        struct = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    if struct is None:
        raise ValueError("input_signature is needed: the model has no Keras inputs to derive "
                         "it from (pass e.g. [tf.TensorSpec([None, None], tf.int64)])")
    return [tf.nest.map_structure(_spec_of_keras_tensor, struct)]


def _with_paths(struct, path):
    """``("0/bag", spec)`` pairs in ``tf.nest.flatten`` order (dicts by sorted key)."""
    if isinstance(struct, dict):
        for k in sorted(struct):
            yield from _with_paths(struct[k], path + (str(k),))
    elif isinstance(struct, (list, tuple)):
        for i, v in enumerate(struct):
            yield from _with_paths(v, path + (str(i),))
    else:
        yield "/".join(path), struct


def _component_names(signature, keras_names):
    """Names of the flat tensor components of ``signature`` (for the serving signature)."""
    paths_leaves = list(_with_paths(signature, ()))
    leaves = tf.nest.flatten(signature)
    if len(paths_leaves) != len(leaves):        # an unusual structure: plain names
        paths_leaves = [(str(i), spec) for i, spec in enumerate(leaves)]
    names, taken = [], set()
    for i, (path, spec) in enumerate(paths_leaves):
        base = getattr(spec, "name", None)
        if not base and keras_names and len(keras_names) == len(leaves):
            base = keras_names[i]
        if not base:                    # the structure's keys, e.g. [{"bag": spec}] -> bag
            parts = path.split("/")
            parts = parts[1:] if len(signature) == 1 and len(parts) > 1 else parts
            base = "_".join(parts) if not parts[-1].isdigit() or len(parts) > 1 else ""
        base = _identifier(base or f"input_{i}", taken)
        taken.add(base)
        parts = tf.nest.flatten(spec, expand_composites=True)
        if isinstance(spec, tf.SparseTensorSpec):
            suffixes = ["_indices", "_values", "_dense_shape"]
        elif isinstance(spec, tf.RaggedTensorSpec):
            suffixes = ["_values", "_row_splits"] + [f"_row_splits_{k}" for k in
                                                     range(1, len(parts) - 1)]
        elif isinstance(spec, tf.TensorSpec):
            suffixes = [""]
        else:
            suffixes = [f"_{k}" for k in range(len(parts))]
        if len(suffixes) != len(parts):
            suffixes = [f"_{k}" for k in range(len(parts))]
        names += [base + s for s in suffixes]
    return names


def _output_dict(out):
    if isinstance(out, dict) and all(isinstance(v, tf.Tensor) for v in out.values()):
        return {str(k): v for k, v in out.items()}
    flat = tf.nest.flatten(out, expand_composites=False)
    if all(isinstance(v, tf.Tensor) for v in flat):
        return {f"output_{i}": v for i, v in enumerate(flat)}
    return None


def _python_ops(graph):
    gd = graph.as_graph_def()
    ops = {n.op for n in gd.node}
    for f in gd.library.function:
        ops.update(n.op for n in f.node_def)
    return sorted(ops & _PY_OPS)


def _captured_resources(model, concretes):
    """TF resources (other than variables) that the traced functions capture and that
    ``model`` owns, e.g. the hash tables of Keras lookup layers."""
    if not isinstance(model, tf.__internal__.tracking.Trackable):
        return []
    captured = {id(t) for c in concretes for t in c.captured_inputs}
    try:
        objs = tf.train.TrackableView(model).descendants()
    except Exception:           # an exotic object graph: let tf.saved_model.save report
        return []
    return [o for o in objs if isinstance(o, tf.saved_model.experimental.TrackableResource)
            and id(getattr(o, "_resource_handle", None)) in captured]


def _reachable_variables(model):
    """``tf_bridge.Variable`` objects tracked by ``model`` (Keras layers, tf.Modules)."""
    if not isinstance(model, tf.__internal__.tracking.Trackable):
        return []
    try:
        return [o for o in tf.train.TrackableView(model).descendants() if isinstance(o, Variable)]
    except Exception:           # an exotic object graph: tables are then made while tracing
        return []


def _caller(model, fn):
    if fn is not None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        return fn
    import keras
    if isinstance(model, keras.layers.Layer):
        return lambda *args: model(*args, training=False)
    if not callable(model):
        raise TypeError(f"model must be a Keras model/layer or a callable (or pass fn=), got "
                        f"{type(model).__name__}")
    return model


def export_for_serving(model, path, input_signature=None, *, fn=None, signatures=True,
                       options=None) -> str:
    """Write a SavedModel at ``path`` that serves ``model`` with TensorFlow ops only.

    Every ``tf_bridge.Variable`` the forward pass looks up is frozen into a
    TF-native table (a snapshot taken now): known ids return their trained rows,
    unknown ids the initializer's value (bit-exact), as ``model`` in inference
    mode does.  The result loads with ``tf.saved_model.load`` (or TF Serving) in
    a process without numbaemb or tf_bridge.

    Args:
      model: a Keras model or layer (called as ``model(*inputs, training=False)``),
        a ``tf.Module`` or any callable; its dense weights go into the SavedModel.
      path: directory to write.
      input_signature: a list with one spec per positional argument:
        ``tf.TensorSpec`` (dense int ids ``[batch, ...]``, or any other dense
        input), ``tf.SparseTensorSpec`` (``[batch, None]`` ids), ``tf.RaggedTensorSpec``
        (``[batch, None]`` ids), or nested structures of them.  Default for Keras
        functional / sequential models: derived from ``model.inputs`` (sparse and
        ragged inputs included), batch dimension None.
      fn: the function to export instead of calling ``model`` (e.g. a tower);
        ``model`` is then only searched for resources it captures.
      signatures: also write a ``"serving_default"`` signature with flat named
        tensor inputs (see the module docstring).  Only when the outputs are
        dense tensors.
      options: ``tf.saved_model.SaveOptions``.
    Returns:
      ``path``.
    Raises:
      ValueError: a table has a callable (non-reproducible) initializer, or the
        forward pass calls back into Python (``tf.numpy_function``) for anything
        other than a table lookup, e.g. ``Variable.size()``.
      TypeError: bad ``model`` / ``fn`` / ``input_signature``.

    Example (Keras; ``ids`` dense ``(batch, 3)``, ``bag`` ragged ``(batch, None)``)::

        ids = keras.Input((3,), dtype="int64", name="ids")
        bag = keras.Input((None,), dtype="int64", ragged=True, name="bag")
        model = keras.Model([ids, bag], ...de.keras.layers.Embedding(...)...)
        de.export_for_serving(model, "/srv/model/1")
        # fresh process: tf.saved_model.load("/srv/model/1").serve([ids, bag])
    """
    call = _caller(model, fn)
    signature = _input_signature(model, input_signature)
    split = [v for v in _reachable_variables(model) if v.distributed]
    if split:                   # collective: rank 0 gets every row and writes alone
        from .distributed.saving import _on_rank0, gather_table
        gathered = {id(v): gather_table(v) for v in split}
        # every rank returns the path, or raises if rank 0 failed to write
        return _on_rank0(lambda: _export(model, path, call, signature, signatures, options,
                                         gathered), f"SavedModel {path!r}")
    return _export(model, path, call, signature, signatures, options, {})


def _export(model, path, call, signature, signatures, options, sources):
    serve = tf.function(call, input_signature=signature)
    with serving_lookups() as freezer:
        freezer.sources = sources
        # Tables made before tracing: a trace that creates variables is traced twice.
        for var in _reachable_variables(model):
            if var._pending is None:
                freezer.table(var)
        concretes = [serve.get_concrete_function()]
        sig_fns = {}
        if signatures:
            names = _component_names(signature, _keras_input_names(model))
            flat_specs = [tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in
                          zip(tf.nest.flatten(signature, expand_composites=True), names)]

            def flat_call(*flat):           # calls the traced forward pass: no retrace
                args = tf.nest.pack_sequence_as(signature, list(flat), expand_composites=True)
                return _output_dict(concretes[0](*args))

            if _output_dict(concretes[0].structured_outputs) is not None:
                sig = tf.function(flat_call, input_signature=flat_specs, autograph=False)
                concretes.append(sig.get_concrete_function())
                sig_fns["serving_default"] = concretes[-1]
        for c in concretes:
            bad = _python_ops(c.graph)
            if bad:
                raise ValueError(f"the forward pass calls back into Python ({', '.join(bad)}) "
                                 "outside table lookups, so the SavedModel would not load in a "
                                 "fresh process; remove e.g. Variable.size()/export() or "
                                 "tf.numpy_function calls from it")
        root = tf.Module()
        root.tables = {name: table for key, (_, name, table) in freezer.tables.items()
                       if key in freezer.used}
        for name, table in root.tables.items():
            setattr(root, f"lookup_{name}",
                    tf.function(table.lookup, input_signature=[
                        tf.TensorSpec(None, tf.string if table.strings else tf.int64)],
                        autograph=False))
        root.model_variables = [v for c in concretes for v in c.variables]
        root.model_resources = _captured_resources(model, concretes)
        root.serve = serve
        tf.saved_model.save(root, path, signatures=sig_fns or None, options=options)
    return path
