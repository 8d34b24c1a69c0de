"""Native checkpoints of a :class:`numbaemb.Variable`: one file, written atomically.

>>> import os, tempfile, numpy as np, numbaemb as ne
>>> tmp = tempfile.TemporaryDirectory()
>>> path = os.path.join(tmp.name, "table.nbe")
>>> v = ne.Variable(dim=2, num_shards=2, name="ckpt_doc")
>>> v.upsert(np.array([7, -1]), np.array([[1, 2], [3, 4]], np.float32))
>>> v.save(path)
>>> w = ne.Variable.load(path, num_shards=3)           # any shard count
>>> w.lookup(np.array([-1, 7, 5])).tolist(), w.num_shards, w.name
([[3.0, 4.0], [1.0, 2.0], [0.0, 0.0]], 3, 'ckpt_doc')
>>> tmp.cleanup()

File format (format version 1)
------------------------------
An uncompressed (``ZIP_STORED``, zip64) ZIP archive, readable with any zip tool
and ``numpy.load`` on its members:

``shard-NNNNN/keys.npy``
    the keys of saved shard N, shape ``(n,)``, in the variable's key dtype.
``shard-NNNNN/col-J.npy``
    column J of that shard (``values`` is column 0), shape ``(n, width)``,
    rows aligned with ``keys.npy``.
``manifest.json`` (written last)
    ``format`` = ``"numbaemb.checkpoint"``, ``format_version`` = 1, the variable's
    configuration (dim, key and value dtype, shard count at save time, name,
    seed, initializer config, whether the partitioner was the default one,
    device and ``max_hbm_bytes``), the total size and, per shard, its size, its
    columns (name, width, dtype, kernel initializer params) and for every array
    member its name, dtype, shape, byte length and SHA-256.

The file does not depend on the device: a table saved from a GPU loads on the
CPU (``device="cpu"``) and the other way round.

The archive is written to ``.<name>.tmp-<pid>-<random>`` in the target's
directory, flushed, fsynced, renamed onto the target with ``os.replace`` and
the directory is fsynced: a crash leaves either the old file or the new one.

Loading checks the archive structure, the format name and version, every
array's dtype, shape and SHA-256 (the manifest is covered by the zip CRC-32),
and raises ``ValueError`` naming the problem for a truncated, corrupt or
foreign file; it never returns a partly loaded variable.  Keys are indexed by
the rehash kernel at consecutive rows, so column data is read straight into
the new table (CPU) or copied in by slices; a key repeated in a file is
detected.  Memory: saving and loading stream one bounded chunk
(``CHUNK_BYTES``) at a time; besides the table itself they need about 16 to 32
bytes per key.
"""
import hashlib
import io
import json
import os
import secrets
import warnings
import zipfile

import numpy as np
from numpy.lib import format as npformat

from . import _checks
from . import initializers as inits
from ._checkpoint_extras import (_bounded_manifest, _read_admission, _read_names,
                                 _write_admission, _write_names)
from ._checkpoint_io import _io
from ._checkpoint_read import (FORMAT, FORMAT_VERSION, MANIFEST, _Archive, _Corrupt,
                               _bytes_view, _corrupt, _get, _parse_columns, _read_whole)
from .sharding import default_partitioner, split

__all__ = ["save", "load", "to_bytes", "from_bytes", "FORMAT", "FORMAT_VERSION"]

CHUNK_BYTES = 32 << 20          # bytes per streamed chunk
BULK_KEYS = 1 << 20             # keys per bulk-insert step on load


# ---- small helpers ----------------------------------------------------------------
def _keys_member(s):
    return f"shard-{s:05d}/keys.npy"


def _col_member(s, j):
    return f"shard-{s:05d}/col-{j}.npy"


