"""The one place that decides whether CUDA tests can run, and says why not.

``NUMBA_ENABLE_CUDASIM=1`` (set by ``tox -e cudasim`` before numba is
imported) runs CUDA kernels on the CPU; a real GPU runs them natively.
"""
import os

import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _gpu_available():
    try:
        from numba import cuda
        return cuda.is_available()
    except Exception:  # no numba-cuda, no driver
        return False


CUDA_OK = SIMULATOR or _gpu_available()
REAL_GPU = (not SIMULATOR) and CUDA_OK

needs_cuda = pytest.mark.skipif(
    not CUDA_OK, reason="no CUDA GPU and NUMBA_ENABLE_CUDASIM is not set (run `tox -e cudasim`)")
needs_real_gpu = pytest.mark.skipif(not REAL_GPU, reason="needs a real CUDA GPU (not the simulator)")


def assert_same_floats(actual, desired, err_msg=""):
    """Float arrays bit for bit under the simulator (the CPU's own bodies run there); within 1e-5
    relative on a GPU, whose compiler fuses multiply-adds and may round a pow, sqrt or
    division differently (1 ulp a step seen on an H100 and an H200)."""
    import numpy as np
    if SIMULATOR or np.asarray(desired).dtype.kind not in "fc":   # ints, scores: exact
        np.testing.assert_array_equal(actual, desired, err_msg=err_msg)
    else:
        np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-7, err_msg=err_msg)
