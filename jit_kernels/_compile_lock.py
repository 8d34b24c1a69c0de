"""Compile each kernel once across processes that share a Numba cache directory.

Ranks of a distributed job on a fresh node, test workers and ``python -m
numbaemb.warmup`` start cold together and need the same kernels in the same
order: without coordination every process compiles every kernel (4 ranks on 2
cores: four times the work on two cores).  With :func:`install`, a process that
misses the cache for a function of a registered directory (:mod:`jit_kernels._cache`)
takes an exclusive ``flock`` on a lock file for that function and signature (beside
the function's index: ``<index>.<key hash>.compiling``), looks in the cache again
(the holder before it may have saved the kernel meanwhile: it then loads it,
milliseconds) and otherwise compiles and saves it, then removes the file and lets
go.  Numba's own functions and the user's are left alone.

Safety: the lock is released when the save is done, when the compile fails (a
``numba:compile`` event that ends with an exception: typing errors, the literal
retry; a cached ``cfunc``'s compile that raises), and by the OS when the process
dies.  Removing the file is safe: a process still waiting on it goes on and finds
the kernel in the cache, a later one makes a new file and finds it too (after a
failed compile two processes may then both try again: a duplicate compile, never
a wrong result).  Locks are taken callers before callees (a kernel's compile types
its callees), and the call graph has no cycles, so processes cannot wait on each
other in a ring.  A process waits at most ``NUMBAEMB_COMPILE_WAIT`` seconds
(default 600) for another one, then compiles itself; where files cannot be locked
it compiles as Numba does.  ``NUMBAEMB_COMPILE_LOCK=0`` turns it off.

>>> import jit_kernels              # installs it for jit_kernels' and numbaemb's kernels
>>> installed()
True
"""
import hashlib
import os
import time

_HELD = {}              # id(cache) -> [(fd, path), ...]: the locks this process holds (LIFO)
_STATE = {"installed": False}
_FIRST_MISS = []        # callbacks for this process's first compile of one of ours


def on_first_miss(callback):
    """Run ``callback()`` once, when this process is about to compile the first
    of our functions that is not in the cache (a cold start): e.g. to start
    compiling other kernels in a helper process (:mod:`numbaemb._ahead`)."""
    _FIRST_MISS.append(callback)


def _missed():
    while _FIRST_MISS:
        try:
            _FIRST_MISS.pop(0)()
        except Exception:       # a helper that cannot start must not fail the compile
            pass


def switched_off(name):
    """True if the environment variable ``name`` is ``0`` / ``false`` / ``no`` / ``off``."""
    return os.environ.get(name, "1").strip().lower() in ("0", "false", "no", "off")


def _max_wait():
    try:
        return float(os.environ.get("NUMBAEMB_COMPILE_WAIT", "600"))
    except ValueError:
        return 600.0


def acquire(path, max_wait=None):
    """An open fd holding an exclusive ``flock`` on ``path`` (created), polling while
    another process holds it, for at most ``max_wait`` s; None on timeout or where
    files cannot be locked."""
    try:
        import fcntl
        fd = os.open(path, os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o666)
    except (ImportError, OSError):
        return None
    deadline = time.monotonic() + (_max_wait() if max_wait is None else max_wait)
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.005)   # (a waiter goes on within 5 ms)
        except OSError:
            break
    os.close(fd)
    return None


def release(fd):
    """Unlock and close an fd from :func:`acquire` (closing drops the lock)."""
    try:
        os.close(fd)
    except OSError:
        pass


def _lock_path(cache, sig, target_context):
    key = cache._index_key(sig, target_context.codegen())
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:20]
    return f"{cache._cache_file._index_path}.{digest}.compiling"


def _pop(cache):
    """Let go of the last lock taken for ``cache``'s function, and remove its file: a
    process already waiting on it goes on (and finds the kernel in the cache), later
    ones make a new file (and find it too)."""
    held = _HELD.get(id(cache))
    if held:
        fd, path = held.pop()
        try:
            os.unlink(path)
        except OSError:
            pass
        release(fd)
        if not held:
            del _HELD[id(cache)]


def _forget_in_child():
    """A forked child closes its copies of the parent's locks: a lock is let go only
    when every copy of its fd is closed, so the child would hold the parent's lock."""
    for held in _HELD.values():
        for fd, _ in held:          # (the parent's files stay: it still holds them)
            release(fd)
    _HELD.clear()


def _release_failed_cfuncs():
    """A cached ``cfunc`` compiles without a ``numba:compile`` event: let go of its
    lock when its compile raises."""
    try:
        from numba.core.ccallback import CFunc
    except ImportError:
        return
    compile_ = CFunc.compile

    def compile(self):
        try:
            return compile_(self)
        except BaseException:
            _pop(self._cache)
            raise

    CFunc.compile = compile


def install(is_ours):
    """Make the on-disk caches of the functions ``is_ours(cache)`` accepts compile
    once across processes (idempotent; nothing when ``NUMBAEMB_COMPILE_LOCK=0``).
    True if installed."""
    if _STATE["installed"]:
        return True
    if switched_off("NUMBAEMB_COMPILE_LOCK"):
        return False
    try:
        from numba.core import caching, event
        cls = caching.FunctionCache
        load, save = cls.load_overload, cls.save_overload
        cls._index_key              # noqa: B018 (the key this relies on)
    except (ImportError, AttributeError):
        return False

    def load_overload(self, sig, target_context):
        cres = load(self, sig, target_context)
        if cres is not None or not is_ours(self):
            return cres
        try:
            path = _lock_path(self, sig, target_context)
        except Exception:           # a Numba whose internals differ: compile as Numba does
            _missed()
            return None
        fd = acquire(path)
        if fd is not None:
            cres = load(self, sig, target_context)   # saved by the holder before us?
            if cres is not None:
                release(fd)
                return cres
            _HELD.setdefault(id(self), []).append((fd, path))  # until the save or a failure
        _missed()
        return None

    def save_overload(self, sig, data):
        try:
            save(self, sig, data)
        finally:
            _pop(self)

    class _FailedCompiles(event.Listener):
        def on_start(self, evt):
            pass

        def on_end(self, evt):
            # the exception, if any (Numba 0.68's ``is_failed`` answers the opposite)
            if getattr(evt, "_exc_details", None) is not None:
                cache = getattr(evt.data.get("dispatcher"), "_cache", None)
                if cache is not None:
                    _pop(cache)

    cls.load_overload, cls.save_overload = load_overload, save_overload
    event.register("numba:compile", _FailedCompiles())
    _release_failed_cfuncs()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_in_child)
    _STATE["installed"] = True
    return True


def installed():
    """True once :func:`install` has patched Numba's function caches."""
    return _STATE["installed"]
