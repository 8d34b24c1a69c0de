"""Checkpoints of dynamic tables: ``tf.train.Checkpoint`` and Keras ``.keras`` files.

A table's state travels as four arrays (:func:`table_state`), the same in both
formats:

================  ==========  ===================================================
name              shape       content
================  ==========  ===================================================
``keys``          (n,)        every key, in the table's key dtype
``values``        (n, dim)    their embeddings, in the value dtype
``columns``       ()          JSON (str): the table's configuration and the layout
                              of its extra columns (name, width, dtype, initializer)
``column_bytes``  (n, B)      uint8: the extra row-aligned columns of each key
                              (optimizer slots such as ``"Adam/m"``, policy
                              scores), their bytes side by side in ``columns`` order
================  ==========  ===================================================

Why extra columns go as bytes under fixed names: ``tf.train.Checkpoint``
restores exactly the tensors that the *restoring* object's
``_serialize_to_tensors`` names, with its dtypes.  A freshly built variable has
no optimizer slots yet, so per-slot names would silently skip them; fixed
names make every column round-trip into any variable.

Restoring replaces the whole content and routes every key through the
restoring table's own partitioner, so a table saved with N shards restores
into one with M shards (any N, M).  Columns missing in the restoring table are
created; columns it has that the checkpoint lacks start from their initial
values.

>>> import numpy as np, tensorflow as tf, tf_bridge as de
>>> v = de.Variable(dim=2, name="doc_ckpt", num_shards=3)
>>> v.upsert(tf.constant([1, -7], tf.int64), tf.constant([[1., 2.], [3., 4.]]))
>>> state = table_state(v)                    # numpy arrays
>>> state["keys"].shape, state["values"].shape, state["column_bytes"].shape
((2,), (2, 2), (2, 0))
>>> w = de.Variable(dim=2, name="doc_ckpt2", num_shards=2)
>>> restore_table_state(w, state)
>>> w.lookup(tf.constant([-7, 1], tf.int64)).numpy().tolist()
[[3.0, 4.0], [1.0, 2.0]]

With ``tf.train.Checkpoint`` (``de.Variable`` is trackable, on its own or as
an attribute of a Keras layer / ``tf.Module``)::

    ckpt = tf.train.Checkpoint(model=model, emb=user_var)
    path = ckpt.save("/tmp/ckpt/run")
    tf.train.Checkpoint(model=model2, emb=user_var2).restore(path)

For Keras ``model.save("m.keras")`` / ``keras.models.load_model``, a layer that
owns ``de.Variable`` attributes inherits :class:`KerasTableSaving`.
"""
import base64
import contextlib
import json
import warnings

import numpy as np
import tensorflow as tf

import numbaemb
from numbaemb import _checks
from numbaemb.bounded import BUCKET, SCORE, highest_first

__all__ = ["table_state", "restore_table_state", "KerasTableSaving", "STATE_NAMES", "saveable",
           "FORMAT"]

FORMAT = "tf_bridge.table_state"
FORMAT_VERSION = 1
STATE_NAMES = ("keys", "values", "columns", "column_bytes")


def _table(variable):
    """The numbaemb table of a ``tf_bridge.Variable`` (or a numbaemb ``Variable`` itself)."""
    if isinstance(variable, numbaemb.Variable):
        return variable
    table = getattr(variable, "table", None)
    if not isinstance(table, numbaemb.Variable):
        raise TypeError("variable must be a tf_bridge.Variable or a numbaemb.Variable, got "
                        f"{type(variable).__name__}")
    return table


def _init_json(init):
    kind, a, b, seed, const = init
    return {"kind": int(kind), "a": float(a), "b": float(b), "seed": int(seed),
            "const": np.asarray(const, np.float64).reshape(-1).tolist()}


def _init_tuple(d):
    return (int(d["kind"]), float(d["a"]), float(d["b"]), int(d["seed"]),
            np.asarray(d["const"], np.float64).reshape(-1))


