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


def same_floats(actual, desired):
    """``assert_same_floats`` as a bool (for checks that must agree on every MPI rank)."""
    import numpy as np
    actual, desired = np.asarray(actual), np.asarray(desired)
    floats = desired.dtype.kind in "fc"
    if SIMULATOR or not floats or actual.shape != desired.shape:
        return np.array_equal(actual, desired, equal_nan=floats and actual.dtype.kind in "fc")
    return bool(np.allclose(actual, desired, rtol=1e-5, atol=1e-7, equal_nan=True))


def float_gap(actual, desired):
    """Where two float arrays differ most, for a failing check's message."""
    import numpy as np
    actual, desired = np.asarray(actual), np.asarray(desired)
    if actual.shape != desired.shape or not actual.size:
        return f"shapes {actual.shape} and {desired.shape}"
    gap = np.abs(actual.astype(np.float64) - desired)
    i = np.unravel_index(int(np.argmax(gap)), gap.shape)
    return f"largest gap {gap[i]:.3g} at {i}: {actual[i]!r} against {desired[i]!r}"


def assert_same_floats(actual, desired, err_msg=""):
    """Float arrays bit for bit under the simulator (the CPU's own bodies run there); within 1e-5
    relative on a GPU, whose compiler fuses multiply-adds and may round a pow, sqrt or
    division differently (1 ulp a step seen on an H100 and an H200)."""
    import numpy as np
    if same_floats(actual, desired):          # (ints, scores: exact)
        return
    if np.asarray(desired).dtype.kind in "fc":
        err_msg = f"{err_msg} ({float_gap(actual, desired)})".strip()
    np.testing.assert_array_equal(actual, desired, err_msg=err_msg)   # numpy's message
    raise AssertionError(err_msg or "arrays differ")


def strict_simulator_arrays():
    """Make the simulator's device arrays refuse what a real GPU's refuse outside kernels:
    indexing with an array (a mask or positions), arithmetic and comparisons, numpy's
    methods (``sum``, ``astype``, ...), all of which numpy-backed simulator arrays would
    otherwise accept, hiding a host-only expression from every simulator run.  Inside
    kernels they are indexed as before.  Installed by :func:`simulate_as_tests_do`."""
    import numpy as np
    from numba.cuda.simulator.cudadrv.devicearray import (FakeCUDAArray,
                                                          FakeWithinKernelCUDAArray as Inside)

    def check(idx):
        for i in idx if isinstance(idx, tuple) else (idx,):
            if isinstance(i, (np.ndarray, list, FakeCUDAArray)):
                raise TypeError("a device array takes integers and slices as indices, not "
                                f"{type(i).__name__} (as on a real GPU)")

    get, put = FakeCUDAArray.__getitem__, FakeCUDAArray.__setitem__
    if getattr(get, "strict", False):
        return

    def getitem(self, idx):
        check(idx)
        return get(self, idx)

    def setitem(self, idx, val):
        check(idx)
        return put(self, idx, val)

    def inside_get(self, idx):      # in a kernel: the simulator's own path, unchecked (fast)
        return self._FakeWithinKernelCUDAArray__wrap_if_fake(get(self._item, idx))

    def inside_put(self, idx, val):
        put(self._item, idx, val)

    attr = FakeCUDAArray.__getattr__

    def getattr_(self, name):       # numpy's methods (sum, astype, min, ...): not a GPU's
        if name not in DEVICE_ARRAY_ATTRS and not name.startswith("_"):
            raise AttributeError(f"a device array has no attribute {name!r} (as on a real GPU)")
        return attr(self, name)

    def no_arithmetic(self, other):
        raise TypeError("a device array has no arithmetic or comparisons (as on a real GPU): "
                        "copy it to the host or run a kernel")

    getitem.strict = True
    FakeCUDAArray.__getitem__, FakeCUDAArray.__setitem__ = getitem, setitem
    FakeCUDAArray.__getattr__ = getattr_
    for op in ("lt", "le", "gt", "ge", "add", "sub", "mul", "floordiv", "truediv", "mod", "pow"):
        setattr(FakeCUDAArray, f"__{op}__", no_arithmetic)
    FakeCUDAArray.__eq__, FakeCUDAArray.__ne__ = object.__eq__, object.__ne__   # identity
    FakeCUDAArray.__hash__ = object.__hash__
    Inside.__getitem__, Inside.__setitem__ = inside_get, inside_put


def quiet_simulator_blocks():
    """Make the simulator wait for a block's threads instead of spinning on them.

    The simulator runs each CUDA thread of a block as a Python thread and its
    ``BlockManager.run`` polls them in a busy loop (``is_alive`` on every thread, round
    after round) to find when they all wait at ``syncthreads`` or have ended.  The loop
    holds the GIL the threads need: TestCudaSharded spent 30 of its 45 s in it.  This
    ``run`` keeps its semantics (a barrier opens when every live thread of the block
    waits at it; the first thread's exception aborts the others and is raised) but
    sleeps in ``join`` on a running thread between looks.  Installed by
    :func:`simulate_as_tests_do`."""
    import numpy as np
    from numba.cuda.simulator import kernel as sim

    if getattr(sim.BlockManager.run, "quiet", False):
        return

    def run(self, grid_point, *args):
        def target():
            self._f(*args)

        threads = [sim.BlockThread(target, self, grid_point, point, self._debug)
                   for point in np.ndindex(*self._block_dim)]
        for t in threads:
            t.start()
        live = threads
        while live:
            failed = next((t for t in threads if t.exception), None)
            if failed is not None:          # abort the rest, as the simulator does
                for t in threads:
                    t.abort, t.syncthreads_blocked = True, False
                    t.syncthreads_event.set()
                raise failed.exception[0].with_traceback(failed.exception[1])
            running = next((t for t in live if not t.syncthreads_blocked), None)
            if running is None:             # every live thread waits: open the barrier
                for t in live:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
            else:                           # sleep (no GIL) until it ends, 0.2 ms at most
                running.join(0.0002)
            live = [t for t in live if t.is_alive()]
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    run.quiet = True
    sim.BlockManager.run = run



def simulate_as_tests_do():
    """Both of the above: what ``tests/conftest.py`` installs under the simulator, and
    the simulator processes the tests start (the ptx launch recorder, GPU restores)."""
    strict_simulator_arrays()
    quiet_simulator_blocks()

# what numba-cuda's DeviceNDArray has besides dunders (its class's and its instances'
# attributes, numba-cuda 0.30): the simulator's arrays answer only these
DEVICE_ARRAY_ATTRS = frozenset((
    "T", "alloc_size", "as_cuda_arg", "bind", "copy_to_device", "copy_to_host",
    "device_ctypes_pointer", "dtype", "flags", "get_ipc_handle", "getitem", "gpu_data",
    "is_c_contiguous", "is_f_contiguous", "nbytes", "ndim", "ravel", "reshape", "setitem",
    "shape", "size", "split", "squeeze", "stream", "strides", "transpose", "view"))
