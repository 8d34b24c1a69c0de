"""Kernels compiled once across processes sharing a cache (jit_kernels._compile_lock)."""
import glob
import json
import os
import subprocess
import sys
import time


from jit_kernels import _compile_lock
from tests.compile_log import log, needs_locks, own_cache_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = needs_locks

JOB = """
import json, sys
import numpy as np
import numbaemb as ne
""" + log(with_args=True) + """
v = ne.Variable(dim=4, initializer=ne.initializers.RandomUniform(seed=3))
ids = np.array([0, -1, 2**63 - 1, -2**63, 5, 5, 7], np.int64)
v.find_or_insert(ids)
opt = ne.optimizers.Adam(learning_rate=0.1)
ne.optimizers.apply_gradients(v, opt, ids, np.ones((7, 4), np.float32), step=1)
print(json.dumps({"compiled": compiled, "rows": v.lookup(ids).tolist()}))
"""


def _start(code, cache_dir, **env):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), **env))


def _finish(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out.strip().split("\n")


def test_processes_starting_cold_together_compile_each_kernel_once(tmp_path):
    """Two processes run one job at once on an empty shared cache: no kernel signature
    is compiled by both (each waits for the other's and loads it), and the results are
    those of a process that compiled everything itself."""
    runs = [json.loads(_finish(p)[-1]) for p in
            [_start(JOB, tmp_path / "shared") for _ in range(2)]]
    alone = json.loads(_finish(_start(JOB, tmp_path / "alone"))[-1])
    first, second = (set(r["compiled"]) for r in runs)
    assert not first & second
    assert first | second == set(alone["compiled"])
    assert runs[0]["rows"] == runs[1]["rows"] == alone["rows"]
    assert not glob.glob(str(tmp_path / "shared" / "*" / "*.nbc.tmp*"))
    assert not glob.glob(str(tmp_path / "shared" / "*" / "*.compiling"))   # removed when done


PKG = """
import sys
sys.path[:0] = [{root!r}, {tmp!r}]
from jit_kernels._cache import register
register({tmp!r} + "/pkg")
import pkg.mod
print(pkg.mod.g(2.5), sum(pkg.mod.g.stats.cache_misses.values()),
      sum(pkg.mod.g.stats.cache_hits.values()))
"""


def _package(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("from numba import njit\n\n\n"
                                "@njit(cache=True)\ndef g(x):\n    return x + 1\n")
    return PKG.format(root=ROOT, tmp=str(tmp_path)), pkg / "__pycache__"


def _lock_file(code, cache, tmp_path):
    """The lock file path of g(float64), from a first run; then the cache is emptied."""
    code += ("from numba import types\nfrom jit_kernels._compile_lock import _lock_path\n"
             "print(_lock_path(pkg.mod.g._cache, (types.float64,), pkg.mod.g.targetctx))\n")
    out = _finish(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                                   env=own_cache_env()))
    assert out[-2] == "3.5 1 0" and not glob.glob(str(cache / "*.compiling"))
    for f in glob.glob(str(cache / "*.nb[ic]")):
        os.remove(f)
    return out[-1]


def test_a_waiting_process_loads_what_the_holder_saved(tmp_path):
    code, cache = _package(tmp_path)
    lock = _lock_file(code, cache, tmp_path)
    fd = _compile_lock.acquire(lock, max_wait=0)
    assert fd is not None
    try:
        waiting = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                                   env=own_cache_env())
        time.sleep(3)                           # (it starts in about 1 s, then waits)
        assert waiting.poll() is None and not glob.glob(str(cache / "*.nbi"))
        # the holder's compile, played by a process that does not take the lock
        holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                                  env=own_cache_env(NUMBAEMB_COMPILE_LOCK="0"))
        assert _finish(holder)[-1] == "3.5 1 0"
        assert waiting.poll() is None
    finally:
        _compile_lock.release(fd)
    assert _finish(waiting)[-1] == "3.5 0 1"    # loaded, not compiled


