"""Shared fixtures of the TF bridge tests."""
import numba
import pytest


@pytest.fixture(scope="module")
def one_numba_thread():
    """Run the kernels serially for a module whose batches hold a few dozen ids: a
    parallel launch costs more than the work (tens of ms on a loaded 2-core box).
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_numba_thread")``."""
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)