def _chunk_rows(width, itemsize):
    return max(1, CHUNK_BYTES // max(1, width * itemsize))


def _init_to_json(init):
    kind, a, b, seed, const = init
    return {"kind": int(kind), "a": float(a), "b": float(b), "seed": int(seed),
            "const": _host(const).astype(np.float64).reshape(-1).tolist()}


def _init_equal(p, q):
    """Equality of kernel initializer params ``(kind, a, b, seed, const)`` (NaN == NaN)."""
    return (int(p[0]) == int(q[0]) and int(p[3]) == int(q[3])
            and np.array_equal(np.array(p[1:3], np.float64), np.array(q[1:3], np.float64), equal_nan=True)
            and np.array_equal(_host(p[4]).astype(np.float64), _host(q[4]).astype(np.float64),
                               equal_nan=True))


# ---- save ----------------------------------------------------------------------------
def _npy_header(dtype, shape):
    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": npformat.dtype_to_descr(np.dtype(dtype)),
                                          "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def _write_member(zf, name, dtype, shape, chunks):
    """Write one .npy member from an iterator of C-contiguous chunks; returns its entry."""
    header = _npy_header(dtype, shape)
    sha = hashlib.sha256(header)
    nbytes = len(header)
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    with zf.open(info, "w", force_zip64=True) as out:
        out.write(header)
        for chunk in chunks:
            b = _bytes_view(chunk)
            sha.update(b)
            out.write(b)
            nbytes += b.shape[0]
    want = len(header) + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes != want:     # a bug, not bad input: never write a file that cannot load
        raise RuntimeError(f"checkpoint member {name}: wrote {nbytes} bytes, expected {want}")
    return {"member": name, "dtype": np.dtype(dtype).str, "shape": list(shape),
            "nbytes": nbytes, "sha256": sha.hexdigest()}


def _host(a):
    """numpy copy of a host or device array."""
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _key_chunks(keys, key_dtype):
    step = _chunk_rows(1, 8)
    for i in range(0, keys.shape[0], step):
        yield keys[i:i + step].astype(key_dtype)


def _variable_manifest(variable):
    cfg = variable.initializer.get_config()
    try:
        ok = inits.from_config(json.loads(json.dumps(cfg))) == variable.initializer
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TypeError(f"cannot checkpoint: initializer {variable.initializer!r} does not "
                        "round-trip through get_config() / numbaemb.initializers.from_config")
    part = variable.partitioner
    return {"dim": int(variable.dim), "key_dtype": _checks.dtype_name(variable.key_dtype),
            "value_dtype": variable.value_dtype.name, "num_shards": int(variable.num_shards),
            "name": variable.name, "seed": int(variable.seed), "initializer": cfg,
            "partitioner": "default" if part is None or part is default_partitioner else "custom",
            "device": getattr(variable, "device", "cpu"),
            "max_hbm_bytes": getattr(variable, "max_hbm_bytes", None),
            **_bounded_manifest(variable)}


def _write_archive(variable, fileobj):
    """Stream the whole variable into ``fileobj`` (caller holds the read lock)."""
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "library_version": _library_version(),
                "variable": _variable_manifest(variable), "shards": []}
    total = 0
    names = [] if hasattr(variable, "names") else None     # a string table's ids
    with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for s, shard in enumerate(variable.shards):
            io_ = _io(shard)
            with io_.context():
                keys, rows = io_.export_rows()
                n = int(keys.shape[0])
                total += n
                entry = {"size": n, "columns": [],
                         "keys": _write_member(zf, _keys_member(s), variable._id_dtype, (n,),
                                               _key_chunks(keys, variable._id_dtype))}
                if names is not None:
                    names.append(_host(keys).astype(np.int64))
                for j, (name, col) in enumerate(shard.columns.items()):
                    width, dtype = int(col.data.shape[1]), np.dtype(col.data.dtype)
                    arr = _write_member(zf, _col_member(s, j), dtype, (n, width),
                                        io_.column_chunks(name, rows))
                    entry["columns"].append({"name": name, "width": width, "dtype": dtype.str,
                                             "init": _init_to_json(col.init), "array": arr})
                manifest["shards"].append(entry)
                del keys, rows
        manifest["size"] = total
        if names is not None:
            manifest["names"] = _write_names(zf, variable, np.concatenate(names))
        if getattr(variable, "admit", None) is not None:
            manifest["admission"] = _write_admission(zf, variable.admit)
        info = zipfile.ZipInfo(MANIFEST, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        zf.writestr(info, json.dumps(manifest, indent=1, allow_nan=True).encode(),
                    compress_type=zipfile.ZIP_STORED)


def _library_version():
    from . import __version__
    return __version__


def _fsync_dir(dirname):
    try:
        fd = os.open(dirname, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return                      # e.g. Windows: directories cannot be opened
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(variable, path):
    """Write ``variable`` to the single file ``path``, atomically.

    Keys, values and every extra column (optimizer slots, policy scores) are
    saved with the configuration.  Writers wait while the snapshot is taken
    (the read lock is held); lookups go on.  If anything fails, ``path`` keeps
    its previous content and no temporary file is left behind.

    >>> import os, tempfile, numpy as np, numbaemb as ne
    >>> from numbaemb import checkpoint
    >>> d = tempfile.TemporaryDirectory()
    >>> v = ne.Variable(dim=3, initializer=ne.initializers.Constant(0.5))
    >>> v.find_or_insert(np.array([1, 2])).shape
    (2, 3)
    >>> checkpoint.save(v, os.path.join(d.name, "v.nbe"))
    >>> sorted(os.listdir(d.name))
    ['v.nbe']
    >>> d.cleanup()
    """
    path = _checks.as_path(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint path {path!r} is a directory; give a file name")
    dirname, base = os.path.split(os.path.abspath(path))
    if not os.path.isdir(dirname):
        raise FileNotFoundError(f"directory {dirname!r} of checkpoint path {path!r} does not exist")
    _variable_manifest(variable)          # fail on an unsaveable config before touching disk
    tmp = os.path.join(dirname, f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            with variable._lock.read():
                _write_archive(variable, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(dirname)


# ---- load ------------------------------------------------------------------------------
def load(path, num_shards=None, partitioner=None, device=None, max_hbm_bytes=None,
         max_capacity=None, evict_window=None):
    """Read a checkpoint written by :func:`save` into a new ``Variable``.

    Args:
      path: the checkpoint file.
      num_shards: shard count of the new variable; default the saved one.  Keys
        are routed again, so any count works.
      partitioner: ``f(keys, n) -> shard ids`` of the new variable (a custom
        partitioner cannot be saved); default key mod n.
      device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; default the device the
        variable was saved from.  Checkpoints do not depend on the device.
      max_hbm_bytes: GPU hybrid-mode budget; default the saved one when the
        new variable is on a GPU.
      max_capacity, evict_window: a bounded table's size and index layout, to load it
        larger, smaller or in the other layout; default as saved.  When it holds more
        keys than ``max_capacity``, the lowest-scored are left out (the keys an insert
        would evict first; on equal scores the later saved), with a warning.  A table
        saved without ``max_capacity`` loads as a bounded one (``evict="lru"``, one
        shard, every key scored 0: older than any later insert) when its keys fit.

    Raises ``FileNotFoundError`` when ``path`` does not exist and ``ValueError``
    when it is truncated, corrupt, of another format version or not a
    checkpoint; nothing partial is ever returned.

    >>> import os, tempfile, numpy as np, numbaemb as ne
    >>> from numbaemb import checkpoint
    >>> d = tempfile.TemporaryDirectory(); p = os.path.join(d.name, "v.nbe")
    >>> v = ne.Variable(dim=1, key_dtype=np.int32, num_shards=4)
    >>> v.upsert(np.array([-5, 5]), np.array([[1.0], [2.0]]))
    >>> checkpoint.save(v, p)
    >>> w = checkpoint.load(p)
    >>> w.num_shards, w.key_dtype.name, sorted(w.export()[0].tolist())
    (4, 'int32', [-5, 5])
    >>> d.cleanup()
    """
    from .variable import Variable
    path = _checks.as_path(path)
    args = _load_args(num_shards, partitioner, device, max_hbm_bytes, max_capacity,
                      evict_window)
    ar = _Archive(path)
    try:
        return _load(ar, Variable, args)
    finally:
        ar.close()


def to_bytes(variable) -> bytes:
    """The checkpoint of ``variable`` as bytes: what :func:`save` writes to its file
    (the same format and checks), for a pickle, a queue or a database.  Needs the
    table's size in memory once more.

    >>> import numpy as np, numbaemb as ne
    >>> v = ne.Variable(dim=2); v.upsert(np.array([4]), np.ones((1, 2)))
    >>> from_bytes(to_bytes(v), num_shards=3).lookup(np.array([4])).tolist()
    [[1.0, 1.0]]
    """
    if getattr(variable, "comm", None) is not None:
        raise TypeError("a table split across MPI ranks cannot be pickled, copied or turned "
                        "into bytes: save it with v.save(directory) (collective)")
    _variable_manifest(variable)          # fail on an unsaveable config first
    buf = io.BytesIO()
    with variable._lock.read():
        _write_archive(variable, buf)
    return buf.getvalue()


def from_bytes(data, num_shards=None, partitioner=None, device=None, max_hbm_bytes=None,
               max_capacity=None, evict_window=None):
    """A new Variable from the bytes :func:`to_bytes` (or a checkpoint file) holds;
    arguments and errors as :func:`load`'s."""
    from .variable import Variable
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes (a checkpoint's), got {type(data).__name__}")
    args = _load_args(num_shards, partitioner, device, max_hbm_bytes, max_capacity,
                      evict_window)
    ar = _Archive("<bytes>", bytes(data))
    try:
        return _load(ar, Variable, args)
    finally:
        ar.close()


def _load_args(num_shards, partitioner, device, max_hbm_bytes, max_capacity=None,
               evict_window=None):
    """The arguments of :func:`load` checked, as keyword arguments of
    :func:`make_variable`."""
    if num_shards is not None:
        num_shards = _checks.positive_int(num_shards, "num_shards")
    if partitioner is not None and not callable(partitioner):
        raise TypeError(f"partitioner must be callable, got {type(partitioner).__name__}")
    if device is not None:
        from ._device import parse_device
        parse_device(device)                    # TypeError / ValueError naming the argument
    if max_hbm_bytes is not None:
        max_hbm_bytes = _checks.positive_int(max_hbm_bytes, "max_hbm_bytes")
    if max_capacity is not None or evict_window is not None:
        from .bounded import BUCKETS
        from .variable import _bounds        # (its errors name the argument)
        checked, _, window = _bounds(1 if max_capacity is None else max_capacity, "lru",
                                     BUCKETS if evict_window is None else evict_window, 1)
        max_capacity = None if max_capacity is None else checked
        evict_window = None if evict_window is None else window
    return dict(num_shards=num_shards, partitioner=partitioner, device=device,
                max_hbm_bytes=max_hbm_bytes, max_capacity=max_capacity,
                evict_window=evict_window)


def _load(ar, Variable, args):
    cfg = read_config(ar)
    v = make_variable(cfg, Variable, **args)
    identity = v.num_shards == cfg["num_shards"] and cfg["default"] and \
        args["partitioner"] is None
    fill(v, [ar], identity=identity, fit=args["max_capacity"] is not None)
    if hasattr(v, "names"):
        _read_names(ar, v)
        v._sweep_names(force=True)      # the names of keys the table did not take
    if "admission" in ar.manifest:
        v.admit = _read_admission(ar)
    return v


def read_config(ar):
    """The variable configuration in archive ``ar``'s manifest (checked)."""
    path, man = ar.path, ar.manifest
    var = _get(man, "variable", dict, path)
    dim = _get(var, "dim", int, path, "variable.dim")
    saved_n = _get(var, "num_shards", int, path, "variable.num_shards")
    name = var.get("name")
    seed = _get(var, "seed", int, path, "variable.seed")
    try:
        key_dtype = _checks.key_dtype(_get(var, "key_dtype", str, path, "variable.key_dtype"))
        value_dtype = _checks.value_dtype(_get(var, "value_dtype", str, path, "variable.value_dtype"))
        initializer = inits.from_config(_get(var, "initializer", dict, path, "variable.initializer"))
    except (TypeError, ValueError) as e:
        if isinstance(e, _Corrupt):
            raise
        raise _corrupt(path, f"bad variable configuration ({e})") from None
    if dim < 1 or saved_n < 1 or not (name is None or isinstance(name, str)):
        raise _corrupt(path, "bad variable configuration")
    shards = _get(man, "shards", list, path)
    if len(shards) != saved_n:
        raise _corrupt(path, f"manifest lists {len(shards)} shards, variable.num_shards is {saved_n}")
    saved_device = var.get("device", "cpu")
    saved_hbm = var.get("max_hbm_bytes")
    if not isinstance(saved_device, str) or not (
            saved_hbm is None or isinstance(saved_hbm, int) and not isinstance(saved_hbm, bool)):
        raise _corrupt(path, "bad variable configuration (device, max_hbm_bytes)")
    bounded = {k: var[k] for k in ("max_capacity", "evict", "evict_window", "clock", "epoch",
                                   "last_step", "steps_to_live") if k in var}
    return dict(path=path, dim=dim, num_shards=saved_n, name=name, seed=seed,
                key_dtype=key_dtype, value_dtype=value_dtype, initializer=initializer,
                default=var.get("partitioner", "default") == "default", device=saved_device,
                max_hbm_bytes=saved_hbm, bounded=bounded)


def make_variable(cfg, Variable, num_shards, partitioner, device, max_hbm_bytes,
                  max_capacity=None, evict_window=None, **extra):
    """An empty variable of configuration ``cfg`` (:func:`read_config`); arguments as
    :func:`load`'s (None: as saved); ``extra`` goes to the constructor (``comm``)."""
    path = cfg["path"]
    resized = {k: a for k, a in (("max_capacity", max_capacity),
                                 ("evict_window", evict_window)) if a is not None}
    saved = dict(cfg.get("bounded") or {})
    if resized and "max_capacity" not in saved:     # a table without bounds, made bounded
        if max_capacity is None:
            raise ValueError(f"evict_window given, but checkpoint {path} holds a table "
                             f"without max_capacity: give max_capacity too")
        from .variable import EVICT_WINDOW
        saved = dict(saved, max_capacity=max_capacity, evict="lru", evict_window=EVICT_WINDOW,
                     clock=0, epoch=None, last_step=saved.get("last_step", 0))
        num_shards = 1 if num_shards is None else num_shards
    if not cfg["default"] and partitioner is None:
        warnings.warn(f"checkpoint {path} was saved with a custom partitioner; loading with the "
                      "default one (pass partitioner= to load to choose)", stacklevel=4)
    n_target = cfg["num_shards"] if num_shards is None else num_shards
    target_device = cfg["device"] if device is None else device
    on_gpu = not target_device.strip().lower().startswith("cpu")
    hbm = max_hbm_bytes if max_hbm_bytes is not None else (cfg["max_hbm_bytes"] if on_gpu else None)
    kwargs = {} if target_device == "cpu" and hbm is None else \
        dict(device=target_device, max_hbm_bytes=hbm)
    bounded = dict(saved, **resized)
    if "steps_to_live" in bounded:
        kwargs["steps_to_live"] = bounded.pop("steps_to_live")
    last_step = bounded.pop("last_step", None) if "max_capacity" not in bounded else None
    if bounded and n_target != 1:
        raise ValueError(f"checkpoint {path} holds a bounded table (max_capacity), which has "
                         f"one shard: load it with num_shards=None or 1, got {n_target}")
    if bounded:
        kwargs.update(max_capacity=bounded.get("max_capacity"), evict=bounded.get("evict"),
                      evict_window=bounded.get("evict_window"))
    try:
        v = Variable(cfg["dim"], key_dtype=cfg["key_dtype"], value_dtype=cfg["value_dtype"],
                     num_shards=n_target, partitioner=partitioner, name=cfg["name"],
                     initializer=cfg["initializer"], seed=cfg["seed"], **kwargs, **extra)
        if bounded:             # the clocks go on from where they were
            v._clock, v._last_step = int(bounded["clock"]), int(bounded["last_step"])
            v._epoch = None if bounded["epoch"] is None else int(bounded["epoch"])
        elif last_step is not None:
            v._last_step = int(last_step)
        return v
    except (TypeError, ValueError, KeyError) as e:
        raise _corrupt(path, f"bad variable configuration ({e})") from None
    except RuntimeError as e:
        if device is None and on_gpu:
            raise RuntimeError(f"{e} (checkpoint {path} was saved from {cfg['device']!r}; pass "
                               "device='cpu' to load it on the CPU)") from e
        raise


def fill(v, archives, identity=False, keep=None, fit=False):
    """Insert the keys and every column of ``archives`` into the empty variable ``v``.

    ``identity``: one archive whose saved shard ``s`` goes whole to shard ``s`` of
    ``v``.  Otherwise keys are routed by ``v``'s partitioner; ``keep(keys) -> bool
    mask`` (e.g. the keys a rank owns) drops the others.  Only the kept keys are
    held in memory (plus one saved shard's keys at a time).  ``fit``: a bounded ``v``
    that cannot hold every key takes the highest-scored (:func:`_best`), with a
    warning; else that is a ``ValueError``.
    """
    # Pass 1: column layouts and the keys of every saved shard, routed to target shards
    # (all checked before anything is inserted).
    n_target = v.num_shards
    sources, columns = [], {}
    counts = np.zeros(n_target, np.int64)
    for ar in archives:
        path, man = ar.path, ar.manifest
        total = 0
        for s, entry in enumerate(_get(man, "shards", list, path)):
            size = _get(entry, "size", int, path, f"shards[{s}].size")
            if size < 0:
                raise _corrupt(path, f"shards[{s}].size is negative")
            layout = _parse_columns(path, s, entry, v.dim, _checks.storage_dtype(v.value_dtype))
            keys = _read_whole(ar, _get(entry, "keys", dict, path, f"shards[{s}].keys"),
                               f"shards[{s}].keys", v._id_dtype, (size,))
            total += size
            for cname, width, dt, init, _ in layout:
                have = columns.setdefault(cname, (width, dt, init))
                if have[0] != width or have[1] != dt or not _init_equal(have[2], init):
                    raise _corrupt(path, f"column {cname!r} differs between shards")
            if identity:
                routes = [(s, None, keys.astype(np.int64))]
            else:
                kept = None if keep is None else np.flatnonzero(keep(keys))
                part = keys if kept is None else keys[kept]
                try:
                    pos = split(part, n_target, v.partitioner or default_partitioner)
                except ValueError as e:
                    raise ValueError(f"loading checkpoint {path}: {e}") from None
                routes = [(t, p if kept is None else kept[p], part[p].astype(np.int64))
                          for t, p in enumerate(pos) if p.shape[0]]
            for t, _, k_ in routes:
                counts[t] += k_.shape[0]
            sources.append((ar, s, size, layout, routes))
            del keys
        if man.get("size") != total:
            raise _corrupt(path, f"manifest size {man.get('size')!r} != sum of shard sizes {total}")
    if columns and not _init_equal(columns["values"][2], v.shards[0].columns["values"].init):
        raise _corrupt(archives[0].path, "values initializer params do not match the "
                       "initializer config")
    limit = getattr(v.shards[0], "limit", None)     # (a bounded table has one shard)
    if fit and limit is not None and counts[0] > limit:
        sources, left = _best(sources, limit)
        counts[0] -= left
        identity = False
        warnings.warn(f"{left} keys of checkpoint {archives[0].path} left out: the table "
                      f"holds max_capacity={limit} keys, and these scored lowest (an insert "
                      f"would have evicted them first)", stacklevel=4)
    for shard, c in zip(v.shards, counts):
        limit = getattr(shard, "limit", None)
        if limit is not None and c > limit:
            raise ValueError(f"checkpoint {archives[0].path} holds {c} keys, more than the "
                             f"max_capacity {limit} of the table it is loaded into")
        for cname, (width, dt, init) in columns.items():
            if cname != "values" and cname not in shard.columns:   # (a bounded one's score)
                shard.add_column(cname, width, dt, init)

    # Reserve every target exactly once.
    ios = [_io(shard) for shard in v.shards]
    for io_, c in zip(ios, counts):
        if c:
            with io_.context():
                io_.shard._rehash(int(c))
                io_.shard._reserve_rows(int(c))

    # Pass 2: index the keys (a kernel), then stream every column into place.
    # Keys of saved shard s bound for target t get the next contiguous rows of t,
    # in saved order, so columns are copied by slices (or read straight in).
    for ar, s, n, layout, routes in sources:
        path = ar.path
        parts = []            # (target io, positions in saved shard or None, first row, keys)
        for t, p, keys in routes:
            parts.append((ios[t], p, ios[t].shard.fresh, keys))
            _bulk_insert(ios[t], keys, path, s)
        saved_names = set()
        for j, (cname, width, dt, _, arr) in enumerate(layout):
            saved_names.add(cname)
            reader = ar.open_array(arr, f"shards[{s}].columns[{j}].array", dt, (n, width))
            step = _chunk_rows(width, dt.itemsize)
            buf = None
            for i in range(0, n, step):
                m = min(step, n - i)
                if identity:
                    io_, _, base, _ = parts[0]
                    view = io_.rows_view(cname, base + i, m)
                    if view is not None:
                        reader.read_into(view)
                        continue
                if buf is None:
                    buf = np.empty((min(step, n), width), dt)
                chunk = reader.read_into(buf[:m])
                for io_, p, base, _ in parts:
                    if p is None:
                        with io_.context():
                            io_.put_rows(cname, base + i, chunk)
                        continue
                    a, b = np.searchsorted(p, (i, i + m))
                    if b > a:
                        view = io_.rows_view(cname, base + a, b - a)
                        if view is not None:
                            np.take(chunk, p[a:b] - i, axis=0, mode="clip", out=view)
                        else:
                            with io_.context():
                                io_.put_rows(cname, base + a, np.take(chunk, p[a:b] - i, axis=0))
            reader.verify()
        # Columns this saved shard lacked start from their initial values (and those no
        # saved shard had: a bounded table's score, loading a table saved without bounds).
        for io_, p, base, keys in parts:
            for cname in sorted(io_.shard.columns.keys() - saved_names):
                with io_.context():
                    io_.init_rows(cname, base, keys)
    for shard in v.shards:          # a bounded shard rebuilds its score copy by the index
        getattr(shard, "_loaded", lambda: None)()
    return v


def _best(sources, limit):
    """``(sources, left out)``: :func:`fill`'s saved shards with only the ``limit``
    highest-scored of their routed keys (the ties: the first saved), positions in
    saved order as before."""
    from .bounded import SCORE, highest_first
    scores = []
    for ar, s, size, layout, routes in sources:
        col = next((c for c in layout if c[0] == SCORE), None)
        if col is None:
            raise ValueError(f"checkpoint {ar.path} holds more keys than max_capacity={limit} "
                             f"and no scores to choose them by (it was saved from a table "
                             f"without max_capacity)")
        if col[1] != 1 or col[2] != np.int64:
            raise _corrupt(ar.path, f"shard {s}: the score column is not int64[1]")
        sc = _read_whole(ar, col[4], f"shards[{s}].score", np.dtype(np.int64), (size, 1))[:, 0]
        scores += [sc if p is None else sc[p] for _, p, _ in routes]
    everyone = np.concatenate(scores)
    taken = np.zeros(everyone.shape[0], np.bool_)
    taken[highest_first(everyone)[:limit]] = True
    out, at = [], 0
    for ar, s, size, layout, routes in sources:
        kept = []
        for t, p, keys in routes:
            mine = taken[at:at + keys.shape[0]]
            at += keys.shape[0]
            if mine.any():
                kept.append((t, (np.arange(size) if p is None else p)[mine], keys[mine]))
        out.append((ar, s, size, layout, kept))
    return out, int(everyone.shape[0] - limit)


def _bulk_insert(io_, keys, path, s):
    """Insert ``keys`` (unique, absent) at rows ``shard.fresh, shard.fresh + 1, ...``.

    The shard's index and row arena must already have room (reserved up front).
    Uses the rehash kernel on ``(key, row)`` pairs; a probe afterwards proves
    every key landed at its row (a duplicate key would not), but the keys a bucketed
    bounded index holds back (``n_overflow``: their bucket is full; placed by score
    once the columns are in, see :meth:`numbaemb.bounded.BoundedRows._place`).
    """
    shard = io_.shard
    if shard.free_rows.shape[0] or shard.fresh != shard.n_full or \
            shard.fresh + keys.shape[0] > shard.values.shape[0]:
        raise RuntimeError("bulk insert needs a fresh shard with reserved rows")
    with io_.context():
        for i in range(0, keys.shape[0], BULK_KEYS):
            kk = keys[i:i + BULK_KEYS]
            held = getattr(shard, "n_overflow", 0)
            found = io_.bulk_insert(kk, shard.fresh)
            want = np.arange(shard.fresh, shard.fresh + kk.shape[0])
            if not np.array_equal(found, want):
                placed = found >= 0
                if (~placed).sum() != getattr(shard, "n_overflow", 0) - held or \
                        not np.array_equal(found[placed], want[placed]):
                    raise _corrupt(path, f"shard {s} holds duplicate keys")
            shard._take_rows(kk.shape[0])