def test_a_process_stops_waiting_after_the_limit(tmp_path):
    code, cache = _package(tmp_path)
    lock = _lock_file(code, cache, tmp_path)
    fd = _compile_lock.acquire(lock, max_wait=0)
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                                env=own_cache_env(NUMBAEMB_COMPILE_WAIT="2"))
        assert _finish(proc)[-1] == "3.5 1 0"   # compiled itself while the lock is held
        assert time.monotonic() - t0 >= 2
    finally:
        _compile_lock.release(fd)


FAIL = PKG.replace("print(pkg.mod.g(2.5)", """import glob
from numba.core.errors import TypingError
from jit_kernels import _compile_lock
try:
    pkg.mod.g("text")                    # fails to type: the lock is let go
except TypingError:
    pass
from numba import cfunc, types
try:                                     # a cached cfunc (no compile event) that fails
    cfunc(types.float64(types.float64), cache=True)(pkg.mod.bad)
except TypingError:
    pass
locks = glob.glob({tmp!r} + "/pkg/__pycache__/*.compiling")   # (removed as let go)
print(len(locks), len(_compile_lock._HELD))
print(pkg.mod.g(2.5)""")


def test_a_failed_compile_lets_go_of_its_lock(tmp_path):
    _, _ = _package(tmp_path)
    with open(tmp_path / "pkg" / "mod.py", "a") as f:
        f.write("\n\ndef bad(x):\n    return x + 'text'\n")
    out = _finish(subprocess.Popen([sys.executable, "-c", FAIL.format(root=ROOT, tmp=str(tmp_path))],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=str(tmp_path), env=own_cache_env()))
    assert out[-2:] == ["0 0", "3.5 2 0"]   # (misses: the failed signature too)


def test_locks_wait_and_give_up():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.compiling")
        fd = _compile_lock.acquire(path, max_wait=0)
        assert fd is not None
        t0 = time.monotonic()
        assert _compile_lock.acquire(path, max_wait=0.3) is None   # held (another fd)
        assert time.monotonic() - t0 >= 0.3
        _compile_lock.release(fd)
        fd = _compile_lock.acquire(path, max_wait=0)
        assert fd is not None
        _compile_lock.release(fd)


NESTED = """
import sys
sys.path[:0] = [{root!r}, {tmp!r}]
from jit_kernels._cache import register
register({tmp!r} + "/pkg")
from numba.core import event
from jit_kernels import _compile_lock
held = []
class Log(event.Listener):
    def on_start(self, e): pass
    def on_end(self, e):                 # after the lock's own listener
        held.append((e.data["dispatcher"].py_func.__name__,
                     sum(map(len, _compile_lock._HELD.values()))))
event.register("numba:compile", Log())
import pkg.mod
print(pkg.mod.k(2.5), held, len(_compile_lock._HELD))
"""


def test_a_kernel_holds_its_lock_until_it_is_saved_and_callees_until_theirs(tmp_path):
    """Compiling k types its callee h: both locks are held when h's compile ends (h's
    goes at h's save), k's until k's save; none after."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("from numba import njit\n\n\n"
                                "@njit(cache=True)\ndef h(x):\n    return x + 1\n\n\n"
                                "@njit(cache=True)\ndef k(x):\n    return h(x) * 2\n")
    out = _finish(subprocess.Popen([sys.executable, "-c", NESTED.format(root=ROOT, tmp=str(tmp_path))],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=str(tmp_path), env=own_cache_env()))
    assert out[-1] == "7.0 [('h', 2), ('k', 1)] 0"
    assert not glob.glob(str(pkg / "__pycache__" / "*.compiling"))


def test_a_forked_child_lets_go_of_the_parents_locks():
    """A child forked while this process holds a lock must not keep it held after
    the parent lets go."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.compiling")
        fd = _compile_lock.acquire(path, max_wait=0)
        _compile_lock._HELD[-1] = [(fd, path)]  # as if this process were compiling
        pid = os.fork()
        if pid == 0:                            # the child lives on after the parent lets go
            time.sleep(1.5)
            os._exit(0)
        try:
            time.sleep(0.3)
            _compile_lock.release(_compile_lock._HELD.pop(-1)[0][0])
            again = _compile_lock.acquire(path, max_wait=0.5)
            assert again is not None
            _compile_lock.release(again)
        finally:
            _compile_lock._HELD.pop(-1, None)
            os.waitpid(pid, 0)
