"""Checkpoints of distributed tables: a directory, a part per rank, one manifest.

Layout of the checkpoint directory ``path``:

``part-<token>-<rank>-of-<world>.nbe``
    rank ``r``'s keys and every column, a native single-file checkpoint
    (:mod:`numbaemb.checkpoint`, with its own SHA-256 per array).
``manifest.json``
    ``format`` = ``"numbaemb.distributed-checkpoint"``, ``format_version`` = 1,
    the world size, the table's configuration, the total size and, per part,
    its file name, byte length, SHA-256 and number of keys.

Saving is collective and atomic as a whole: every rank writes its part under a
name no earlier save used (a fresh token), fsyncs it and reports its SHA-256 to
rank 0; only when every part is on disk does rank 0 write the manifest to a
temporary name, fsync it and rename it over ``manifest.json`` (the commit), then
remove every file of ours that the new manifest does not name: the parts of the
previous checkpoint and anything an interrupted save left.  A crash before the
commit leaves the previous checkpoint whole.  ``path`` must be on a file system
that every rank sees (one node, NFS, Lustre...).

Loading (:func:`load`) works for any world size: with the world size and
partitioner of the save, rank ``r`` reads part ``r`` only; otherwise every rank
reads every part and keeps the keys it owns.  Without a communicator one process
takes every key.  A single-file checkpoint loads the same way (one part).  A
missing, truncated or corrupt part raises ``ValueError`` on every rank.
"""
import hashlib
import json
import os
import re
import secrets

import numpy as np

from . import _checks, checkpoint
from ._checkpoint_read import _Archive
from ._mpi import Comm, crc, size_of

__all__ = ["save", "load", "FORMAT", "FORMAT_VERSION", "MANIFEST"]

FORMAT = "numbaemb.distributed-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_OURS = re.compile(r"^(part-[0-9a-f]+-\d+-of-\d+\.nbe|\.part-.*\.tmp-.*|\.manifest\.json\.tmp-.*)$")


def _part_name(token, rank, world):
    return f"part-{token}-{rank:05d}-of-{world:05d}.nbe"


def _sha256_file(path):
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                return h.hexdigest(), n
            h.update(b)
            n += len(b)


def _check_dir(path):
    path = _checks.as_path(path)
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"checkpoint path {path!r} is a file; a distributed table saves "
                         "into a directory")
    if not os.path.isdir(os.path.dirname(path)):
        raise FileNotFoundError(f"parent directory of checkpoint path {path!r} does not exist")
    return path


# ---- save -----------------------------------------------------------------------------
def save(var, path):
    """Collective save of the distributed table ``var`` into directory ``path``."""
    c = var._comm

    def prepare():
        d = _check_dir(path)
        checkpoint._variable_manifest(var.local)    # an unsaveable config fails here, everywhere
        return d, 0

    try:
        arg = os.path.abspath(_checks.as_path(path))
    except (TypeError, ValueError):
        arg = repr(path)            # (prepare raises it inside the exchange: every rank)
    with c.lock:
        d, _ = var._begin("save", prepare, arg)
        token = c.bcast(secrets.token_hex(6) if c.rank == 0 else None)
        name = _part_name(token, c.rank, c.size)
        try:
            os.makedirs(d, exist_ok=True)
            checkpoint.save(var.local, os.path.join(d, name))
            sha, nbytes = _sha256_file(os.path.join(d, name))
            report = (dict(file=name, sha256=sha, nbytes=nbytes, size=var.local.size()), None)
        except Exception as e:      # noqa: BLE001  reported to every rank below
            report = (None, f"rank {c.rank}: {type(e).__name__}: {e}")
        reports = c.gather(report)
        verdict = None
        if c.rank == 0:
            verdict = _commit(var, d, token, reports)
        verdict = c.bcast(verdict)
        if verdict is not None:
            raise OSError(f"saving table {var.name!r} to {d!r} failed, the previous checkpoint "
                          f"there is unchanged: {verdict}")


