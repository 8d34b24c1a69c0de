"""The array work of a split table's exchange, on the host or on a GPU.

:class:`numbaemb.distributed.DistributedVariable` runs every collective op as
plan -> header -> ``Alltoallv`` -> the owner's local op -> ``Alltoallv`` back, and
asks one of two kits for the array steps, with the same methods:

* :class:`HostExchange`: NumPy buffers, planned by :mod:`jit_kernels.exchange`,
  moved by MPI (``Comm.alltoallv``);
* :class:`DeviceExchange`: device arrays of a GPU table, planned on the GPU by
  :mod:`jit_kernels.cuda_exchange` (only the ``R`` counts reach the host, for the
  header), moved by NCCL through CuPy (:class:`NcclTransport`: grouped
  ``ncclSend`` / ``ncclRecv``, the unique id broadcast over MPI) or, where NCCL is
  not there (the CUDA simulator, no CuPy, ``NUMBAEMB_DEVICE_EXCHANGE=mpi``, or an
  NCCL that refused this job's GPUs), by MPI through host copies
  (:class:`StagedTransport`).

Plans: ``send_keys`` (u,) distinct keys grouped by owner, ``counts`` (R,) NumPy,
``slot`` (n,) each position's place in ``send_keys``, and ``firsts``: the CPU's
``inverse`` (n,) or the GPU's ``first`` (n,) bool (which positions are their key's
first); :meth:`flags` reads either.
"""
import os
import time
import warnings
from collections import namedtuple

import numba
import numpy as np

from jit_kernels.cpu_table import assign_rows
from jit_kernels.exchange import check_owners, first_flags, plan
from jit_kernels.segment import gather_rows, segment_sum

from ._memory import aligned_empty

__all__ = ["HostExchange", "DeviceExchange", "Plan"]

Plan = namedtuple("Plan", "send_keys counts slot firsts")


class HostExchange:
    """NumPy arrays, MPI transport."""

    on_device = False
    transport = "mpi"

    def __init__(self, comm, world_size, partitioner, key_dtype):
        self.comm, self.world_size = comm, world_size
        self.partitioner, self.key_dtype = partitioner, key_dtype

    def plan(self, flat, unique=True):
        p = plan(flat, self.world_size, self.partitioner, self.key_dtype, unique)
        return Plan(p.send_keys, p.counts, p.slot, p.inverse)

    def alltoallv(self, send, send_counts, recv_counts):
        return self.comm.alltoallv(send, send_counts, recv_counts)

    def back(self, rows, slot):
        """(n, width) ``rows[slot[i]]``: rows in send order -> batch order."""
        out = aligned_empty((slot.shape[0], rows.shape[1]), rows.dtype)
        gather_rows(rows, slot, out)
        return out

    def flags(self, back, p, first_only):
        """(n,) bool ``back[slot[i]]``; ``first_only``: a key's repeats get True."""
        if not first_only:
            return back[p.slot]
        out = np.empty(p.slot.shape[0], np.bool_)
        first_flags(p.firsts, p.slot, back, out)
        return out

    def spread(self, a, slot):
        """``out[slot[i]] = a[i]`` (``slot`` a permutation: a plan with ``unique=False``)."""
        out = np.empty_like(a)
        out[slot] = a
        return out

    def last_wins(self, rows, slot, u):
        """(u, width): row ``slot[i]`` = ``rows[i]``, the last position of a place wins."""
        out = np.empty((u, rows.shape[1]), rows.dtype)
        assign_rows(out, slot, rows, numba.get_num_threads())
        return out

    def sums(self, grads, slot, u):
        return segment_sum(grads, slot, u, numba.get_num_threads())

    def scores(self, scores):
        return np.ascontiguousarray(scores, np.int64).reshape(-1, 1)

    def host(self, a):
        return a

    def ours(self, a):
        """``a`` on this kit's side (host or device)."""
        return a


class DeviceExchange(HostExchange):
    """Device arrays of GPU ``device_id`` (``arrays``: the local table's
    :class:`numbaemb._device.DeviceArrays`); transport picked at the first exchange."""

    on_device = True

    def __init__(self, comm, world_size, key_dtype, arrays, partitioner=None):
        from jit_kernels import cuda_exchange, cuda_table
        super().__init__(comm, world_size, partitioner, key_dtype)
        self.arrays, self.cx, self.ct = arrays, cuda_exchange, cuda_table
        self._transport = None

    @property
    def transport(self):
        return "not chosen yet" if self._transport is None else self._transport.name

    def plan(self, flat, unique=True):
        owners = None
        if self.partitioner is not None:    # a Python function of host keys: asked there
            keys = self.arrays.host(flat).astype(self.key_dtype, copy=False)
            owners = self.arrays.from_host(check_owners(
                self.partitioner(keys, self.world_size), keys.shape, self.world_size))
        with self.arrays.on():
            send, counts, slot, first = self.cx.plan(flat, self.world_size,
                                                8 * self.key_dtype.itemsize, unique, owners)
            if self.key_dtype != send.dtype:           # int32 tables: their own keys
                keys = self.arrays.empty(send.shape[0], self.key_dtype)
                self.ct.cast(send, keys)
                send = keys
            return Plan(send, counts, slot, first)

    def alltoallv(self, send, send_counts, recv_counts):
        if self._transport is None:     # every rank is here, in the same op: collective
            self._transport = _pick_transport(self.comm, self.arrays)
        with self.arrays.on():
            return self._transport.alltoallv(send, send_counts, recv_counts)

    def back(self, rows, slot):
        out = self.arrays.empty((slot.shape[0], rows.shape[1]), rows.dtype)
        if slot.shape[0]:
            self.arrays.gather(rows, slot, out)
        return out

    def flags(self, back, p, first_only):
        with self.arrays.on():
            return self.cx.pick(back, p.slot, p.firsts if first_only else None)

    def spread(self, a, slot):
        out = self.arrays.empty(a.shape, a.dtype)
        self.arrays.put(out, slot, a)
        return out

    def last_wins(self, rows, slot, u):
        with self.arrays.on():
            out = self.arrays.empty((u, rows.shape[1]), rows.dtype)
            self.ct.assign_rows(out, slot, rows)
            return out

    def sums(self, grads, slot, u):
        with self.arrays.on():
            return self.cx.segment_sums(grads, slot, u)

    def scores(self, scores):
        a = self.arrays
        with a.on():
            d = a._device(scores, "scores")
            return (a.from_host(np.ascontiguousarray(scores, np.int64)) if d is None
                    else a._cast(d, np.dtype(np.int64))).reshape(-1, 1)

    def host(self, a):
        return self.arrays.host(a)

    def ours(self, a):
        return self.arrays.from_host(a) if isinstance(a, np.ndarray) else a


