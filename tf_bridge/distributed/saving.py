"""Checkpoints and serving of models whose tables are split across the ranks.

``Checkpoint`` is a ``tf.train.Checkpoint`` for those models (TFRA's
``DECheckpoint``).  Call ``save`` / ``write`` / ``restore`` / ``read`` on every
rank with the same path (a file system every rank sees)::

    ckpt = hvd.Checkpoint(model=model, optimizer=opt)
    path = ckpt.save("/shared/run/ckpt")        # every rank
    ckpt.restore(path)                          # every rank; any world size, or one process

What it writes for ``path``:

- ``path.index`` / ``path.data-*``: the TF bundle (dense weights, optimizer
  state, save counter), written by rank 0 alone (they are the same on every rank);
- ``path.tables/<i>-<name>/``: each table of the model (in the model's object
  order) as a numbaemb distributed checkpoint: one part per rank, holding the rows
  and optimizer slots that rank owns, committed atomically by rank 0
  (:mod:`numbaemb.distributed_checkpoint`).

Restoring loads each table's directory into any world size (each rank keeps the
keys it owns) or into one process (every key), then the bundle.  A plain
``tf.train.Checkpoint`` of a table split across ranks raises ValueError pointing
here, rather than saving one rank's rows as if they were the table.

``save_model(model, "m.keras")`` is ``model.save`` for those models (TFRA's
``de_hvd_save_model``): call it on every rank; each split table's rows and optimizer
slots are gathered to rank 0, which writes the one ``.keras`` file.
``keras.models.load_model`` reads it back on every rank of any world size (each
rank keeps the keys it owns) or in one process.  The whole table passes through
rank 0's memory, as it must for one file; ``Checkpoint`` is the path for tables
larger than one machine.  A plain ``model.save`` of a split table raises.

``export_for_serving`` of a model with split tables is collective: every rank
sends its rows to rank 0, which writes the one SavedModel (see
:func:`tf_bridge.export_for_serving`).
"""
import json
import os
import threading

import numpy as np
import tensorflow as tf

import numbaemb
from numbaemb import distributed_checkpoint

from ..variable import Variable

__all__ = ["Checkpoint", "save_model", "tables_of", "gather_table", "side_files",
           "gathered_state"]

_SIDE = threading.local()       # set while Checkpoint writes: tables go to side files
_GATHERED = threading.local()   # while save_model writes on rank 0: {id(table): state}


def side_files():
    """Whether a :class:`Checkpoint` is writing (tables then stay out of the bundle)."""
    return getattr(_SIDE, "on", False)


def tables_of(root):
    """The ``tf_bridge.Variable`` objects reachable from ``root``, in object-graph order
    (the same on every rank running the same program)."""
    seen, out = set(), []
    for o in tf.train.TrackableView(root).descendants():
        if isinstance(o, Variable) and id(o) not in seen:
            seen.add(id(o))
            out.append(o)
    return out


def _comm():
    from . import _dense_comm
    return _dense_comm()


def _table_dir(path, i, var):
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in var.name)
    return os.path.join(os.fspath(path) + ".tables", f"{i}-{safe}")


class Checkpoint(tf.train.Checkpoint):
    """``tf.train.Checkpoint`` that saves split tables as one part per rank (see the
    module docstring).  With one process and no split tables it writes the same
    files, so checkpoints move freely between world sizes."""

    def _tables(self):
        """``[(index, table)]`` of every checkpointed table (index: its place in the
        object graph, which names its side directory)."""
        return list(enumerate(v for v in tables_of(self) if v.checkpoint))

    def _write_tables(self, path):
        for i, var in self._tables():
            if var.distributed:          # collective: a part per rank, rank 0 commits
                d = _table_dir(path, i, var)
                os.makedirs(os.path.dirname(d), exist_ok=True)
                var.table.save(d)

    def _bundle(self, write):
        """Rank 0 writes the TF bundle (tables left out); every rank gets its path."""
        def bundle():
            _SIDE.on = True
            try:
                return write()
            finally:
                _SIDE.on = False
        return _on_rank0(bundle, "the checkpoint")

    def write(self, file_prefix, options=None):
        """Write ``file_prefix`` (every rank)."""
        file_prefix = os.fspath(file_prefix)
        self._write_tables(file_prefix)
        return self._bundle(lambda: super(Checkpoint, self).write(file_prefix, options=options))

    def save(self, file_prefix, options=None):
        """``file_prefix-N`` with N the save counter (every rank)."""
        from . import broadcast_object, rank
        number = broadcast_object(int(self.save_counter) + 1)
        self._write_tables(f"{os.fspath(file_prefix)}-{number}")
        path = self._bundle(lambda: super(Checkpoint, self).save(file_prefix, options=options))
        if rank() != 0:
            self.save_counter.assign(number)
        return path

    def _load_tables(self, path):
        """Tables saved as side directories; the others come from the bundle (a table
        saved by one process restores into split tables: each rank keeps its keys)."""
        from . import comm
        for i, var in self._tables():
            d = _table_dir(path, i, var)
            if not os.path.isdir(d):
                continue
            local = var.table.local if var.distributed else var.table
            loaded = distributed_checkpoint.load(
                d, comm=comm() if var.distributed else None, num_shards=local.num_shards)
            _adopt(var, loaded)

    def read(self, save_path, options=None):
        """Restore ``save_path`` (every rank): tables, then the bundle."""
        self._load_tables(os.fspath(save_path))
        return super().read(save_path, options=options)

    def restore(self, save_path, options=None):
        self._load_tables(os.fspath(save_path))
        return super().restore(save_path, options=options)


