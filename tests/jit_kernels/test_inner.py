"""``@inner`` helpers: built without Python-call wrappers for kernels, called from
Python through a twin that has them, each with cache files of its own."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
from numba import njit

from jit_kernels._inner import InnerDispatcher, inner
from jit_kernels.slots import first_slot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _defined(dispatcher):
    ir = "\n".join(dispatcher.inspect_llvm().values())
    return [line for line in ir.splitlines() if line.startswith("define")]


def test_kernels_get_the_build_without_wrappers_and_python_the_twin():
    plus = inner(cache=False)(lambda x: x + 1)
    kernel = njit(lambda x: plus(x) * 2)
    assert kernel(np.int64(3)) == 8
    assert plus(np.int64(3)) == 4               # from Python: no missing entry point
    assert not any("7cpython" in d or "cfunc." in d for d in _defined(plus))
    twin = _defined(plus.python_twin())
    assert any("7cpython" in d for d in twin) and any("cfunc." in d for d in twin)
    assert plus.python_twin() is plus.python_twin()


def test_library_helpers_are_inner_and_agree_from_python_and_kernels():
    assert isinstance(first_slot, InnerDispatcher)
    keys = np.array([0, -1, 5, np.iinfo(np.int64).min, np.iinfo(np.int64).max])
    homes = njit(lambda k, m: np.array([first_slot(x, m) for x in k]))(keys, 1023)
    assert [first_slot(k, 1023) for k in keys] == homes.tolist()
    assert all(0 <= h <= 1023 for h in homes)


MODULE = """
from jit_kernels._inner import inner
from numba import njit

@inner
def helper(x):
    return 3 * x + 1

@njit(cache=True)
def kernel(x):
    return helper(x) + helper(x + 1)
"""

CALLS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import mod
print(json.dumps([int(mod.kernel(5)), int(mod.helper(5)),
                  sum(mod.kernel.stats.cache_hits.values()),
                  sum(mod.helper.python_twin().stats.cache_hits.values())]))
"""


def test_cached_builds_load_in_a_new_process(tmp_path):
    """Cold then warm process: same results; the twin has cache files of its own
    (never the wrapperless build loaded where Python needs the wrapper)."""
    (tmp_path / "mod.py").write_text(textwrap.dedent(MODULE))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outs = [subprocess.run([sys.executable, "-c", CALLS, str(tmp_path)], env=env, timeout=300,
                           capture_output=True, text=True) for _ in range(2)]
    for out in outs:
        assert out.returncode == 0, out.stderr[-2000:]
    cold, warm = (json.loads(o.stdout.strip().splitlines()[-1]) for o in outs)
    assert cold[:2] == warm[:2] == [16 + 19, 16]
    assert cold[2:] == [0, 0] and warm[2:] == [1, 1]      # both loaded, not compiled
    files = [f for _, _, fs in os.walk(tmp_path / "cache") for f in fs]
    assert any(f.startswith("mod.helper__py-") for f in files), files
    assert any(f.startswith("mod.helper-") for f in files), files
