"""The simulator's blocks wait for their threads instead of spinning on them
(``tests.cuda_support.quiet_simulator_blocks``, installed by ``tests/conftest.py``) and
keep its semantics: a barrier opens when every thread of the block waits at it, and a
thread's exception aborts the launch and is raised."""
import numpy as np
import pytest

from tests.cuda_support import SIMULATOR

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not SIMULATOR, reason="the CUDA simulator's own machinery (NUMBA_ENABLE_CUDASIM=1)")]
# a global: the simulator swaps the kernels' global ``cuda`` for its own
cuda = pytest.importorskip("numba.cuda")


def test_the_patched_block_manager_is_installed():
    from numba.cuda.simulator import kernel as sim
    assert getattr(sim.BlockManager.run, "quiet", False)


def test_barriers_order_shared_memory_rounds():
    """Each of 4 rounds: every thread writes its shared slot, waits, reads its
    neighbour's, waits again; without the barriers the reads would see stale values."""
    @cuda.jit
    def rotate(out, rounds):
        buf = cuda.shared.array(32, np.int64)
        i = cuda.threadIdx.x
        n = cuda.blockDim.x
        v = i + 100 * cuda.blockIdx.x
        for _ in range(rounds):
            buf[i] = v
            cuda.syncthreads()
            v = buf[(i + 1) % n]
            cuda.syncthreads()
        out[cuda.blockIdx.x * n + i] = v

    out = cuda.device_array(3 * 32, np.int64)
    rotate[3, 32](out, 4)
    want = [(i + 4) % 32 + 100 * b for b in range(3) for i in range(32)]
    assert out.copy_to_host().tolist() == want


def test_an_exception_in_one_thread_fails_the_launch():
    """Thread 5 fails while the others wait at a barrier: the launch raises its error
    (naming the thread) rather than hanging."""
    @cuda.jit
    def fails(out):
        i = cuda.threadIdx.x
        if i == 5:
            out[10 ** 6] = 1            # out of bounds: an IndexError in the simulator
        cuda.syncthreads()
        out[i] = i

    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        fails[1, 32](cuda.device_array(32, np.int64))
