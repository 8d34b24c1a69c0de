"""numbaemb: dynamic embedding tables on Numba kernels, no TensorFlow needed.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=4)
>>> v.find_or_insert(np.array([3, -1])).shape
(2, 4)

Threads: importing numbaemb sets ``OMP_WAIT_POLICY=PASSIVE`` and, for GNU
OpenMP (Numba's pip wheels use it), ``GOMP_SPINCOUNT=3000`` unless either is
already set (``os.environ``), before Numba's OpenMP runtime starts (at the
first parallel kernel): idle workers spin for about 30 microseconds, then sleep.
With OpenMP's default (300,000 spins, about 3 ms) a worker that spins on a busy
machine (TensorFlow's thread pools, an input pipeline, other processes) holds
the core a launch then waits for: a 100-element parallel kernel took 7.5 ms a
launch (mean) with 2 busy processes on 2 cores.  Sleeping at once (``PASSIVE``,
no spin) costs a launch a wake-up, 84 us (mean) on the idle machine, with a
99th percentile of 3.9 ms under load; 3,000 spins: 52 us idle, 83 us (p99
0.19 ms) under load, and a kernel's regions that follow each other within
tens of microseconds start in 2-6 us (``benchmarks/bench_launch.py``; README,
Threads).  Set either variable yourself (before
importing numbaemb or anything that starts OpenMP) to choose otherwise.
Small inputs skip the thread pool altogether: see
:data:`jit_kernels.segment.PARALLEL_MIN`.
"""
import os as _os

if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "3000"      # (GNU OpenMP: wins over the policy)
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # (other runtimes: no spinning)

from jit_kernels._cache import register as _register  # noqa: E402

_register(_os.path.dirname(_os.path.abspath(__file__)), hashed=False)

from jit_kernels import prebuilt as _prebuilt  # noqa: E402

_prebuilt.seed()        # kernels a wheel build compiled: into Numba's cache, once

from jit_kernels import _compile_lock  # noqa: E402
from . import _ahead  # noqa: E402

_compile_lock.on_first_miss(_ahead.start)   # a cold start: the step's kernels on another core

from . import initializers, policies  # noqa: E402
from ._memory import aligned_empty, is_aligned  # noqa: E402
from .sharding import default_partitioner  # noqa: E402
from .variable import Variable, get_variable  # noqa: E402
from . import admission, expiry, optimizers  # noqa: E402
from ._checks import DtypeError  # noqa: E402

__all__ = ["Variable", "get_variable", "initializers", "optimizers", "policies", "admission",
           "expiry", "default_partitioner", "aligned_empty", "is_aligned", "DtypeError"]
__version__ = "0.1.0"
