"""How a split GPU table's arrays move between ranks (:mod:`numbaemb._exchange`): the
choice of transport, every rank alike, and the NCCL transport's grouped sends and
receives (one rank sending to itself: all a one-GPU machine can run)."""
import warnings

import numpy as np
import pytest

from numbaemb import _exchange
from tests.cuda_support import SIMULATOR, needs_cuda, needs_real_gpu

pytestmark = [pytest.mark.cuda, needs_cuda]


class OneRank:
    """The part of ``numbaemb._mpi.Comm`` the transports use, for a world of one."""
    rank, size, bytes_sent = 0, 1, 0

    def __init__(self):
        self.phases = []

    def bcast(self, obj):
        return obj

    def allgather(self, obj):
        return [obj]

    def _wait(self):
        pass

    def add_time(self, phase, t0, moved_from=None):
        self.phases.append(phase)

    def alltoallv(self, send, send_counts, recv_counts):
        assert send_counts.tolist() == recv_counts.tolist() == [send.shape[0]]
        return send.copy()


@pytest.fixture
def arrays():
    from numbaemb._device import DeviceArrays
    return DeviceArrays(0)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's choice")
def test_the_simulator_moves_arrays_through_host_memory(arrays, monkeypatch):
    monkeypatch.delenv("NUMBAEMB_DEVICE_EXCHANGE", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no warning: nothing better was possible
        t = _exchange._pick_transport(OneRank(), arrays)
    assert isinstance(t, _exchange.StagedTransport)
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = t.alltoallv(arrays.from_host(rows), np.array([4]), np.array([4]))
    assert np.array_equal(got.copy_to_host(), rows)
    monkeypatch.setenv("NUMBAEMB_DEVICE_EXCHANGE", "nccl")
    with pytest.raises(RuntimeError, match="NUMBAEMB_DEVICE_EXCHANGE=nccl, but the CUDA simulator"):
        _exchange._pick_transport(OneRank(), arrays)
    monkeypatch.setenv("NUMBAEMB_DEVICE_EXCHANGE", "gloo")
    with pytest.raises(ValueError, match="'auto', 'nccl' or 'mpi'"):
        _exchange._pick_transport(OneRank(), arrays)


def test_asking_for_mpi_stages_through_host_memory(arrays, monkeypatch):
    monkeypatch.setenv("NUMBAEMB_DEVICE_EXCHANGE", "mpi")
    assert isinstance(_exchange._pick_transport(OneRank(), arrays), _exchange.StagedTransport)


@needs_real_gpu
def test_nccl_sends_rows_keys_and_flags_to_itself(arrays, monkeypatch):
    pytest.importorskip("cupy.cuda.nccl")
    monkeypatch.delenv("NUMBAEMB_DEVICE_EXCHANGE", raising=False)
    comm = OneRank()
    t = _exchange._pick_transport(comm, arrays)
    assert isinstance(t, _exchange.NcclTransport), t
    for a in (np.arange(15, dtype=np.float32).reshape(5, 3), np.arange(7, dtype=np.int64) - 3,
              np.array([True, False, True]), np.empty((0, 4), np.float16)):
        got = t.alltoallv(arrays.from_host(a), np.array([a.shape[0]]), np.array([a.shape[0]]))
        assert got.shape == a.shape and np.array_equal(got.copy_to_host(), a)
    assert "exchange" in comm.phases and comm.bytes_sent > 0
