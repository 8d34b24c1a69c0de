"""The MPI side of distributed tables: a private communicator, the header that opens
every collective table op, and ``Alltoallv`` of NumPy buffers.

mpi4py is imported only here, and only when a table is given a communicator of
more than one rank.

Every collective op of every distributed table starts with one ``Alltoall`` of
a small int64 header: for each destination rank the number of items this rank
sends it, plus (the same for every destination) the op, the table's tag (a hash
of its configuration and creation order), a hash of the call's arguments that
decide which messages follow, and this rank's status (0, or the error its input
raised).  Every rank then sees every rank's header, so every rank reaches the
same verdict:

- a rank whose input was bad: every rank raises the same ``TypeError`` /
  ``ValueError`` naming that rank, before anything is applied anywhere;
- ranks in different ops, tables or call arguments (collectives called in
  different orders): every rank raises :class:`CollectiveMismatch` naming what
  each rank was doing, instead of mixing the two ops' data or hanging.

All tables created on one user communicator share one duplicate of it
(``comm.Dup()``), so table traffic never mixes with the user's own messages,
and two tables entered in different orders meet in the same header exchange
(and raise) rather than wait on two communicators (and hang).
"""
import threading
import time
import zlib

import numpy as np

from ._checks import DtypeError

__all__ = ["Comm", "CollectiveMismatch", "size_of", "DENSE_OPS"]

OK, TYPE_ERROR, VALUE_ERROR, OTHER_ERROR, DTYPE_ERROR = 0, 1, 2, 3, 4
_WORDS = 5                        # count, op, tag, arg, status
_SHARED = {}                      # id(user comm) -> (user comm, Comm)
_SHARED_LOCK = threading.Lock()


class CollectiveMismatch(ValueError):
    """Ranks entered different collective table ops, or the same one with different
    arguments or table configurations (every rank raises it)."""


def size_of(comm):
    """World size of an mpi4py communicator (``None``: 1); checks the type."""
    if comm is None:
        return 1
    if not (hasattr(comm, "Get_size") and hasattr(comm, "Alltoallv")):
        raise TypeError(f"comm must be an mpi4py communicator (e.g. MPI.COMM_WORLD), "
                        f"got {type(comm).__name__}")
    return int(comm.Get_size())


def crc(*parts):
    """A stable 31-bit hash of ``parts`` (their reprs)."""
    return zlib.crc32("\x1f".join(map(repr, parts)).encode()) & 0x7FFFFFFF


def _displs(counts):
    d = np.zeros(counts.shape[0], np.int64)
    np.cumsum(counts[:-1], out=d[1:])
    return d