def _strings(table):
    return table.key_dtype == _checks.STRING


def _host(table, a):
    return np.asarray(table._arrays.host(a))


def _fill_initial(init, keys, width, dtype):
    """Initial values ``(n, width)`` of a column for int64 ``keys`` (n,)."""
    from jit_kernels import cpu_table
    out = np.empty((keys.shape[0], width), dtype)
    cpu_table.init_rows(out, np.arange(keys.shape[0], dtype=np.int64), keys,
                        np.ones(keys.shape[0], np.bool_), *init)
    return out


# ---- export ----------------------------------------------------------------------------
def table_state(variable) -> dict:
    """Every key of ``variable`` with its embedding and all extra columns, as numpy arrays.

    Args:
      variable: a ``tf_bridge.Variable`` or a ``numbaemb.Variable``.
    Returns:
      ``{"keys": (n,), "values": (n, dim), "columns": str (JSON), "column_bytes": (n, B) uint8}``
      (see the module docstring), taken under the table's read lock, so one
      consistent snapshot even while other threads train.

    >>> import numpy as np, numbaemb as ne
    >>> v = ne.Variable(dim=2)
    >>> ne.optimizers.apply_gradients(v, ne.optimizers.Adagrad(), np.array([5]),
    ...                               np.ones((1, 2)), step=1)
    >>> s = table_state(v)
    >>> [c["name"] for c in json.loads(s["columns"])["columns"]], s["column_bytes"].shape
    (['Adagrad/accumulator'], (1, 8))
    """
    table = _table(variable)
    with table._lock.read():
        names, layout = ["values"], {}
        for shard in table.shards:
            for name, col in shard.columns.items():
                if name not in layout:
                    layout[name] = (int(col.data.shape[1]), np.dtype(col.data.dtype), col.init)
                    if name != "values":
                        names.append(name)
        keys_parts, parts = [], {n: [] for n in names}
        for shard in table.shards:         # slot order is fixed while the lock is held
            keys, values = shard.export("values")
            keys = _host(table, keys).astype(np.int64, copy=False)
            keys_parts.append(keys)
            parts["values"].append(_host(table, values))
            for name in names[1:]:
                if name in shard.columns:
                    parts[name].append(_host(table, shard.export(name)[1]))
                else:                       # never happens through the public APIs
                    width, dt, init = layout[name]
                    parts[name].append(_fill_initial(init, keys, width, dt))
        keys = np.concatenate(keys_parts) if keys_parts else np.empty(0, np.int64)
        # a string table's keys are its strings (ids are this process's own assignment)
        saved_keys = table.names.strings(keys) if _strings(table) else keys.astype(table.key_dtype)
    n = keys.shape[0]
    columns, blobs, offset = [], [], 0
    for name in names[1:]:
        width, dt, init = layout[name]
        data = np.ascontiguousarray(np.concatenate(parts[name]).reshape(n, width).astype(dt))
        nbytes = width * dt.itemsize
        blobs.append(data.view(np.uint8).reshape(n, nbytes))
        columns.append({"name": name, "width": width, "dtype": dt.str, "offset": offset,
                        "nbytes": nbytes, "init": _init_json(init)})
        offset += nbytes
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "dim": int(table.dim),
            "key_dtype": _checks.dtype_name(table.key_dtype), "value_dtype": table.value_dtype.name,
            "num_shards": int(table.num_shards), "size": int(n), "row_bytes": offset,
            "columns": columns, **_extra_state(table)}
    values = np.concatenate(parts["values"]).reshape(n, table.dim)
    values = values.view(table.value_dtype) if table._store != table.value_dtype else values
    column_bytes = (np.concatenate(blobs, axis=1) if blobs else np.empty((n, 0), np.uint8))
    return {"keys": saved_keys, "values": np.ascontiguousarray(values),
            "columns": json.dumps(meta), "column_bytes": np.ascontiguousarray(column_bytes)}


# ---- restore ---------------------------------------------------------------------------
def _bad(what):
    return ValueError(f"table state is corrupt or does not fit: {what}")


