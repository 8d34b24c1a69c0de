"""Kernels compiled when the wheel is built, put into Numba's cache on first import.

Compiling numbaemb's kernels takes 10-25 s on a small machine; Numba's on-disk
cache makes every later process start in a fraction of a second, but a new user,
a fresh container or a new node starts with an empty cache.  So building the
wheel (``pip install .``; :mod:`jit_kernels._build`) runs ``python -m
numbaemb.warmup --prebuilt DIR``, which compiles every kernel the warmup covers
and collects their cache files (:func:`collect`) into ``jit_kernels/prebuilt/``:

* ``jit_kernels/`` and ``numbaemb/``: Numba's index (``.nbi``) and data (``.nbc``)
  files of the functions defined in those packages;
* ``manifest.json``: what they were compiled for (:func:`this_process`: Numba's
  version, Python's ABI tag, Numba's codegen "magic tuple": target triple, CPU
  name and CPU features, and the fingerprint of the kernels' sources).

At import, ``numbaemb`` calls :func:`seed`: if that directory exists and its
manifest matches this process, its entries are merged (:func:`merge`) into the
directory Numba caches these packages in here (``NUMBA_CACHE_DIR``, ``__pycache__``
beside the sources, or the user-wide cache; whichever Numba's locators pick).  A
marker file records it, so later imports only read the manifest and look for the
marker (2 ms); processes that import at once (a job's ranks on a shared cache) take
a file lock in turn, so one merges and the others find the marker.  The first time it is 6.5 MB of files and about 0.1 s; the first table
operations then load machine code instead of compiling it.  A wheel built on another
CPU model, or for another Numba or other sources, is left alone (Numba would ignore
its files anyway) and the kernels compile on first use as before.
``NUMBAEMB_PREBUILT=0`` turns seeding off, ``NUMBAEMB_PREBUILT=DIR`` seeds from
``DIR`` (``benchmarks/bench_compile.py`` uses both).

Cache files are relocatable: their stamp is a hash of the source's contents
(:mod:`jit_kernels._cache`), their index key the function's bytecode, signature
and the magic tuple; none of it names where the package is installed.

>>> info = this_process()
>>> sorted(info)
['fingerprint', 'magic', 'numba', 'python']
"""
import hashlib
import json
import os
import pickle
import secrets
import sys
import tempfile

from . import _cache

HERE = os.path.dirname(os.path.abspath(__file__))
PREBUILT = os.path.join(HERE, "prebuilt")
PACKAGES = {"jit_kernels": HERE,
            "numbaemb": os.path.join(os.path.dirname(HERE), "numbaemb")}
MANIFEST = "manifest.json"


def this_process():
    """What cached machine code must have been compiled for to load in this process."""
    import numba
    from numba.core.registry import cpu_target
    magic = cpu_target.target_context.codegen().magic_tuple()
    return {"numba": numba.__version__,
            "python": "py%d%d%s" % (*sys.version_info[:2], getattr(sys, "abiflags", "")),
            "magic": [str(m) for m in magic],
            "fingerprint": _cache.fingerprint().hex()}


def cache_dir(package_dir):
    """The directory Numba caches the functions of ``package_dir``'s files in, as its
    locators pick it for this process (created if need be); None if none applies."""
    impl, _ = _cache._locators()
    if impl is None or os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES"):
        return None
    py_file = os.path.join(package_dir, "__init__.py")
    for cls in impl._locator_classes:
        try:
            loc = cls.from_function(cache_dir, py_file)
        except Exception:           # a locator that cannot serve a plain file
            loc = None
        if loc is not None:
            return loc.get_cache_path()
    return None


def _index_bases(directory):
    """Base names (``name-line.pyXY``) of the cache indexes in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(n[:-4] for n in names if n.endswith(".nbi"))


def _write(path, chunks):
    """Write ``chunks`` (bytes) to ``path`` under a unique name, then rename it into
    place: a reader sees the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".prebuilt-")
    try:
        with os.fdopen(fd, "wb") as out:
            for c in chunks:
                out.write(c)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_index(path):
    """``(numba version, source stamp, {key: data file name})`` of a Numba cache index
    (the layout of ``numba.core.caching.IndexDataCacheFile``); None if unreadable."""
    try:
        with open(path, "rb") as f:
            version = pickle.load(f)
            stamp, overloads = pickle.loads(f.read())
        return version, stamp, overloads
    except Exception:           # absent, truncated, or pickled by another Numba
        return None