class Comm:
    """Numbaemb's duplicate of a user communicator; get it with :meth:`of`."""

    def __init__(self, comm):
        from mpi4py import MPI      # noqa: F401  (only distributed tables need it)
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.lock = threading.RLock()   # one collective op at a time in this process
        self.tables = 0                 # distributed tables created on it (creation order)
        # plan: unique, owners, bucketing; order: rows into batch order, gradients or values
        # into send order (memory passes over the batch's rows); wait: load imbalance
        # (only with sync); exchange: the tables' MPI calls; local: the owner's table op;
        # dense: the dense collectives (gradient allreduce, broadcasts), headers included
        self.times = {"plan": 0.0, "order": 0.0, "wait": 0.0, "exchange": 0.0, "local": 0.0,
                      "dense": 0.0}
        self.sync = False       # benchmarks: a Barrier before each call, timed as "wait"
        self.bytes_sent = 0
        self.record = None      # a list: every alltoallv appends its (send, recv) byte counts

    @classmethod
    def of(cls, comm):
        """The shared ``Comm`` of user communicator ``comm`` (created collectively
        on first use)."""
        with _SHARED_LOCK:
            hit = _SHARED.get(id(comm))
            if hit is None or hit[0] is not comm:
                hit = (comm, cls(comm))
                _SHARED[id(comm)] = hit
            return hit[1]

    def reset_stats(self):
        for k in self.times:
            self.times[k] = 0.0
        self.bytes_sent = 0

    def _wait(self):
        """With ``sync``: wait for every rank (timed as load imbalance, not exchange)."""
        if self.sync:
            t0 = time.perf_counter()
            self.comm.Barrier()
            self.add_time("wait", t0)

    def add_time(self, phase, t0, moved_from=None):
        """Add the time since ``t0`` to ``phase`` (and take it from ``moved_from``, for a
        part of a phase timed as a whole); returns now."""
        t = time.perf_counter()
        self.times[phase] += t - t0
        if moved_from is not None:
            self.times[moved_from] -= t - t0
        return t

    # ---- the header ---------------------------------------------------------------
    def start(self, op, tag, arg, counts, error, what, phase="exchange"):
        """Open a collective op: exchange headers, check every rank's, return the
        number of items each rank will send this one (int64, (R,)).

        ``counts``: items this rank sends each rank ((R,) or a scalar for all);
        ``error``: the exception this rank's input (or planning) raised, or None; ``what``: a
        short description of the op for error messages (``"lookup on table 'user'"``).
        """
        self._wait()
        t0 = time.perf_counter()
        status = (OK if error is None else DTYPE_ERROR if isinstance(error, DtypeError)
                  else TYPE_ERROR if isinstance(error, TypeError)
                  else VALUE_ERROR if isinstance(error, ValueError) else OTHER_ERROR)
        head = np.empty((self.size, _WORDS), np.int64)
        head[:, 0] = 0 if error is not None else counts
        head[:, 1], head[:, 2], head[:, 3], head[:, 4] = op, tag, arg, status
        got = np.empty_like(head)
        self.comm.Alltoall(head, got)
        mismatch = bool((got[:, 1:4] != got[0, 1:4]).any())
        if mismatch or got[:, 4].any():
            self._fail(mismatch, got, error, what)
        self.add_time(phase, t0)
        return got[:, 0].copy()

    def _fail(self, mismatch, got, error, what):
        """Every rank raises the same error (the error path may pickle: it is rare)."""
        notes = self.comm.allgather((what, None if error is None else str(error)))
        if mismatch and not got[:, 4].any():     # bad input is the likelier cause: say that
            doing = "; ".join(f"rank {r}: {w}" for r, (w, _) in enumerate(notes))
            raise CollectiveMismatch(
                "ranks called different collective operations (or the same one with "
                f"different arguments or shapes) at the same point: {doing}. Every rank must "
                "call the same operations (on the same tables) in the same order; nothing was "
                "applied")
        bad = [r for r in range(self.size) if got[r, 4]]
        first = bad[0]
        kind = {TYPE_ERROR: TypeError, VALUE_ERROR: ValueError,
                DTYPE_ERROR: DtypeError}.get(int(got[first, 4]),
                                                                    RuntimeError)
        msg = "; ".join(f"rank {r} of {self.size}: {notes[r][1]}" for r in bad)
        if kind is RuntimeError:
            msg = "an unexpected error: " + msg
        exc = kind(f"{msg} ({what}; nothing was applied on any rank)")
        if error is not None:
            raise exc from error
        raise exc

    # ---- data ---------------------------------------------------------------------
    def alltoallv(self, send, send_counts, recv_counts):
        """Send ``send[...]`` (items grouped by destination, ``send_counts[r]`` for
        rank ``r``; an item is one element or one row of a 2-D array) and return
        what every rank sent this one, grouped by source rank."""
        self._wait()
        t0 = time.perf_counter()
        width = int(np.prod(send.shape[1:], dtype=np.int64))
        sc, rc = send_counts * width, recv_counts * width
        recv = np.empty((int(recv_counts.sum()),) + send.shape[1:], send.dtype)
        send = np.ascontiguousarray(send)
        self.comm.Alltoallv([send, (sc, _displs(sc))], [recv, (rc, _displs(rc))])
        self.bytes_sent += int(sc.sum()) * send.dtype.itemsize
        self.add_time("exchange", t0)
        if self.record is not None:
            self.record.append((sc * send.dtype.itemsize, rc * send.dtype.itemsize))
        return recv

    def allgather(self, obj):
        """Python objects from every rank (small metadata only)."""
        return self.comm.allgather(obj)

    def gather(self, obj):
        return self.comm.gather(obj, root=0)

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0)

    # ---- dense collectives (data-parallel training: gradients, metrics, broadcasts) ------
    # Each opens with the same header as a table op (kind + a hash of the arrays' shapes and
    # dtypes), so ranks that call different collectives, or the same one on different
    # shapes, raise CollectiveMismatch on every rank instead of mixing buffers or hanging.
    def _dense_start(self, kind, signature, error, what):
        self.start(DENSE_OPS[kind], 0, crc(kind, signature), 0, error,
                   what if signature is None else f"{what} of {signature}", phase="dense")

    def allreduce_arrays(self, arrays, op="sum", what="allreduce", error=None):
        """Element-wise ``op`` ("sum", "min", "max", "prod") of ``arrays`` (a list of
        NumPy arrays with the same shapes and dtypes on every rank) over the ranks: one
        fused ``Allreduce`` per dtype.  Returns new arrays, in order."""
        from mpi4py import MPI
        mpi_op = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}[op]
        sig = None if error else [(a.shape, a.dtype.str) for a in arrays]
        with self.lock:
            self._dense_start("allreduce", (op, sig), error, what)
            self._wait()
            t0 = time.perf_counter()
            out = [None] * len(arrays)
            for dtype in sorted({a.dtype.str for a in arrays}):
                idx = [i for i, a in enumerate(arrays) if a.dtype.str == dtype]
                buf = np.concatenate([arrays[i].reshape(-1) for i in idx])
                if buf.dtype == np.float16:      # MPI has no half type: 16-bit words, our op
                    self.comm.Allreduce(MPI.IN_PLACE, [buf.view(np.uint16), MPI.UINT16_T],
                                        op=_half_op(op))
                else:
                    self.comm.Allreduce(MPI.IN_PLACE, buf, op=mpi_op)
                self.bytes_sent += buf.nbytes
                at = 0
                for i in idx:
                    n = arrays[i].size
                    out[i] = buf[at:at + n].reshape(arrays[i].shape)
                    at += n
            self.add_time("dense", t0)
            return out

    def allgather_arrays(self, arrays, what="allgather", error=None):
        """Every rank's ``arrays`` concatenated along axis 0, in rank order (first
        dimensions may differ across ranks; the rest and the dtypes must match)."""
        sig = None if error else [(a.shape[1:], a.dtype.str) for a in arrays]
        with self.lock:
            self._dense_start("allgather", sig, error, what)
            t0 = time.perf_counter()
            rows = np.array([a.shape[0] if a.ndim else 1 for a in arrays], np.int64)
            every = np.empty((self.size, rows.shape[0]), np.int64)
            self.comm.Allgather(rows, every)
            out = []
            for i, a in enumerate(arrays):
                a = np.ascontiguousarray(a.reshape((-1,) + a.shape[1:]))
                width = int(np.prod(a.shape[1:], dtype=np.int64))
                counts = every[:, i] * width
                recv = np.empty((int(every[:, i].sum()),) + a.shape[1:], a.dtype)
                self.comm.Allgatherv(a, [recv, (counts, _displs(counts))])
                self.bytes_sent += a.nbytes
                out.append(recv)
            self.add_time("dense", t0)
            return out

    def broadcast_arrays(self, arrays, root, what="broadcast", error=None):
        """``arrays`` of rank ``root`` on every rank (same shapes and dtypes on every
        rank): one ``Bcast`` of their bytes side by side."""
        sig = None if error else (int(root), [(a.shape, a.dtype.str) for a in arrays])
        with self.lock:
            self._dense_start("broadcast", sig, error, what)
            t0 = time.perf_counter()
            sizes = [a.nbytes for a in arrays]
            buf = np.empty(sum(sizes), np.uint8)
            if self.rank == root:
                at = 0
                for a, n in zip(arrays, sizes):
                    buf[at:at + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                    at += n
            self.comm.Bcast(buf, root=int(root))
            self.bytes_sent += buf.nbytes if self.rank == root else 0
            out, at = [], 0
            for a, n in zip(arrays, sizes):
                out.append(buf[at:at + n].view(a.dtype).reshape(a.shape))
                at += n
            self.add_time("dense", t0)
            return out


_HALF_OPS = {}


def _half_op(op):
    """An MPI reduction of float16 values carried as 16-bit words."""
    got = _HALF_OPS.get(op)
    if got is None:
        from mpi4py import MPI
        fn = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}[op]

        def reduce(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, np.float16)
            b = np.frombuffer(inoutbuf, np.float16)
            fn(b, a, out=b)

        got = _HALF_OPS[op] = MPI.Op.Create(reduce, commute=True)
    return got


# op codes of the dense collectives in the header (table ops use 1..31)
DENSE_OPS = {"allreduce": 101, "allgather": 102, "broadcast": 103}