class StagedTransport:
    """Device arrays moved by MPI through host copies."""

    name = "mpi (staged through host memory)"

    def __init__(self, comm, arrays):
        self.comm, self.arrays = comm, arrays

    def alltoallv(self, send, send_counts, recv_counts):
        t0 = time.perf_counter()
        host = self.arrays.host(send)
        self.comm.add_time("exchange", t0)          # the copies count as the exchange's
        recv = self.comm.alltoallv(host, send_counts, recv_counts)
        t0 = time.perf_counter()
        recv = self.arrays.from_host(recv)
        self.comm.add_time("exchange", t0)
        return recv


class NcclTransport:
    """Device arrays moved by NCCL: one group of ``ncclSend`` / ``ncclRecv`` a peer
    (bytes, on the legacy default stream the kernels run on)."""

    name = "nccl"

    def __init__(self, comm, arrays):
        import cupy
        from cupy.cuda import nccl
        self.nccl, self.comm, self.arrays = nccl, comm, arrays
        uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None)
        with cupy.cuda.Device(arrays.device_id):
            self._comm = nccl.NcclCommunicator(comm.size, uid, comm.rank)

    def alltoallv(self, send, send_counts, recv_counts):
        c = self.comm
        c._wait()
        t0 = time.perf_counter()
        item = send.dtype.itemsize * int(np.prod(send.shape[1:], dtype=np.int64))
        recv = self.arrays.empty((int(recv_counts.sum()),) + tuple(send.shape[1:]), send.dtype)
        so = np.concatenate([[0], np.cumsum(send_counts)]) * item
        ro = np.concatenate([[0], np.cumsum(recv_counts)]) * item
        sp = send.__cuda_array_interface__["data"][0] if send.size else 0
        rp = recv.__cuda_array_interface__["data"][0] if recv.size else 0
        nccl = self.nccl
        nccl.groupStart()
        try:
            for r in range(c.size):
                if send_counts[r]:
                    self._comm.send(sp + int(so[r]), int(so[r + 1] - so[r]), nccl.NCCL_UINT8,
                                    r, 0)
                if recv_counts[r]:
                    self._comm.recv(rp + int(ro[r]), int(ro[r + 1] - ro[r]), nccl.NCCL_UINT8,
                                    r, 0)
        finally:
            nccl.groupEnd()
        c.bytes_sent += int(so[-1])
        c.add_time("exchange", t0)
        return recv


def _pick_transport(comm, arrays):
    """NCCL where every rank can open it, else MPI through host copies (the same on
    every rank: they agree by an allgather)."""
    want = os.environ.get("NUMBAEMB_DEVICE_EXCHANGE", "auto").lower()
    if want not in ("auto", "nccl", "mpi"):
        raise ValueError(f"NUMBAEMB_DEVICE_EXCHANGE must be 'auto', 'nccl' or 'mpi', "
                         f"got {want!r}")
    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    why = None
    if want == "mpi" or simulated:
        why = "asked for" if want == "mpi" else "the CUDA simulator has no NCCL"
    else:
        try:
            from cupy.cuda import nccl
            if not getattr(nccl, "available", True):
                why = "CuPy found no NCCL library"
        except Exception as e:      # noqa: BLE001  (no CuPy, or a CuPy without NCCL)
            why = f"no NCCL through CuPy ({type(e).__name__}: {e})"
    whys = comm.allgather(why)            # every rank decides alike
    if not any(whys):
        made, error = None, None
        try:
            made = NcclTransport(comm, arrays)
        except Exception as e:      # noqa: BLE001  e.g. two ranks on one GPU
            error = f"NCCL refused ({type(e).__name__}: {e})"
        errors = comm.allgather(error)
        if not any(errors):
            return made
        whys = errors
    why = next(w for w in whys if w)
    if want == "nccl":
        raise RuntimeError(f"NUMBAEMB_DEVICE_EXCHANGE=nccl, but {why}")
    if not simulated and want != "mpi":
        warnings.warn(f"split GPU table: {why}; moving its arrays by MPI through host "
                      "memory instead", RuntimeWarning, stacklevel=3)
    return StagedTransport(comm, arrays)
