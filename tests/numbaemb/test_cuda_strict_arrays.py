"""The simulator's device arrays refuse array indices, arithmetic and numpy's methods as
a real GPU's do (``tests.cuda_support.strict_simulator_arrays``): a host-only expression
such as ``device_positions[mask]`` fails in CI, not first on a lent GPU (session 32 found
``slot_values`` on a sharded GPU table doing that)."""
import numpy as np
import pytest

import numbaemb as ne
from tests.cuda_support import needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]


def test_device_arrays_take_only_integers_and_slices():
    from numba import cuda
    d = cuda.to_device(np.arange(6, dtype=np.int64))
    assert d[2] == 2 and np.array_equal(d[1:3].copy_to_host(), [1, 2])
    for bad in (np.array([True, False] * 3), np.array([0, 1]), [0, 1], d):
        with pytest.raises((TypeError, IndexError, ValueError)):
            d[bad]
    with pytest.raises((TypeError, IndexError, ValueError)):
        d[np.array([0, 1])] = 5
    assert np.array_equal(d.copy_to_host(), np.arange(6))
    with pytest.raises(TypeError):          # no arithmetic or comparisons
        d >= 0
    with pytest.raises(TypeError):
        d + 1
    with pytest.raises(AttributeError):     # nor numpy's methods
        d.sum()
    assert d.shape == (6,) and d.dtype == np.int64 and d.reshape(2, 3).shape == (2, 3)
    assert d != cuda.to_device(np.arange(6)) and d == d     # identity, as on a GPU


def test_kernels_still_index_freely():
    """Inside a kernel the simulator's arrays are indexed as before (gather's rows)."""
    from numba import cuda

    from jit_kernels import cuda_table as ct
    values = cuda.to_device(np.arange(12, dtype=np.float32).reshape(6, 2))
    out = cuda.device_array((3, 2), np.float32)
    ct.gather(values, cuda.to_device(np.array([5, 0, 2], np.int64)), out)
    assert np.array_equal(out.copy_to_host(), [[10, 11], [0, 1], [4, 5]])


def test_slot_values_of_a_sharded_gpu_table():
    """The bug it caught: slots read back from a table of three shards."""
    opt = ne.optimizers.Adagrad(0.1)
    ids = np.array([np.iinfo(np.int64).min, -1, 0, 5, np.iinfo(np.int64).max], np.int64)
    tables = [ne.Variable(2, num_shards=3, device=d) for d in ("cpu", "cuda")]
    for v in tables:
        ne.optimizers.apply_gradients(v, opt, ids[:3], np.ones((3, 2), np.float32), step=1)
    got, want = (np.asarray(ne.optimizers.slot_values(v, opt, "accumulator", ids))
                 for v in tables[::-1])
    assert got.shape == (5, 2) and np.allclose(got, want, rtol=1e-5)
    init = opt.initial_accumulator_value                 # the stepped ids' slots grew
    assert (want[:3] > init).all() and (want[3:] == init).all()
