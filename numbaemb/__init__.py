"""numbaemb: dynamic embedding tables on Numba kernels, no TensorFlow needed.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=4)
>>> v.find_or_insert(np.array([3, -1])).shape
(2, 4)

Threads: importing numbaemb sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is
already set (``os.environ.setdefault``), before Numba's OpenMP runtime starts
(at the first parallel kernel).  With OpenMP's default policy idle worker
threads spin, and on a busy machine (TensorFlow's thread pools, an input
pipeline, other processes) a parallel launch then waits for a spinning thread
to give its core back: on a loaded 2-core machine a 100-row parallel kernel
took 8 ms (median) with ``ACTIVE`` and 0.5 ms on average (6.5 us median, long
tail) with the default, against 19 us, every time, with ``PASSIVE``
(``benchmarks/RESULTS_train.md``).  Set the variable yourself (before
importing numbaemb or anything that starts OpenMP) to choose otherwise.
Small inputs skip the thread pool altogether: see
:data:`jit_kernels.segment.PARALLEL_MIN`.
"""
import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from jit_kernels._cache import register as _register  # noqa: E402

_register(_os.path.dirname(_os.path.abspath(__file__)), hashed=False)

from jit_kernels import prebuilt as _prebuilt  # noqa: E402

_prebuilt.seed()        # kernels a wheel build compiled: into Numba's cache, once

from . import initializers, policies  # noqa: E402
from ._memory import aligned_empty, is_aligned  # noqa: E402
from .sharding import default_partitioner  # noqa: E402
from .variable import Variable, get_variable  # noqa: E402
from . import admission, expiry, optimizers  # noqa: E402
from ._checks import DtypeError  # noqa: E402

__all__ = ["Variable", "get_variable", "initializers", "optimizers", "policies", "admission",
           "expiry", "default_partitioner", "aligned_empty", "is_aligned", "DtypeError"]
__version__ = "0.1.0"