def _commit(var, d, token, reports):
    """Rank 0: write the manifest (the commit) and remove what it does not name;
    returns None or the error message every rank raises."""
    errors = [e for _, e in reports if e is not None]
    try:
        if errors:
            raise OSError("; ".join(errors))
        parts = [p for p, _ in reports]
        var_cfg = checkpoint._variable_manifest(var.local)
        var_cfg["partitioner"] = var._identity()["partitioner"]
        if var_cfg["partitioner"] != "default":
            var_cfg["partitioner"] = "custom"
        man = {"format": FORMAT, "format_version": FORMAT_VERSION,
               "library_version": checkpoint._library_version(), "world_size": len(parts),
               "variable": var_cfg, "size": sum(p["size"] for p in parts), "parts": parts}
        tmp = os.path.join(d, f".{MANIFEST}.tmp-{token}")
        with open(tmp, "w") as f:
            json.dump(man, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(d, MANIFEST))
        checkpoint._fsync_dir(d)
    except Exception as e:      # noqa: BLE001
        _remove_ours(d, keep=())        # this save's parts (and older debris) go
        return f"{type(e).__name__}: {e}" if not errors else str(e)
    _remove_ours(d, keep={p["file"] for p in parts})
    return None


def _remove_ours(d, keep):
    """Remove our files in ``d`` that ``keep`` (and the committed manifest) do not name."""
    man = os.path.join(d, MANIFEST)
    if not keep and os.path.exists(man):        # a failed save keeps the committed parts
        try:
            with open(man) as f:
                keep = {p["file"] for p in json.load(f)["parts"]}
        except (OSError, ValueError, KeyError, TypeError):
            return
    for entry in os.listdir(d):
        if _OURS.match(entry) and entry not in keep:
            try:
                os.unlink(os.path.join(d, entry))
            except OSError:
                pass


# ---- load -----------------------------------------------------------------------------
def _corrupt(path, what):
    return ValueError(f"distributed checkpoint {path!r} is corrupt or not a checkpoint: {what}")


def read_manifest(d):
    """The checked manifest of checkpoint directory ``d``."""
    p = os.path.join(d, MANIFEST)
    if not os.path.exists(p):
        raise ValueError(f"{d!r} holds no {MANIFEST}: not a distributed checkpoint (or its "
                         "first save never finished)")
    try:
        with open(p, encoding="utf-8") as f:
            man = json.load(f)
    except (OSError, ValueError) as e:
        raise _corrupt(d, f"unreadable {MANIFEST} ({e})") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise _corrupt(d, f"{MANIFEST} is not a {FORMAT} manifest")
    if man.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"distributed checkpoint {d!r} has format version "
                         f"{man.get('format_version')!r}; this numbaemb reads {FORMAT_VERSION}")
    parts = man.get("parts")
    world = man.get("world_size")
    if not isinstance(parts, list) or not parts or world != len(parts):
        raise _corrupt(d, "bad parts list")
    for i, part in enumerate(parts):
        ok = (isinstance(part, dict) and isinstance(part.get("file"), str)
              and _OURS.match(part["file"]) and part["file"].startswith("part-")
              and isinstance(part.get("sha256"), str) and isinstance(part.get("nbytes"), int)
              and isinstance(part.get("size"), int))
        if not ok:
            raise _corrupt(d, f"bad entry parts[{i}]")
    if man.get("size") != sum(p["size"] for p in parts):
        raise _corrupt(d, "size is not the sum of the parts' sizes")
    return man


def _open_part(d, part):
    """The archive of one part, its whole-file SHA-256 and size checked."""
    p = os.path.join(d, part["file"])
    if not os.path.exists(p):
        raise ValueError(f"distributed checkpoint {d!r}: part {part['file']} is missing")
    sha, n = _sha256_file(p)
    if n != part["nbytes"] or sha != part["sha256"]:
        raise ValueError(f"distributed checkpoint {d!r}: part {part['file']} is truncated or "
                         f"corrupt ({n} bytes, SHA-256 {sha[:12]}...; the manifest says "
                         f"{part['nbytes']} bytes, {part['sha256'][:12]}...)")
    return _Archive(p)


def _sources(path):
    """``(directory or None, manifest or None, part entries)`` of a checkpoint path."""
    path = os.path.abspath(_checks.as_path(path))
    if os.path.isdir(path):
        man = read_manifest(path)
        return path, man, man["parts"]
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    return None, None, [{"file": path}]


def _open(d, part):
    return _Archive(part["file"]) if d is None else _open_part(d, part)


