"""Numba's on-disk cache, made to notice edits to the kernels a function inlines.

Numba stamps a cached function with a hash of its own source file only.  The
drivers here inline per-element bodies from other files (``probing``,
``initializers``, ``atomics``...), so after an edit to one of those (or an
upgrade that changed only them) a driver's cached machine code would still run
the old body: stale results, silently.  :func:`register` makes every cached
function defined under a registered directory carry, in its stamp, a hash of
the contents of all ``.py`` files of the directories registered with
``hashed=True``: any edit there recompiles them on next use (about 12 s for
all of numbaemb's kernels).  ``jit_kernels`` registers itself hashed;
``numbaemb`` (whose few cached functions use ``jit_kernels``' intrinsics)
registers unhashed, so that editing its pure-Python files costs no recompile.

It does so by putting, ahead of Numba's own cache locators, subclasses of them
that only answer for files under a registered directory and add that hash to
the stamp, and stamp the function's own file by its contents (so cache files can
move: :mod:`jit_kernels.prebuilt`); the cache files stay where Numba puts them.  With
``NUMBA_CACHE_LOCATOR_CLASSES`` set, or a Numba without these classes, Numba's
own locators apply unchanged.

>>> import jit_kernels                 # registers its own directory at import
>>> len(fingerprint())
32
"""
import contextlib
import functools
import hashlib
import inspect
import os

from . import _compile_lock

_DIRS = []              # registered package directories (absolute, normalised)
_HASHED = []            # those whose sources make the fingerprint
_BASES = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")


# files of jit_kernels that define and inline no compiled code (build and cache
# plumbing): editing them must not recompile every kernel
_NO_KERNELS = ("_build.py", "_cache.py", "_compile_lock.py", "prebuilt.py")


def _sources(dirs):
    """The ``.py`` files directly in ``dirs`` (but :data:`_NO_KERNELS`), sorted."""
    out = []
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        out.extend(os.path.join(d, n) for n in names
                   if n.endswith(".py") and n not in _NO_KERNELS)
    return sorted(out)


@functools.lru_cache(maxsize=None)
def _hash_files(stamps):
    h = hashlib.sha256()
    for path, _, _ in stamps:           # package/file names, not where it is installed
        h.update(os.path.join(*path.split(os.sep)[-2:]).encode())
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"<unreadable>")
    return h.digest()


def fingerprint(dirs=None):
    """SHA-256 (32 bytes) of the names and contents of the ``.py`` files in ``dirs``
    (default: the directories registered ``hashed``); recomputed only when a
    file's size or mtime changes."""
    stamps = []
    for path in _sources(_HASHED if dirs is None else dirs):
        try:
            st = os.stat(path)
            stamps.append((path, st.st_mtime_ns, st.st_size))
        except OSError:
            stamps.append((path, 0, -1))
    return _hash_files(tuple(stamps))


def _ours(py_file):
    path = os.path.abspath(py_file)
    return any(os.path.dirname(path) == d or path.startswith(d + os.sep) for d in _DIRS)


class _PackageStamp:
    """Mixin for a Numba cache locator: only files under a registered directory;
    their stamp also holds :func:`fingerprint`."""

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _ours(py_file):
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self):
        # the file's contents, not its mtime (older Numbas stamp with the mtime): cache
        # files stay valid wherever the package is installed (:mod:`jit_kernels.prebuilt`)
        try:
            st = os.stat(self._py_file)
            own = _hash_files(((self._py_file, st.st_mtime_ns, st.st_size),))
        except OSError:
            own = super().get_source_stamp()
        from .lanes import SCALAR       # (the CPU then compiles a GPU's scalar code)
        return (own, fingerprint()) + (("scalar lanes",) if SCALAR else ())


def _locators():
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    bases = [getattr(caching, n, None) or getattr(caching, "_" + n, None) for n in _BASES]
    if impl is None or not isinstance(getattr(impl, "_locator_classes", None), list) \
            or any(b is None for b in bases):
        return None, []
    return impl, [type("Package" + b.__name__.lstrip("_"), (_PackageStamp, b), {})
                  for b in bases]


