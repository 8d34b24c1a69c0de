"""The parts of a native checkpoint beside the table's shards: a string table's names,
a bounded table's configuration and clocks, an admission filter's state.

Each writer adds members to the archive and returns the manifest entry its reader
checks; see :mod:`numbaemb.checkpoint` for the format.
"""
import numpy as np

from ._checkpoint_read import _corrupt, _get, _read_whole

__all__ = ["_bounded_manifest", "_write_names", "_read_names", "_write_admission",
           "_read_admission"]


def _members(zf, prefix, arrays):
    """``{name: member entry}`` for 1-D int arrays written as ``<prefix>/<name>.npy``."""
    from .checkpoint import _chunk_rows, _write_member
    step = _chunk_rows(1, 8)
    return {name: _write_member(zf, f"{prefix}/{name}.npy", a.dtype, a.shape,
                                (a[i:i + step] for i in range(0, max(a.shape[0], 1), step)))
            for name, a in arrays.items()}


def _bounded_manifest(variable):
    """A bounded table's configuration and clocks, a ``steps_to_live`` table's setting
    and last step (nothing for other tables)."""
    out = {}
    if getattr(variable, "steps_to_live", None) is not None:
        out.update(steps_to_live=int(variable.steps_to_live),
                   last_step=int(variable._last_step))
    if getattr(variable, "max_capacity", None) is None:
        return out
    return {**out, "max_capacity": int(variable.max_capacity), "evict": variable.evict,
            "evict_window": _window(variable.evict_window), "clock": int(variable._clock),
            "epoch": variable._epoch, "last_step": int(variable._last_step)}


def _window(window):
    """An ``evict_window`` as saved: an int, or the word of a bucketed index."""
    return window if isinstance(window, str) else int(window)


def _write_names(zf, variable, ids):
    """A string table's names: ``names/ids.npy`` (int64), ``names/starts.npy`` (int64,
    n + 1) and ``names/bytes.npy`` (uint8): string i is ``bytes[starts[i]:starts[i+1]]``."""
    buf, starts = variable.names.state(ids)
    return _members(zf, "names", {"ids": ids, "starts": starts, "bytes": buf})


def _read_names(ar, v):
    """Register the names of a string table's checkpoint in ``v`` (filled already)."""
    path, man = ar.path, ar.manifest
    entry = _get(man, "names", dict, path)
    n = man.get("size")
    ids = _read_whole(ar, _get(entry, "ids", dict, path, "names.ids"), "names.ids", np.int64, (n,))
    starts = _read_whole(ar, _get(entry, "starts", dict, path, "names.starts"), "names.starts",
                         np.int64, (n + 1,))
    if starts[0] != 0 or (np.diff(starts) < 0).any():
        raise _corrupt(path, "names.starts is not a non-decreasing sequence from 0")
    buf = _read_whole(ar, _get(entry, "bytes", dict, path, "names.bytes"), "names.bytes",
                      np.uint8, (int(starts[-1]),))
    held = v._export("values")[0] if n else np.empty(0, np.int64)
    # (every saved key's name: those of keys a smaller bounded table left out too)
    if not np.isin(held, ids).all() or held.shape[0] > ids.shape[0]:
        raise _corrupt(path, "the names' ids are not the table's ids")
    try:
        v.names.restore(ids, buf, starts)
    except ValueError as e:
        raise _corrupt(path, f"bad names ({e})") from None


def _write_admission(zf, admit):
    """An admission filter: its configuration and its arrays under ``admission/``."""
    from . import admission
    config, arrays = admission.state(admit)
    return {"config": config, "arrays": _members(zf, "admission", arrays)}


def _read_admission(ar):
    """The admission filter of archive ``ar`` (checked)."""
    from . import admission
    path = ar.path
    entry = _get(ar.manifest, "admission", dict, path)
    config = _get(entry, "config", dict, path, "admission.config")
    arrays = {}
    for name, member in _get(entry, "arrays", dict, path, "admission.arrays").items():
        shape = _get(member, "shape", list, path, f"admission.{name}.shape")
        dtype = np.dtype(_get(member, "dtype", str, path, f"admission.{name}.dtype"))
        arrays[name] = _read_whole(ar, member, f"admission.{name}", dtype, tuple(shape))
    try:
        return admission.from_state(config, arrays)
    except (KeyError, TypeError, ValueError) as e:
        raise _corrupt(path, f"bad admission filter state ({e})") from None