def _meta(columns):
    """The JSON description of a state's columns (a str, bytes or 0-d array) as a dict."""
    if isinstance(columns, np.ndarray):
        columns = columns.item() if columns.dtype.kind in "SUO" else columns.tobytes()
    if isinstance(columns, bytes):
        columns = columns.decode("utf-8")
    try:
        meta = json.loads(columns)
    except (TypeError, ValueError) as e:
        raise _bad(f"'columns' is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _bad(f"'columns' is not a {FORMAT} description")
    return meta


def _parse(table, state):
    """Checked ``(keys int64 (n,), values (n, dim), [(name, width, dtype, init, data)],
    names)``; ``names``: a string table's new name index (keys are its ids), else None."""
    if not isinstance(state, dict) or any(k not in state for k in STATE_NAMES):
        raise ValueError(f"state must be a dict with keys {list(STATE_NAMES)}, got "
                         f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
    meta = _meta(state["columns"])
    if meta.get("format") != FORMAT:
        raise _bad(f"'columns' is not a {FORMAT} description")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"table state format_version {meta.get('format_version')!r} is not "
                         f"supported (this tf_bridge reads {FORMAT_VERSION})")
    if meta.get("dim") != table.dim:
        raise ValueError(f"checkpointed table has dim {meta.get('dim')}, the restoring "
                         f"variable {table.name!r} has dim {table.dim}")
    if meta.get("value_dtype") != table.value_dtype.name:
        raise ValueError(f"checkpointed table has value_dtype {meta.get('value_dtype')}, the "
                         f"restoring variable {table.name!r} has {table.value_dtype.name}")
    keys = np.asarray(state["keys"])
    values = np.asarray(state["values"])
    blob = np.asarray(state["column_bytes"])
    n = keys.shape[0] if keys.ndim == 1 else -1
    if (meta.get("key_dtype") == "string") != _strings(table):
        raise ValueError(f"checkpointed table has key_dtype {meta.get('key_dtype')}, the "
                         f"restoring variable {table.name!r} has "
                         f"{_checks.dtype_name(table.key_dtype)} (string and integer keys "
                         "do not mix)")
    kinds = "SUO" if _strings(table) else "iu"
    if keys.ndim != 1 or keys.dtype.kind not in kinds or meta.get("size") != n:
        raise _bad(f"keys must be a 1-D {'string' if _strings(table) else 'integer'} array of "
                   f"{meta.get('size')} keys, got {keys.dtype}{list(keys.shape)}")
    if values.shape != (n, table.dim):
        raise _bad(f"values must have shape {(n, table.dim)}, got {values.shape}")
    row_bytes = meta.get("row_bytes")
    if blob.dtype != np.uint8 or blob.shape != (n, row_bytes):
        raise _bad(f"column_bytes must be uint8 of shape {(n, row_bytes)}, got "
                   f"{blob.dtype}{list(blob.shape)}")
    names = None
    if _strings(table):
        k64, names = _string_ids(keys)
    else:
        key_info = np.iinfo(table.key_dtype)
        k64 = keys.astype(np.int64)
        if n and (k64.min() < key_info.min or k64.max() > key_info.max):
            raise ValueError(f"checkpointed keys do not fit the restoring variable's key dtype "
                             f"{table.key_dtype.name}")
    if np.unique(k64).shape[0] != n:
        raise _bad("duplicate keys")
    cols = []
    for c in meta.get("columns", []):
        try:
            name, width, dt = c["name"], int(c["width"]), np.dtype(c["dtype"])
            off, nb, init = int(c["offset"]), int(c["nbytes"]), _init_tuple(c["init"])
        except (KeyError, TypeError, ValueError) as e:
            raise _bad(f"bad column entry {c!r} ({e})") from None
        if name == "values" or nb != width * dt.itemsize or off < 0 or off + nb > row_bytes:
            raise _bad(f"bad column entry {c!r}")
        data = np.ascontiguousarray(blob[:, off:off + nb]).view(dt).reshape(n, width)
        cols.append((name, width, dt, init, data))
    return k64, values.astype(table.value_dtype, copy=False), cols, names


def _string_ids(keys):
    """``(ids, names)``: int64 ids of the checkpoint's strings, assigned in a fresh name
    index ``names`` (the table takes it on restore: ids are each process's own)."""
    from numbaemb.string_keys import StringKeys, as_strings
    try:
        _, buf, starts = as_strings(keys, "keys")
    except TypeError as e:
        raise _bad(str(e)) from None
    names = StringKeys()
    return names.resolve(buf, starts, insert=True)[0], names


def _extra_state(table):
    """What a table keeps beside its rows: a bounded table's clock and epoch, an
    admission filter's state (its arrays as base64 in the JSON: ``columns`` is the one
    tensor whose content may vary, see the module docstring)."""
    extra = {}
    if getattr(table, "max_capacity", None) is not None:
        extra["bounded"] = {"clock": int(table._clock), "epoch": table._epoch,
                            "last_step": int(table._last_step)}
    if getattr(table, "admit", None) is not None:
        extra["admission"] = encode_filter(table.admit)
    return extra


def encode_filter(f):
    """An admission filter's state as JSON-able data (arrays as base64)."""
    from numbaemb import admission
    config, arrays = admission.state(f)
    return {"config": config, "arrays": {
        name: {"dtype": a.dtype.str, "shape": list(a.shape),
               "b64": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")}
        for name, a in arrays.items()}}


def decode_filter(entry, **settings):
    """The filter :func:`encode_filter` described, with ``settings`` (e.g. the restoring
    table's ``min_count``) over the saved ones."""
    from numbaemb import admission
    config = dict(entry["config"], **settings)
    arrays = {name: np.frombuffer(base64.b64decode(a["b64"]), np.dtype(a["dtype"]))
              .reshape(a["shape"]) for name, a in entry["arrays"].items()}
    return admission.from_state(config, arrays)


def _restored_filter(table, meta):
    """The admission filter to install after a restore (checked before anything is
    changed): the saved state under the restoring table's own filter settings; None to
    keep the table's filter (no filter, or a checkpoint without filter state)."""
    saved, current = meta.get("admission"), getattr(table, "admit", None)
    if saved is None or current is None:
        return None
    from numbaemb import admission
    try:
        kind = saved["config"].get("kind")
        now, _ = admission.state(current)
        if kind != now["kind"]:
            raise ValueError(f"the checkpoint's filter is a {kind!r} filter, the table's a "
                             f"{now['kind']!r} one")
        return decode_filter(saved, **{k: v for k, v in now.items()
                                       if k not in ("kind", "clock")})
    except (KeyError, TypeError, ValueError, base64.binascii.Error) as e:
        raise ValueError(f"cannot restore the admission filter state of {table.name!r}: "
                         f"{e}") from None


def restore_table_state(variable, state, _owned=None):
    """Replace the content of ``variable`` with ``state`` (from :func:`table_state`).

    Keys are routed through ``variable``'s own shards and partitioner (a state
    saved from N shards restores into M).  Extra columns (optimizer slots,
    policy scores) are created where missing; nothing is changed when the state
    is rejected.

    Args:
      variable: a ``tf_bridge.Variable`` or ``numbaemb.Variable`` (host or GPU memory).
      state: the dict of :func:`table_state`; arrays may be numpy or eager tensors.
    Raises:
      ValueError: the state is corrupt, or its dim / value dtype / keys do not fit.

    >>> import numpy as np, numbaemb as ne
    >>> v = ne.Variable(dim=1, num_shards=4); v.upsert(np.arange(8), np.ones((8, 1)))
    >>> w = ne.Variable(dim=1, num_shards=3); restore_table_state(w, table_state(v))
    >>> w.size(), [w.size(i) for i in range(3)]
    (8, [3, 3, 2])
    """
    table = _table(variable)
    state = {k: (v.numpy() if isinstance(v, (tf.Tensor, tf.Variable)) else v)
             for k, v in state.items()} if isinstance(state, dict) else state
    every = None
    if _owned is not None:      # a split table: this rank's rows go to its local table
        table = table.local
    keys, values, cols, names = _parse(table, state)
    if _owned is not None:      # (every rank's columns still set the policy's clock)
        every, mine = cols, _owned(keys.astype(table.key_dtype))
        keys, values = keys[mine], values[mine]
        cols = [(name, width, dt, init, data[mine]) for name, width, dt, init, data in cols]
    meta = _meta(state["columns"])
    admit = _restored_filter(table, meta)
    saved_cols = cols           # (every restored score sets the clock, kept or not)
    keys, values, cols, left = _best_first(table, keys, values, cols)
    for name, width, dt, _, _ in cols:
        for shard in table.shards:
            have = shard.columns.get(name)
            if have is not None and (have.data.shape[1] != width or have.data.dtype != dt):
                raise ValueError(f"column {name!r} is {dt}[{width}] in the checkpoint but "
                                 f"{have.data.dtype}[{have.data.shape[1]}] in {table.name!r}")
    # a string table's registrations and row writes are serialized by its _mutate lock
    with getattr(table, "_mutate", contextlib.nullcontext()), table._lock.write():
        for shard in table.shards:
            shard.clear()
            for name, width, dt, init, _ in cols:
                if name not in shard.columns:
                    shard.add_column(name, width, dt, init)
        if names is not None:
            table.names = names
        dropped = 0
        typed = keys.astype(table._id_dtype)
        a = table._arrays
        stored = values.view(table._store)         # 16-bit floats: their bits
        for shard, pos, k in table._parts(typed, a.from_host(keys)):
            rows, _ = shard.find_or_insert(k)      # every column gets its initial value
            at = slice(None) if pos is None else a.host(pos)
            rows, at, lost = _taken(shard, rows, at, k.shape[0])
            dropped += lost
            _write_rows(shard, "values", rows, stored[at])
            for name, _, _, _, data in cols:
                _write_rows(shard, name, rows, data[at])
    if hasattr(table, "_sweep_names"):          # the names of keys it did not take
        table._sweep_names(force=True)
    if left:
        warnings.warn(f"{left} restored keys left out: {table.name or 'the table'} holds "
                      f"max_capacity={table.max_capacity} keys, and these scored lowest (an "
                      f"insert would have evicted them first)", stacklevel=2)
    if dropped:
        warnings.warn(f"{dropped} restored keys did not fit the bucketed index of "
                      f"{table.name or 'the table'} "
                      f"(a bucket holds {BUCKET} keys; the state was saved from another "
                      f"layout): "
                      f"the lowest-scored of each full bucket were dropped", stacklevel=2)
    forget = getattr(variable, "_forget_all", None)
    if forget is not None:                      # callable initializers' pending draws
        forget()
    _restored_clock(variable, saved_cols if every is None else every)
    _bounded_restored(table, cols, meta.get("bounded"))
    if admit is not None:
        table.admit = admit


def _best_first(table, keys, values, cols):
    """``(keys, values, columns, left out)`` of the state: the highest score first (the
    order a bucketed bounded table takes them in: a full bucket keeps the first 32) when
    the table is bucketed, and only the ``max_capacity`` highest-scored when the state
    holds more (the ties: the first saved); else as they are.  More keys than
    ``max_capacity`` and no scores to choose by are a ``ValueError``."""
    limit = getattr(table, "max_capacity", None)
    over = limit is not None and keys.shape[0] > limit
    score = [c[4] for c in cols if c[0] == SCORE]
    if over and not score:
        raise ValueError(f"the state holds {keys.shape[0]} keys, more than the max_capacity "
                         f"{limit} of {table.name!r}, and no scores to choose them by (it "
                         f"was saved from a table without max_capacity)")
    if not over and not (getattr(table.shards[0], "bucketed", False) and score):
        return keys, values, cols, 0
    order = highest_first(score[0])
    order = order[:limit] if over else order
    return (keys[order], values[order], [(*c[:4], c[4][order]) for c in cols],
            keys.shape[0] - order.shape[0])


def _taken(shard, rows, at, n):
    """``(rows, at, dropped)``: the rows ``shard``'s insert gave the ``n`` keys at the
    state's positions ``at`` (a slice or an index array), but the keys it did not take
    (row -1: a full bucket of a bucketed bounded table), and how many those were; the
    rows stay in the shard's memory."""
    on_host = isinstance(rows, np.ndarray)
    host = rows if on_host else rows.copy_to_host()
    ok = host >= 0
    if ok.all():
        return rows, at, 0
    kept = host[ok] if on_host else shard.to_device(host[ok])
    return kept, np.arange(n)[ok] if isinstance(at, slice) else at[ok], int((~ok).sum())


def _bounded_restored(table, cols, saved):
    """A bounded table after a restore: its score copy rebuilt, its clock past every
    restored LRU score (later calls must score above the restored keys) and the saved
    clock, epoch and last step (``saved``, absent from older checkpoints)."""
    if getattr(table, "max_capacity", None) is None:
        return
    table.shards[0]._loaded()
    if isinstance(saved, dict):
        table._clock = max(table._clock, int(saved.get("clock", 0)))
        epoch = saved.get("epoch")
        table._epoch = None if epoch is None else int(epoch)
        table._last_step = int(saved.get("last_step", table._last_step))
    scores = next((c[4][:, 0] for c in cols if c[0] == SCORE), None)
    if scores is not None and scores.size and table.evict in ("lru", "epoch_lru"):
        low = scores if table.evict == "lru" else scores & 0xFFFFFFFF
        table._clock = max(table._clock, int(low.max()))


# ---- tf.train.Checkpoint (called by tf_bridge.Variable) ---------------------------------
def _in_saved_model_save():
    try:
        from tensorflow.python.saved_model import save_context
    except ImportError:         # moved in some TF version: SavedModel then fails later
        return False
    return save_context.in_save_context()


def serialize_to_tensors(variable):
    """``{name: tensor}`` of :data:`STATE_NAMES` for ``Trackable._serialize_to_tensors``."""
    if _in_saved_model_save():
        raise ValueError(f"de.Variable {variable.name!r} cannot be saved in a SavedModel (its "
                         "lookups call back into Python); save training state with "
                         "tf.train.Checkpoint and serving models with "
                         "tf_bridge.export_for_serving")
    if getattr(variable, "distributed", False):
        from .distributed.saving import side_files
        if side_files():
            return {}           # hvd.Checkpoint saves it beside the bundle, a part per rank
        raise ValueError(f"de.Variable {variable.name!r} is split across MPI ranks: a "
                         "tf.train.Checkpoint would save only this rank's rows. Use "
                         "tf_bridge.distributed.Checkpoint (the same API; call save/restore "
                         "on every rank)")
    dtypes = [variable.key_dtype, variable.value_dtype, tf.string, tf.uint8]
    if tf.executing_eagerly():
        state = table_state(variable)
        return {name: tf.constant(state[name], dtype)
                for name, dtype in zip(STATE_NAMES, dtypes)}

    def run():
        s = table_state(variable)
        return (s["keys"], s["values"], np.array(s["columns"].encode(), object),
                s["column_bytes"])

    out = tf.numpy_function(run, [], dtypes, stateful=True, name="table_state")
    out[0].set_shape([None])
    out[1].set_shape([None, variable.dim])
    out[2].set_shape([])
    out[3].set_shape([None, None])
    return dict(zip(STATE_NAMES, out))


def restore_from_tensors(variable, tensors):
    """``Trackable._restore_from_tensors``: restore the state tensors into ``variable``."""
    if not variable.checkpoint or any(k not in tensors for k in STATE_NAMES):
        return None                 # checkpoint=False: the table is neither saved nor restored
    if tf.executing_eagerly():
        _restore_owned(variable, {k: tensors[k].numpy() for k in STATE_NAMES})
        return None

    def run(keys, values, columns, blob):
        _restore_owned(variable, {"keys": keys, "values": values, "columns": columns,
                                  "column_bytes": blob})
        return np.zeros((), np.bool_)

    return tf.numpy_function(run, [tensors[k] for k in STATE_NAMES], tf.bool, stateful=True,
                             name="restore_table_state")


def _write_rows(shard, column, rows, data):
    """``shard.columns[column].data[rows] = data`` (numpy ``data``; a GPU shard's rows
    and columns are on its device)."""
    col = shard.columns[column].data
    if isinstance(col, np.ndarray):
        col[rows] = data
        return
    from jit_kernels import cuda_table
    with shard.on():
        cuda_table.assign_rows(col, rows, cuda_table.cuda_api().to_device(
            np.ascontiguousarray(data)))


def _restored_clock(variable, cols):
    """A timestamp policy's clock after a restore of ``cols`` (the state's columns,
    every rank's for a split table): later steps must score above every restored key."""
    policy = getattr(getattr(variable, "restrict_policy", None), "policy", None)
    if hasattr(policy, "resume") and any(c[0] == policy.column for c in cols):
        policy.resume(next(c[4] for c in cols if c[0] == policy.column))


def _restore_owned(variable, state):
    """Restore ``state``; a table split across ranks keeps the keys this rank owns."""
    if not getattr(variable, "distributed", False):
        restore_table_state(variable, state)
        return
    from numbaemb.distributed_checkpoint import _owned
    restore_table_state(variable, state, _owned=lambda keys: _owned(variable.table, keys))


def saveable(var):
    """A TF1 ``SaveableObject`` of ``var``'s state, its checkpoint keys prefixed by the
    variable's name (``<name>/keys``, ``<name>/values``...), for ``tf.compat.v1.train.Saver``
    (``Saver(var_list=[saveable(v), ...])`` or the ``SAVEABLE_OBJECTS`` collection)."""
    factories = tf.__internal__.tracking.saveable_objects_from_trackable(var)
    (factory,) = factories.values()
    return factory(name=f"{var.name}/")


class _TableSnapshot(tf.__internal__.tracking.Trackable):
    """What async checkpointing writes in the background: the table as it was when
    ``take`` ran (``tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)``)."""

    def __init__(self, variable):
        self._variable, self._state = variable, None

    def take(self):
        self._state = table_state(self._variable)

    def _serialize_to_tensors(self):
        if self._state is None:
            self.take()
        v = self._variable
        dtypes = [v.key_dtype, v.value_dtype, tf.string, tf.uint8]
        return {n: tf.constant(self._state[n], d) for n, d in zip(STATE_NAMES, dtypes)}


def copy_to_cpu(variable, object_map):
    """``Trackable._copy_trackable_to_cpu``: snapshot the table into its copy in
    ``object_map`` (async checkpoints run this inside a ``tf.function``)."""
    snap = object_map.get(variable)
    if snap is None:
        snap = object_map[variable] = _TableSnapshot(variable)
    if tf.executing_eagerly():
        snap.take()
    else:
        tf.numpy_function(lambda: (snap.take(), np.zeros((), np.bool_))[1], [], tf.bool,
                          stateful=True, name="table_snapshot")


# ---- Keras .keras files --------------------------------------------------------------
def dynamic_variables(obj):
    """``[(attribute name, tf_bridge.Variable)]`` held by ``obj`` directly or in a
    list / tuple / dict attribute, sorted by name (what :class:`KerasTableSaving` saves)."""
    from .variable import Variable
    found, seen = [], set()
    for attr, value in sorted(vars(obj).items()):
        if attr.startswith("_self_"):          # TF's own tracking bookkeeping
            continue
        if isinstance(value, Variable):
            items = [(attr, value)]
        elif isinstance(value, (list, tuple)):
            items = [(f"{attr}.{i}", v) for i, v in enumerate(value) if isinstance(v, Variable)]
        elif isinstance(value, dict):
            items = [(f"{attr}.{k}", v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
                     if isinstance(v, Variable)]
        else:
            continue
        for name, v in items:
            if id(v) not in seen:
                seen.add(id(v))
                found.append((name, v))
    return found


def _store_key(attr, name):
    return f"de:{attr}:{name}"


class KerasTableSaving:
    """Mixin for Keras layers that own ``tf_bridge.Variable`` attributes: ``model.save``
    (``.keras``) stores every table (keys, values, all extra columns, see
    :func:`table_state`) next to the layer's ordinary weights, and
    ``keras.models.load_model`` restores them into the rebuilt layer's tables
    (any shard count).

    Put it first among the bases::

        class Embedding(KerasTableSaving, keras.layers.Layer):
            def __init__(self, dim, **kw):
                super().__init__(**kw)
                self.table = de.Variable(dim=dim, name=self.name)

    Store entries: ``"0"``, ``"1"``, ... the layer's Keras weights (as Keras
    does), ``"de:<attribute>:keys"`` etc. for each table (the JSON description
    as a uint8 array of UTF-8 bytes); a string-key table's keys go as
    ``"de:<attribute>:key_bytes"`` (uint8, the strings back to back) and
    ``"de:<attribute>:keys"`` (int64 ``(n + 1,)``, where each starts).
    """

    def save_own_variables(self, store):
        super().save_own_variables(store)
        for attr, var in dynamic_variables(self):
            if not var.checkpoint:
                continue
            if getattr(var, "distributed", False):
                from .distributed.saving import gathered_state
                state = gathered_state(var)
                if state is None:
                    raise ValueError(
                        f"layer {getattr(self, 'name', '?')!r}: table {var.name!r} is split "
                        "across MPI ranks and model.save would write only this rank's rows; "
                        "call tf_bridge.distributed.save_model(model, path) on every rank "
                        "(rank 0 writes the one file)")
                state = dict(state)
            else:
                state = table_state(var)
            state["columns"] = np.frombuffer(state["columns"].encode("utf-8"), np.uint8)
            if state["keys"].dtype.kind in "OSU":      # string keys: bytes + starts (n + 1,)
                from jit_kernels.strings import pack
                buf, state["keys"] = pack(state["keys"])
                store[_store_key(attr, "key_bytes")] = buf
            for name in STATE_NAMES:
                store[_store_key(attr, name)] = state[name]

    def load_own_variables(self, store):
        keys = list(store.keys())
        dense = {k: store[k] for k in keys if not str(k).startswith("de:")}
        super().load_own_variables(dense)
        for attr, var in dynamic_variables(self):
            if not var.checkpoint:
                continue
            names = {n: _store_key(attr, n) for n in STATE_NAMES}
            if not all(k in keys for k in names.values()):
                raise ValueError(f"layer {getattr(self, 'name', '?')!r}: the saved file has "
                                 f"no table for attribute {attr!r}")
            state = {n: np.asarray(store[k]) for n, k in names.items()}
            state["columns"] = state["columns"].astype(np.uint8).tobytes().decode("utf-8")
            if _store_key(attr, "key_bytes") in keys:
                from numbaemb.string_keys import split_bytes
                buf = np.asarray(store[_store_key(attr, "key_bytes")]).astype(np.uint8)
                starts = state["keys"].astype(np.int64)
                if (starts.ndim != 1 or not starts.shape[0] or starts[0] != 0
                        or (np.diff(starts) < 0).any() or starts[-1] != buf.shape[0]):
                    raise ValueError(f"layer {getattr(self, 'name', '?')!r}: the saved string "
                                     f"keys of table {var.name!r} are corrupt")
                state["keys"] = split_bytes(buf, starts)
            _restore_owned(var, state)          # split tables keep this rank's keys