def register(directory, hashed=True):
    """Stamp the cached Numba functions of the files under ``directory`` with
    :func:`fingerprint`; ``hashed``: its own ``.py`` files count in the
    fingerprint.  True if Numba's locators could be extended (idempotent)."""
    d = os.path.abspath(directory)
    if d not in _DIRS:
        _DIRS.append(d)
    if hashed and d not in _HASHED:
        _HASHED.append(d)
    impl, ours = _locators()
    if impl is None:
        return False
    if not any(issubclass(c, _PackageStamp) for c in impl._locator_classes):
        impl._locator_classes[:0] = ours
    _lock_saves()
    _light_loads()
    _compile_lock.install(_is_ours)
    return True


def _is_ours(cache):
    """True for the on-disk cache of a function under a registered directory (marked
    when the cache is made, see :func:`_lock_saves`)."""
    return getattr(cache, "_numbaemb_ours", False)


@contextlib.contextmanager
def locked(path):
    """An exclusive ``flock`` on the file ``path`` (created) while the block runs, waiting
    as long as it takes (:func:`jit_kernels._compile_lock.acquire`); unlocked where file
    locks are not available."""
    fd = _compile_lock.acquire(path, max_wait=float("inf"))
    try:
        yield
    finally:
        if fd is not None:
            _compile_lock.release(fd)


def _lock_saves():
    """Make the cache saves of registered files take a lock on the function's index.

    Numba saves a new signature by reading the function's index, picking the first
    unused data file number, then writing the index and the data file.  Two
    processes saving different signatures of one function at once (test workers,
    ranks, the warmup) can pick one number: the index then pairs one signature with
    the other's machine code, which the next process loads and calls with the wrong
    types (numba/numba#4807, #10128).  Under the lock the second saver reads the
    first one's index and picks another number.  Numba's own functions and the
    user's are left as they are."""
    from numba.core import caching
    cls = getattr(caching, "FunctionCache", None)
    index_cls = getattr(caching, "IndexDataCacheFile", None)
    if cls is None or index_cls is None or getattr(cls, "_numbaemb_locks", False):
        return

    class LockedIndex(index_cls):
        def save(self, key, data):
            with locked(self._index_path + ".lock"):
                super().save(key, data)

    init = cls.__init__

    def __init__(self, py_func, *args, **kwargs):
        init(self, py_func, *args, **kwargs)
        try:
            mine = _ours(inspect.getfile(py_func))
        except TypeError:
            mine = False
        self._numbaemb_ours = mine       # compiled once across processes (_compile_lock)
        if mine and type(getattr(self, "_cache_file", None)) is index_cls:
            self._cache_file.__class__ = LockedIndex

    cls.__init__ = __init__
    cls._numbaemb_locks = True


def _light_loads():
    """Make cache loads of registered files skip Numba's context refresh.

    Numba's ``Cache.load_overload`` first calls ``target_context.refresh()``, which on
    the first call imports and installs every typing and lowering registry Numba has
    (``load_additional_registries``: 0.08-0.1 s of a warm process's 0.2 s of kernel
    loads).  Running machine code loaded from the cache needs none of them, only the
    runtime (NRT) that ``refresh`` also starts: a load of ours starts that alone.  The
    first real compile refreshes the context as always (``compile_extra``).  Loads for
    other targets (CUDA) and of other functions are left as they are."""
    from numba.core import caching
    cls = getattr(caching, "FunctionCache", None)
    if cls is None or getattr(cls, "_numbaemb_light", False):
        return
    try:
        from numba.core.cpu import CPUContext
        from numba.core.runtime import nrt
        load, start_runtime = cls.load_overload, nrt.rtsys.initialize
        cls._load_overload, cls._guard_against_spurious_io_errors   # noqa: B018 (relied on)
    except (ImportError, AttributeError):
        return

    def load_overload(self, sig, target_context):
        if not (_is_ours(self) and isinstance(target_context, CPUContext)):
            return load(self, sig, target_context)
        start_runtime(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    cls.load_overload = load_overload
    cls._numbaemb_light = True
