"""Shared by the tests of kernels compiled across processes (jit_kernels._compile_lock,
jit_kernels._cache, numbaemb._ahead): the skip marker, a snippet that logs a process's
compiles, and the environment of a process whose cache is its package's own."""
import os

import pytest

from jit_kernels import _cache, _compile_lock

needs_locks = pytest.mark.skipif(
    bool(os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES")) or _cache._locators()[0] is None
    or not _compile_lock.installed(), reason="Numba's own cache locators are in use")

# program text: after it, ``compiled`` lists "module.qualname" + ``suffix`` for every
# cached function of ours this process compiles (not those it loads from the cache;
# not Numba's own overloads or ours without a disk cache, which every process compiles)
LOG = """
from numba.core import event
from jit_kernels._cache import _is_ours
compiled = []
class Log(event.Listener):
    def on_start(self, e): pass
    def on_end(self, e):
        d = e.data["dispatcher"]
        if _is_ours(getattr(d, "_cache", None)):
            compiled.append(f"{{d.py_func.__module__}}.{{d.py_func.__qualname__}}{suffix}")
event.register("numba:compile", Log())
"""


def log(with_args=False):
    """:data:`LOG`, each entry ending with the compiled signature if ``with_args``."""
    return LOG.format(suffix="{e.data['args']}" if with_args else "")


def own_cache_env(**env):
    """``os.environ`` with ``env`` and without ``NUMBA_CACHE_DIR``: for a process whose
    cache must be its package's own ``__pycache__`` (a test's temporary package),
    whatever cache directory the suite runs under (tox passes it through)."""
    return dict({k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}, **env)
