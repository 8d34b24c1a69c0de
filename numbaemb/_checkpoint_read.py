"""Reading a native checkpoint: the zip archive, its manifest and every array,
each verified (format, version, dtype, shape, SHA-256) before any data is used.

Split from :mod:`numbaemb.checkpoint`, which writes checkpoints and rebuilds
variables from what this module has verified.
"""
import hashlib
import io
import json
import os
import struct
import zipfile

import numpy as np
from numpy.lib import format as npformat

from jit_kernels import initializers as _kinit

FORMAT = "numbaemb.checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_KINDS = (_kinit.ZEROS, _kinit.CONSTANT, _kinit.UNIFORM, _kinit.NORMAL, _kinit.TRUNCATED_NORMAL)


def _init_from_json(d, where):
    try:
        kind, seed = d["kind"], d["seed"]
        a, b = float(d["a"]), float(d["b"])
        const = np.asarray(d["const"], np.float64).reshape(-1)
    except (KeyError, TypeError, ValueError, OverflowError):
        raise _corrupt(where, f"bad initializer params {d!r}") from None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (kind, seed)) \
            or kind not in _KINDS or not -2**63 <= seed < 2**63 or const.shape[0] < 1:
        raise _corrupt(where, f"bad initializer params {d!r}")
    return (kind, a, b, seed, const)


def _bytes_view(arr):
    """A flat uint8 view of a C-contiguous array (for hashing and writing)."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


class _Corrupt(ValueError):
    pass


def _corrupt(where, what):
    return _Corrupt(f"checkpoint {where!s} is corrupt/truncated: {what}")


def _get(d, key, typ, where, what=None):
    """``d[key]``, which must be a ``typ`` (bool does not pass for int)."""
    if not isinstance(d, dict) or key not in d:
        raise _corrupt(where, f"manifest lacks {what or key!r}")
    val = d[key]
    if not isinstance(val, typ) or (isinstance(val, bool) and typ is not bool):
        raise _corrupt(where, f"manifest field {what or key!r} has a bad value {val!r}")
    return val


class _Archive:
    """A checked, open checkpoint archive: its manifest and raw access to members."""

    def __init__(self, path, data=None):
        """The file ``path``, or with ``data`` (bytes) those bytes (``path`` names them)."""
        self.path = path
        # FileNotFoundError / IsADirectoryError as is
        self.f = open(path, "rb") if data is None else io.BytesIO(data)
        try:
            self.file_size = os.fstat(self.f.fileno()).st_size if data is None else len(data)
            try:
                zf = zipfile.ZipFile(self.f)
            except Exception as e:      # BadZipFile, OSError on bad offsets, struct.error, ...
                raise _corrupt(path, f"not a readable zip archive ({e}); truncated, or not "
                               "a numbaemb checkpoint") from None
            names = zf.namelist()
            if len(set(names)) != len(names):
                raise _corrupt(path, "duplicate archive members")
            if MANIFEST not in names:
                raise _corrupt(path, f"no {MANIFEST}: not a numbaemb checkpoint")
            self.infos = {i.filename: i for i in zf.infolist()}
            try:
                raw = zf.read(MANIFEST)
            except Exception as e:      # bad CRC-32, bad local header, unknown compression, ...
                raise _corrupt(path, f"{MANIFEST} unreadable ({e})") from None
            try:
                self.manifest = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise _corrupt(path, f"{MANIFEST} is not valid JSON ({e})") from None
            if not isinstance(self.manifest, dict):
                raise _corrupt(path, f"{MANIFEST} is not a JSON object")
            fmt = self.manifest.get("format")
            if fmt != FORMAT:
                raise _corrupt(path, f"format is {fmt!r}, expected {FORMAT!r}: not a numbaemb checkpoint")
            ver = self.manifest.get("format_version")
            if not isinstance(ver, int) or isinstance(ver, bool) or ver != FORMAT_VERSION:
                newer = (" (written by a newer numbaemb?)"
                         if isinstance(ver, int) and ver > FORMAT_VERSION else "")
                raise ValueError(f"checkpoint {path} has unsupported format_version {ver!r}{newer}; "
                                 f"this numbaemb reads format_version {FORMAT_VERSION}")
        except BaseException:
            self.f.close()
            raise

    def close(self):
        self.f.close()

    def open_array(self, entry, where, dtype, shape):
        """Seek to the data of the .npy member described by manifest ``entry``; check
        its header against ``dtype`` and ``shape``; returns the byte count to read."""
        if not isinstance(entry, dict):
            raise _corrupt(self.path, f"{where}: bad manifest entry")
        name = _get(entry, "member", str, self.path, f"{where}.member")
        _get(entry, "sha256", str, self.path, f"{where}.sha256")
        info = self.infos.get(name)
        if info is None:
            raise _corrupt(self.path, f"member {name} is missing")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise _corrupt(self.path, f"member {name} is compressed; expected stored")
        if entry.get("nbytes") != info.file_size:
            raise _corrupt(self.path, f"member {name} has {info.file_size} bytes, manifest says "
                           f"{entry.get('nbytes')!r}")
        f = self.f
        try:
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise _corrupt(self.path, f"member {name}: bad local header")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            if f.read(name_len) != name.encode():
                raise _corrupt(self.path, f"member {name}: local header names another file")
            start = info.header_offset + 30 + name_len + extra_len
            end = start + info.file_size
            if end > self.file_size:
                raise _corrupt(self.path, f"member {name} runs past the end of the file")
            f.seek(start)
            major, minor = npformat.read_magic(f)
            if (major, minor) == (1, 0):
                hshape, fortran, hdtype = npformat.read_array_header_1_0(f)
            elif (major, minor) == (2, 0):
                hshape, fortran, hdtype = npformat.read_array_header_2_0(f)
            else:
                raise _corrupt(self.path, f"member {name}: unsupported .npy version {major}.{minor}")
        except _Corrupt:
            raise
        except Exception as e:      # numpy's header parser raises many kinds (TokenError, ...)
            raise _corrupt(self.path, f"member {name}: bad .npy header "
                           f"({type(e).__name__}: {e})") from None
        if fortran or hdtype != np.dtype(dtype) or tuple(hshape) != tuple(shape):
            raise _corrupt(self.path, f"member {name} holds {hdtype}{list(hshape)}"
                           f"{' (fortran order)' if fortran else ''}, expected {np.dtype(dtype)}"
                           f"{list(shape)}")
        header_len = f.tell() - start
        sha = hashlib.sha256()
        f.seek(start)
        sha.update(f.read(header_len))
        data_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if header_len + data_bytes != info.file_size:
            raise _corrupt(self.path, f"member {name} has {info.file_size} bytes, expected "
                           f"{header_len + data_bytes}")
        return _Reader(self, name, entry["sha256"], sha, data_bytes)


class _Reader:
    """Reads an array member's data in chunks into caller buffers, hashing as it goes."""

    def __init__(self, archive, name, want_sha, sha, nbytes):
        self.archive, self.name, self.want, self.sha, self.left = archive, name, want_sha, sha, nbytes

    def read_into(self, arr):
        b = _bytes_view(arr)
        if b.shape[0] > self.left:
            raise RuntimeError("read past the end of a member")
        got = self.archive.f.readinto(memoryview(b))
        if got != b.shape[0]:
            raise _corrupt(self.archive.path, f"member {self.name} is truncated")
        self.sha.update(b)
        self.left -= got
        return arr

    def verify(self):
        if self.left:
            raise RuntimeError("member not fully read")
        if self.sha.hexdigest() != self.want:
            raise _corrupt(self.archive.path, f"SHA-256 mismatch in member {self.name}")


