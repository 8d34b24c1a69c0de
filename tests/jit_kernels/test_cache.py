"""Numba's on-disk cache notices edits to inlined bodies in other files (jit_kernels._cache)."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from jit_kernels import _cache, cpu_table
from tests.compile_log import own_cache_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_locators = pytest.mark.skipif(
    bool(os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES")) or _cache._locators()[0] is None,
    reason="Numba's own cache locators are in use")


def test_fingerprint_follows_contents(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    first = _cache.fingerprint([str(tmp_path)])
    assert len(first) == 32 and _cache.fingerprint([str(tmp_path)]) == first
    (tmp_path / "notes.txt").write_text("changed, still not a source\n")
    assert _cache.fingerprint([str(tmp_path)]) == first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert _cache.fingerprint([str(tmp_path)]) != first
    (tmp_path / "b.py").write_text("")
    assert len({first, _cache.fingerprint([str(tmp_path)])}) == 2


def test_fingerprint_is_the_same_wherever_the_package_is(tmp_path):
    for where in ("one", "two"):
        (tmp_path / where / "pkg").mkdir(parents=True)
        (tmp_path / where / "pkg" / "a.py").write_text("x = 1\n")
    assert (_cache.fingerprint([str(tmp_path / "one" / "pkg")])
            == _cache.fingerprint([str(tmp_path / "two" / "pkg")]))


@needs_locators
def test_kernels_are_stamped_with_the_package_fingerprint():
    locator = cpu_table.find_rows._cache._impl.locator
    assert isinstance(locator, _cache._PackageStamp)
    own, package = locator.get_source_stamp()
    assert package == _cache.fingerprint()


PROGRAM = """
import os, sys
sys.path[:0] = [{root!r}, {tmp!r}]
import pkg.driver, other
print(pkg.driver.f(), sum(pkg.driver.f.stats.cache_hits.values()), other.h(),
      type(pkg.driver.f._cache._impl.locator).__name__,
      type(other.h._cache._impl.locator).__name__)
"""


@needs_locators
def test_an_edit_to_an_inlined_body_recompiles(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import os\nfrom jit_kernels._cache import register\n"
        "register(os.path.dirname(os.path.abspath(__file__)))\n")
    (pkg / "body.py").write_text(textwrap.dedent("""
        from numba import njit
        @njit(inline="always")
        def g():
            return 1
        """))
    (pkg / "driver.py").write_text(textwrap.dedent("""
        from numba import njit
        from .body import g
        @njit(cache=True)
        def f():
            return g()
        """))
    (tmp_path / "other.py").write_text(textwrap.dedent("""
        from numba import njit
        @njit(cache=True)
        def h():
            return 7
        """))
    env = own_cache_env()
    program = PROGRAM.format(root=ROOT, tmp=str(tmp_path))

    def run():
        out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    first = run()
    assert first[:3] == ["1", "0", "7"]                     # compiled
    assert first[3] == "PackageInTreeCacheLocator"          # ours, under the registered dir
    assert first[4] == "InTreeCacheLocator"                 # Numba's own, elsewhere
    assert run()[:2] == ["1", "1"]                          # unchanged sources: a cache hit
    (pkg / "body.py").write_text((pkg / "body.py").read_text().replace("return 1", "return 2"))
    after = run()
    assert after[:2] == ["2", "0"]                          # recompiled, not the stale code
    assert run()[:2] == ["2", "1"]


SAVE = """
import sys
sys.path[:0] = [{root!r}, {tmp!r}]
from jit_kernels._cache import register
register({tmp!r} + "/pkg")
import pkg.slow
print(pkg.slow.g(2.5), sum(pkg.slow.g.stats.cache_misses.values()))
"""


@needs_locators
def test_saves_of_registered_functions_wait_for_the_index_lock(tmp_path):
    """A process saving a signature of one of our functions holds the function's index
    lock, so two savers cannot both pick one data file name (numba/numba#4807)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "slow.py").write_text("from numba import njit\n\n\n"
                                 "@njit(cache=True)\ndef g(x):\n    return x + 1\n")
    cache = pkg / "__pycache__"
    cache.mkdir()
    index = cache / f"slow.g-4.py{sys.version_info[0]}{sys.version_info[1]}.nbi"
    with _cache.locked(str(index) + ".lock"):
        proc = subprocess.Popen([sys.executable, "-c", SAVE.format(root=ROOT, tmp=str(tmp_path))],
                                stdout=subprocess.PIPE, text=True, cwd=str(tmp_path),
                                env=own_cache_env())
        deadline = time.time() + 10             # (it compiles in about 1 s, then waits)
        while time.time() < deadline:
            time.sleep(0.5)
            assert proc.poll() is None and not index.exists()
    out, _ = proc.communicate(timeout=120)
    assert out.split() == ["3.5", "1"] and index.exists()


LIGHT = """
import sys
sys.path[:0] = [{root!r}, {tmp!r}]
from jit_kernels._cache import register
register({tmp!r} + "/lpkg")
import numpy as np
from numba import njit
import lpkg.kern as k
out = k.squares(1000)                        # a parallel kernel: NRT and the thread pool
assert out.tolist() == [float(i * i) for i in range(1000)], out[:5]
try:
    k.checked(-1)
    raise SystemExit("no error raised")
except ValueError as e:
    assert "x must be >= 0" in str(e), e
assert k.checked(3) == 6
hits = sum(k.squares.stats.cache_hits.values()) + sum(k.checked.stats.cache_hits.values())
registries = "numba.np.linalg" in sys.modules     # imported by Numba's context refresh

@njit
def user(a):                                  # a compile after the loads refreshes as always
    return np.sort(a)[0] + np.cumsum(a)[-1]
print(hits, registries, user(np.array([3.0, 4.0])))
"""


@needs_locators
def test_cache_loads_start_the_runtime_without_numbas_registries(tmp_path):
    """A process that only loads our kernels from the cache skips Numba's context refresh
    (its registry imports), yet their allocations, threads and errors work, and a later
    compile in that process still finds every registry."""
    pkg = tmp_path / "lpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kern.py").write_text(textwrap.dedent("""
        import numpy as np
        from numba import njit, prange

        @njit(cache=True, parallel=True)
        def squares(n):
            out = np.empty(n)
            for i in prange(n):
                out[i] = i * i
            return out

        @njit(cache=True)
        def checked(x):
            if x < 0:
                raise ValueError("x must be >= 0")
            return 2 * x
        """))
    env = own_cache_env()

    def run():
        out = subprocess.run([sys.executable, "-c", LIGHT.format(root=ROOT, tmp=str(tmp_path))],
                             capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert run() == ["0", "True", "10.0"]       # compiled: the compile refreshed the context
    assert run() == ["2", "False", "10.0"]      # loaded: no refresh until the user's compile