def load(path, comm=None, num_shards=None, partitioner=None, device=None, max_hbm_bytes=None,
         max_capacity=None, evict_window=None):
    """A variable from a distributed checkpoint directory (or a single-file one).

    With ``comm`` of more than one rank this is collective and returns a
    :class:`~numbaemb.distributed.DistributedVariable` holding the keys this rank
    owns; otherwise a plain ``Variable`` holding every key.  ``num_shards``: local
    shards (default: as saved); other arguments as :func:`numbaemb.checkpoint.load`
    (``max_capacity``: each rank's table's, as at its creation).
    """
    from .distributed import OPS
    from .variable import Variable
    path = _checks.as_path(path)        # (every rank has the same argument)
    fit = max_capacity is not None
    world = size_of(comm)
    if world == 1:
        args = checkpoint._load_args(num_shards, partitioner, device, max_hbm_bytes,
                                     max_capacity, evict_window)
        d, man, parts = _sources(path)
        archives = [_open(d, p) for p in parts]
        try:
            cfg = _config(archives, man)
            v = checkpoint.make_variable(cfg, Variable, **args)
            checkpoint.fill(v, archives, fit=fit)
            _restore_bounds(v, archives)
            return v
        finally:
            for ar in archives:
                ar.close()
    c = Comm.of(comm)
    with c.lock:
        opened, error = [], None
        try:                        # (bad arguments on one rank: every rank raises)
            args = checkpoint._load_args(num_shards, partitioner, device, max_hbm_bytes,
                                         max_capacity, evict_window)
            d, man, parts = _sources(path)
            same = (man is not None and man["world_size"] == world and partitioner is None
                    and man["variable"].get("partitioner", "default") == "default")
            opened.append(_open(d, parts[c.rank if same else 0]))
            cfg = _config(opened, man)
        except Exception as e:      # noqa: BLE001  every rank raises it
            error = e
        c.start(OPS["load"], crc(os.path.abspath(path)), 0, 0, error, f"loading {path!r}")
    try:    # creating the table is collective: every rank gets here
        v = checkpoint.make_variable(cfg, Variable, **args, comm=comm)
    except Exception:
        for ar in opened:
            ar.close()
        raise
    with c.lock:
        error = None
        try:
            if same:      # part r holds exactly the keys rank r owns
                identity = v.local.num_shards == cfg["num_shards"]
                checkpoint.fill(v.local, opened, identity=identity, fit=fit)
                _restore_bounds(v.local, opened)
            else:
                archives = opened + [_open(d, p) for p in parts[1:]]
                opened = archives
                checkpoint.fill(v.local, archives, keep=lambda keys: _owned(v, keys), fit=fit)
                _restore_bounds(v.local, archives, keep=lambda keys: _owned(v, keys))
        except Exception as e:      # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
        finally:
            for ar in opened:
                ar.close()
        errors = c.allgather(error)
    bad = [f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None]
    if bad:
        raise ValueError(f"loading {path!r} failed: " + "; ".join(bad))
    return v


def _restore_bounds(v, archives, keep=None):
    """What a bounded or filtered table keeps beside its rows, from the parts it was
    filled from: the latest clock of them all (later inserts outrank every loaded key)
    and the admission filter (one part's, or the parts' merged, keeping the ids
    ``keep`` keeps: see :func:`numbaemb.admission.merge`)."""
    from . import admission
    from ._checkpoint_extras import _read_admission
    clocks = [checkpoint.read_config(ar)["bounded"].get("clock") for ar in archives]
    clocks = [int(c) for c in clocks if c is not None]
    if clocks and getattr(v, "max_capacity", None) is not None:
        v._clock = max([v._clock] + clocks)
    filters = [_read_admission(ar) for ar in archives if "admission" in ar.manifest]
    if not filters:
        return
    if len(filters) == 1 and keep is None:
        v.admit = filters[0]
        return
    try:
        v.admit = admission.merge(filters, keep)
    except ValueError as e:
        raise ValueError(f"loading checkpoint {archives[0].path}: {e}") from None


def _owned(v, keys):
    """Mask of ``keys`` (key dtype) that rank ``v.rank`` owns."""
    from jit_kernels.exchange import check_owners, default_owners
    if v.partitioner is None:
        owner = default_owners(keys.astype(np.int64), v.world_size, 8 * v.key_dtype.itemsize)
    else:
        owner = check_owners(v.partitioner(keys, v.world_size), keys.shape, v.world_size)
    return owner == v.rank


def _config(archives, man):
    """The configuration every part must share (checked), with the manifest's partitioner."""
    cfgs = [checkpoint.read_config(ar) for ar in archives]
    same = ("dim", "key_dtype", "value_dtype", "name", "seed", "initializer")
    for cfg in cfgs[1:]:
        if any(cfg[k] != cfgs[0][k] for k in same):
            raise ValueError(f"checkpoint parts {archives[0].path!r} and {cfg['path']!r} hold "
                             "different tables")
    cfg = dict(cfgs[0])
    if man is not None:
        cfg["default"] = man["variable"].get("partitioner", "default") == "default"
    return cfg