def _on_rank0(write, what):
    """Run ``write()`` on rank 0 alone; every rank returns its result or raises its error
    (other ranks: ``OSError`` naming it)."""
    from . import broadcast_object, rank
    error, out = None, None
    if rank() == 0:
        try:
            out = write()
        except Exception as e:      # noqa: BLE001  every rank must learn of it
            error = e
    status = broadcast_object(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if status is not None:
        raise OSError(f"rank 0 failed to write {what}: {status}")
    return broadcast_object(out)


def save_model(model, filepath, **kwargs):
    """``model.save(filepath, **kwargs)`` for a model with tables split across the ranks:
    call it on every rank.  Each split table's rows and optimizer slots are gathered to
    rank 0 (collective, in the model's object order), which writes the one ``.keras``
    file; the other ranks wait for it and raise if it failed.

    Args:
      model: a Keras model; filepath: a ``.keras`` path every rank may name (only
      rank 0 writes); kwargs: passed to ``model.save``.

    Example (every rank; then any world size, or one process, loads it)::

        hvd.save_model(model, "/shared/run/model.keras")
        model = hvd.load_model("/shared/run/model.keras")
    """
    states = {}
    for var in tables_of(model):
        if var.distributed and var.checkpoint:
            states[id(var)] = gathered_table_state(var)

    def write():
        _GATHERED.states = states
        try:
            model.save(filepath, **kwargs)
        finally:
            _GATHERED.states = None
    _on_rank0(write, f"model file {os.fspath(filepath)!r}")


def gathered_state(var):
    """The gathered state of split table ``var`` while :func:`save_model` writes (rank 0),
    else None."""
    states = getattr(_GATHERED, "states", None)
    return None if states is None else states.get(id(var))


def gathered_table_state(var):
    """Collective: on rank 0 the ``table_state`` (keys, rows and optimizer slots of every
    key) of split table ``var``; None on other ranks."""
    from ..checkpoint import table_state
    every = _comm().gather(table_state(var.table.local))
    if every is None:
        return None
    metas = [json.loads(s["columns"]) for s in every]
    filled = [m for m in metas if m["size"]] or metas[:1]
    layout = {(json.dumps(m["columns"], sort_keys=True), m["row_bytes"]) for m in filled}
    if len(layout) > 1:
        raise RuntimeError(f"table {var.name!r}: the ranks' parts have different optimizer "
                           "slot columns; cannot merge them into one file")
    meta = dict(filled[0], size=int(sum(m["size"] for m in metas)))
    _merge_extras(meta, metas)
    return {"keys": np.concatenate([s["keys"] for s in every]),
            "values": np.concatenate([s["values"] for s in every]),
            "columns": json.dumps(meta),
            "column_bytes": np.concatenate([s["column_bytes"] for s in every])}


def _merge_extras(meta, metas):
    """The ranks' bounded clocks (the latest) and admission filters (merged: see
    ``numbaemb.admission.merge``) into the one-process state ``meta``."""
    from numbaemb import admission
    from ..checkpoint import decode_filter, encode_filter
    bounded = [m["bounded"] for m in metas if "bounded" in m]
    if bounded:
        meta["bounded"] = dict(bounded[0], clock=max(b["clock"] for b in bounded),
                               last_step=max(b["last_step"] for b in bounded))
    filters = [decode_filter(m["admission"]) for m in metas if "admission" in m]
    if filters:
        meta["admission"] = encode_filter(admission.merge(filters))


def _adopt(var, loaded):
    """Make the loaded table ``var``'s (its configuration must match)."""
    old = var.table
    if (loaded.dim, loaded.key_dtype, loaded.value_dtype) != (old.dim, old.key_dtype,
                                                              old.value_dtype):
        raise ValueError(f"the checkpoint of table {var.name!r} has dim {loaded.dim} and dtypes "
                         f"{loaded.key_dtype}/{loaded.value_dtype}; the table has {old.dim} and "
                         f"{old.key_dtype}/{old.value_dtype}")
    loaded.key_range, loaded.max_keys = old.key_range, old.max_keys
    var.table = loaded
    policy = var.restrict_policy
    if policy is not None:      # the policy scores the loaded table (its column, if saved)
        var.restrict_policy = type(policy)(var)
        p = var.restrict_policy.policy
        if hasattr(p, "resume"):    # later steps stamp above every restored key, every rank's
            p.resume(loaded.export(p.column)[1], _comm() if var.distributed else None)


def gather_table(var):
    """Collective: on rank 0 a one-process ``numbaemb.Variable`` with every key of
    split table ``var`` and its row (no optimizer slots); None on other ranks."""
    t = var.table
    keys, values = t.local.export()
    every = _comm().gather((np.asarray(keys), np.asarray(values)))
    if every is None:
        return None
    loc = t.local
    out = numbaemb.Variable(loc.dim, key_dtype=loc.key_dtype, value_dtype=loc.value_dtype,
                            name=loc.name, initializer=loc.initializer, seed=loc.seed)
    for k, v in every:
        if k.size:
            out.upsert(k, v)
    return out