def _read_whole(archive, entry, where, dtype, shape):
    out = np.empty(shape, dtype)
    r = archive.open_array(entry, where, dtype, shape)
    r.read_into(out)
    r.verify()
    return out


_ALLOWED_KINDS = "biuf"


def _parse_columns(path, s, entry, dim, value_dtype):
    cols = _get(entry, "columns", list, path, f"shards[{s}].columns")
    out = []
    seen = set()
    for j, c in enumerate(cols):
        where = f"shards[{s}].columns[{j}]"
        name = _get(c, "name", str, path, f"{where}.name")
        width = _get(c, "width", int, path, f"{where}.width")
        try:
            dt = np.dtype(_get(c, "dtype", str, path, f"{where}.dtype"))
        except TypeError:
            raise _corrupt(path, f"{where}: bad dtype {c['dtype']!r}") from None
        if width < 0 or dt.kind not in _ALLOWED_KINDS or dt.hasobject or name in seen:
            raise _corrupt(path, f"{where}: bad column {name!r} width {width} dtype {dt}")
        seen.add(name)
        init = _init_from_json(_get(c, "init", dict, path, f"{where}.init"), path)
        if init[4].shape[0] < width:       # the kernels read const[column]
            raise _corrupt(path, f"{where}: initializer const shorter than width {width}")
        out.append((name, width, dt, init, _get(c, "array", dict, path, f"{where}.array")))
    if not out or out[0][0] != "values" or out[0][1] != dim or out[0][2] != value_dtype:
        raise _corrupt(path, f"shards[{s}]: first column must be 'values' of width {dim} "
                       f"and dtype {value_dtype}")
    return out
