"""Serving export from a TF1 graph: a SavedModel of a ``tf.compat.v1`` session's graph
in which every table lookup is a TF-native op, so it loads without numbaemb.

In a TF1 graph each table lookup is a ``tf.numpy_function`` op.  Each one
records (``tf_bridge.serving_hooks.register_serving``) how to compute its outputs
with a frozen :class:`~tf_bridge.serving.ServingTable` instead.  :func:`export_graph_for_serving`
takes the part of the session's graph that computes ``outputs``, freezes its
dense variables to constants (values read from the session), replaces each
lookup op with the native ops its registration builds (same outputs: known
ids their rows, unknown ids the initializer's value, nothing inserted) and
writes a TF1 SavedModel (``tf.compat.v1.saved_model.Builder``, tag ``serve``,
signature ``serving_default``) whose tables' keys and rows are variables, so
the graph stays small whatever the table size.

    with tf.compat.v1.Session() as sess:
        ...train...
        de.export_graph_for_serving(sess, "/srv/model/1", inputs={"ids": ids},
                                    outputs={"score": score})
    # anywhere: tf.saved_model.load("/srv/model/1").signatures["serving_default"](ids=...)
"""
import os
import shutil

import tensorflow as tf

from .export import _PY_OPS, serving_lookups
from .serving_hooks import _SERVE_OPS

__all__ = ["export_graph_for_serving"]


def _node(name):
    return name.lstrip("^").split(":")[0]


def _tensors(sess, what, arg):
    if not isinstance(what, dict) or not what:
        raise TypeError(f"{arg} must be a non-empty dict of name -> tf.Tensor, got "
                        f"{type(what).__name__}")
    for k, t in what.items():
        if not isinstance(k, str) or not isinstance(t, tf.Tensor) or t.graph is not sess.graph:
            raise TypeError(f"{arg}[{k!r}] must be a tf.Tensor of the session's graph, got "
                            f"{type(t).__name__}")
    return what


def export_graph_for_serving(sess, path, inputs, outputs):
    """Write a TF1 SavedModel at ``path`` that computes ``outputs`` from ``inputs`` with
    TensorFlow ops only (see the module docstring).

    Args:
      sess: the ``tf.compat.v1.Session`` holding the trained graph (dense variables
        are read from it).
      path: directory to create (it must not exist; written to a temporary
        directory beside it, then renamed).
      inputs: dict ``name -> tf.Tensor`` (placeholders, typically).
      outputs: dict ``name -> tf.Tensor``.
    Returns:
      ``path``.
    Raises:
      TypeError: bad ``sess`` / ``inputs`` / ``outputs``.
      ValueError: ``path`` exists; ``outputs`` depend on a ``tf.numpy_function`` that
        is not a table lookup (e.g. ``Variable.size()``); a table's initializer is
        callable (random draws TF ops cannot reproduce).
    """
    if not isinstance(sess, tf.compat.v1.Session):
        raise TypeError(f"sess must be a tf.compat.v1.Session, got {type(sess).__name__}")
    inputs, outputs = _tensors(sess, inputs, "inputs"), _tensors(sess, outputs, "outputs")
    path = os.fspath(path)
    if os.path.exists(path):
        raise ValueError(f"path {path!r} exists: the SavedModel goes into a new directory")
    graph, serve_of = sess.graph, _SERVE_OPS.get(sess.graph, {})
    ends = sorted({t.op.name for t in outputs.values()} | {t.op.name for t in inputs.values()})
    needed = tf.compat.v1.graph_util.extract_sub_graph(graph.as_graph_def(), ends)
    lookups = [n for n in needed.node if n.op in _PY_OPS]
    other = [n.name for n in lookups if n.name not in serve_of]
    if other:
        raise ValueError(f"the outputs depend on Python calls that are not table lookups "
                         f"({', '.join(other)}), so the SavedModel would not load in a fresh "
                         "process; remove e.g. Variable.size()/export() or tf.numpy_function "
                         "calls from the serving path")
    frozen = tf.compat.v1.graph_util.convert_variables_to_constants(sess, needed, ends)
    tmp = f"{path}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(frozen, {n.name for n in lookups}, serve_of, inputs, outputs, tmp)
        os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _write(frozen, lookups, serve_of, inputs, outputs, path):
    py_inputs = sorted({_node(i) for n in frozen.node if n.name in lookups for i in n.input
                        if not i.startswith("^")})
    pre = tf.compat.v1.graph_util.extract_sub_graph(frozen, py_inputs) if py_inputs else None
    pre_names = {n.name for n in pre.node} if pre is not None else set()
    if pre_names & lookups:
        raise ValueError("a table lookup's ids come from another table lookup; export the "
                         "graph with the ids as inputs")
    g, feeds = tf.Graph(), {}
    with g.as_default(), serving_lookups() as freezer:
        freezer.feeds = feeds
        if pre is not None:
            tf.compat.v1.import_graph_def(pre, name="")
        mapping = {}
        for node in frozen.node:
            if node.name in lookups:
                ins = [g.get_tensor_by_name(i if ":" in i else i + ":0") for i in node.input
                       if not i.startswith("^")]
                with tf.name_scope(node.name + "_serving"):
                    outs = serve_of[node.name](freezer.table, ins)
                mapping.update({f"{node.name}:{k}": t for k, t in enumerate(outs)})
        rest = tf.compat.v1.GraphDef()
        rest.versions.CopyFrom(frozen.versions)
        rest.library.CopyFrom(frozen.library)
        kept = [n for n in frozen.node if n.name not in lookups and n.name not in pre_names]
        kept_names = {n.name for n in kept}
        for n in kept:
            m = rest.node.add()
            m.CopyFrom(n)
            del m.input[:]        # control inputs on dropped nodes are dropped
            m.input.extend(i for i in n.input
                           if not (i.startswith("^") and _node(i) not in kept_names))
        outside = lookups | pre_names      # nodes the rest reads from the new graph
        used = {i if ":" in i else i + ":0" for n in rest.node for i in n.input
                if not i.startswith("^") and _node(i) in outside}
        input_map = {name: mapping[name] if _node(name) in lookups else g.get_tensor_by_name(name)
                     for name in used}
        tf.compat.v1.import_graph_def(rest, input_map=input_map, name="")

        def find(t):
            return mapping[t.name] if t.name in mapping else g.get_tensor_by_name(t.name)
        signature = tf.compat.v1.saved_model.predict_signature_def(
            inputs={k: find(t) for k, t in inputs.items()},
            outputs={k: find(t) for k, t in outputs.items()})
        init_tables = tf.compat.v1.tables_initializer()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer(), feed_dict=feeds)
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], signature_def_map={"serving_default": signature},
                main_op=init_tables, strip_default_attrs=True)
            builder.save()