def _merge_function(sources, dest, base, first, lock):
    """The entries of function ``base``'s index in each of ``sources`` (directories),
    added to its index in ``dest`` with their data files; entries ``dest`` already has
    stay.  It runs under the lock Numba's saves of these functions take
    (:func:`jit_kernels._cache.locked`), so a process compiling into ``dest`` at the
    same time sees the merged index or adds to it.  New data files are numbered from
    ``first`` on (a cache in use: a random start far above Numba's own small numbers,
    :func:`live_start`, should a writer not take the lock).  Data files are written
    before the index that names them.  Returns True if ``dest``'s index changed."""
    entries, head = {}, None
    for src in sources:
        got = _read_index(os.path.join(src, base + ".nbi"))
        if got is None or (head is not None and got[:2] != head):
            continue                        # another Numba or other sources: not ours
        head = got[:2]
        for key, name in got[2].items():
            entries.setdefault(key, os.path.join(src, name))
    if head is None:
        return False
    index = os.path.join(dest, base + ".nbi")
    if not lock:
        return _merge_into(index, dest, base, head, entries, first)
    with _cache.locked(index + ".lock"):      # the lock Numba's saves take here too
        return _merge_into(index, dest, base, head, entries, first)


def _merge_into(index, dest, base, head, entries, first):
    from numba.core.serialize import dumps
    have = _read_index(index)
    have = have[2] if have is not None and have[:2] == head else {}
    new = [(k, path) for k, path in entries.items() if k not in have]
    if not new:
        return False
    merged, used, i = dict(have), set(have.values()), first
    for key, path in new:
        while f"{base}.{i}.nbc" in used:
            i += 1
        name = f"{base}.{i}.nbc"
        used.add(name)
        with open(path, "rb") as f:
            _write(os.path.join(dest, name), [f.read()])
        merged[key] = name
    _write(index, [pickle.dumps(head[0], protocol=-1), dumps((head[1], merged))])
    return True


def live_start():
    """Where new data file numbers start in a cache in use (see :func:`_merge_function`)."""
    return 1000 + secrets.randbelow(10 ** 9)


def merge(sources, dest, first=1, lock=True):
    """Add every function's cache entries found in ``sources`` (directories of Numba
    cache files) to ``dest``; returns how many functions' indexes changed.
    ``lock=False``: ``dest`` is private to this process (no lock files left there)."""
    os.makedirs(dest, exist_ok=True)
    bases = sorted(set().union(*(_index_bases(s) for s in sources)))
    return sum(_merge_function(sources, dest, b, first, lock) for b in bases)


def write_manifest(dest, functions):
    """``dest/manifest.json``: :func:`this_process` and the number of functions."""
    with open(os.path.join(dest, MANIFEST), "w") as f:
        json.dump(dict(this_process(), functions=functions), f, indent=1)


def collect(dest, sources=None):
    """Put the cache files of every function of :data:`PACKAGES` into
    ``dest/<package>/`` (from this process's cache directories, or from
    ``sources``: directories laid out as ``dest`` is) and write ``dest/manifest.json``;
    returns the number of functions.  Run in a process of the machine, Numba and
    sources that compiled them."""
    n = 0
    for package, directory in PACKAGES.items():
        if sources is None:
            src = [cache_dir(directory)]
            if src[0] is None:
                raise RuntimeError("Numba's cache locators are not in use: nothing to collect")
        else:
            src = [os.path.join(s, package) for s in sources]
        out = os.path.join(dest, package)
        merge(src, out, lock=False)
        n += len(_index_bases(out))
    write_manifest(dest, n)
    return n


def _marker(manifest_bytes):
    return ".numbaemb-prebuilt-" + hashlib.sha256(manifest_bytes).hexdigest()[:16]


def seed(src=None):
    """Add the prebuilt cache files in ``src`` (default: ``NUMBAEMB_PREBUILT`` if it
    names a directory, else :data:`PREBUILT`) to this process's cache directories,
    once per manifest, if the manifest matches this process.  Returns the number of
    functions whose index changed (0 when there was nothing to do)."""
    env = os.environ.get("NUMBAEMB_PREBUILT", "")
    if env == "0":
        return 0
    src = src or env or PREBUILT
    try:
        with open(os.path.join(src, MANIFEST), "rb") as f:
            raw = f.read()
    except OSError:
        return 0                          # no prebuilt kernels (a source checkout)
    try:
        return _seed(src, raw)
    except (OSError, ValueError, RuntimeError):
        return 0                          # an unwritable cache: compile as usual


def _seed(src, raw):
    targets = {p: cache_dir(d) for p, d in PACKAGES.items()}
    if any(t is None for t in targets.values()):
        return 0
    marker = _marker(raw)
    if all(os.path.exists(os.path.join(t, marker)) for t in targets.values()):
        return 0
    manifest = json.loads(raw)
    here = this_process()
    if any(manifest.get(k) != v for k, v in here.items()):
        return 0
    n = 0
    for package, target in targets.items():
        with _cache.locked(os.path.join(target, ".numbaemb-prebuilt.lock")):
            if os.path.exists(os.path.join(target, marker)):
                continue                    # another process seeded it while we waited
            n += merge([os.path.join(src, package)], target, first=live_start())
            _write(os.path.join(target, marker), [raw])
    return n
