"""Tables split across MPI processes: ``Variable(dim, comm=MPI.COMM_WORLD)``.

Rank ``r`` of ``R`` owns the keys with ``partitioner(keys, R) == r`` (default:
the key's unsigned value mod R, SOK's rule) and holds their rows in a plain
local :class:`~numbaemb.Variable` (``.local``, with its own ``num_shards``).
Every table op is collective: every rank calls it, in the same order, with its
own keys (any number, 0 too), and each is one exchange::

    keys -> distinct keys grouped by owner (plan, jit_kernels.exchange)
         -> header Alltoall (counts, op, table, arguments, input errors)
         -> Alltoallv of keys (and values / gradients) to their owners
         -> the owner's local op on what every rank sent it, in rank order
         -> Alltoallv of rows (or flags) back -> this rank's batch order

Results equal one process fed the ranks' batches concatenated in rank order:
the owner receives each rank's keys in rank order, and within a rank in
first-occurrence order, and applies today's local op to that sequence
(``upsert``: the last value wins; ``accum`` sends every position, in batch
order; ``find_or_insert(return_exists=True)``: only a new key's first
occurrence in rank order reports absent).  Initial values depend on (seed, key,
column) only, so they do not depend on the world size.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=2, comm=None)        # no comm (or a 1-rank one): a plain Variable
>>> type(v).__name__
'Variable'

Run ``mpiexec -n 2 python -m mpi4py script.py``: ``-m mpi4py`` makes an
uncaught exception on one rank abort the whole job (``MPI_Abort``) instead of
leaving the other ranks waiting in a collective.  A rank that dies (killed,
segfault) makes ``mpiexec`` end every rank.  Bad input never hangs: it is
reported to every rank by the header exchange.  Collective ops of tables that
share a communicator hold one lock per process: call them from one thread per
rank, in the same order on every rank.
"""
import time

import numpy as np

from . import _checks
from ._exchange import DeviceExchange, HostExchange
from ._mpi import Comm, crc, size_of
from .sharding import default_partitioner
from .variable import Variable

__all__ = ["DistributedVariable", "OPS"]

OPS = {name: i + 1 for i, name in enumerate(
    ["create", "lookup", "find_or_insert", "upsert", "accum", "remove", "size", "clear",
     "apply_gradients", "slot_values", "save", "load", "policy_update"])}


class LocalPartitioner:
    """Local shard of a key on its owner rank: ``(unsigned key // R) mod n``, so that
    keys that all share ``key mod R`` still spread over the local shards."""

    def __init__(self, world_size):
        self.world_size = world_size

    def __call__(self, keys, n):
        unsigned = keys.view(np.dtype(keys.dtype.str.replace("i", "u")))
        return ((unsigned // unsigned.dtype.type(self.world_size)) % unsigned.dtype.type(n)
                ).astype(np.int64)


class DistributedVariable(Variable):
    """A :class:`~numbaemb.Variable` whose keys are split across the ranks of ``comm``.

    Made by ``Variable(..., comm=comm)`` when ``comm`` has more than one rank (the
    constructor is collective: the ranks check that they agree on dim, dtypes,
    name, seed, initializer and partitioner).  Arguments as for ``Variable``;
    ``init_size`` counts keys of the whole table; ``num_shards`` are local shards
    on each rank.  GPU tables (``device="cuda:N"``, a GPU a rank) plan their
    exchanges on the GPU (a custom partitioner is asked on the host) and move device
    arrays by NCCL (see :mod:`numbaemb._exchange`).

    Limits (as ``Variable``'s; set them alike on every rank): ``key_range`` is
    checked while planning, so a bad key on one rank raises on every rank;
    ``max_keys`` bounds the keys each rank owns, agreed on by every rank before
    an optimizer step applies anything.

    Collective: ``lookup``, ``find_or_insert``, ``upsert``, ``accum``, ``remove``,
    ``size()`` (keys in the whole table, the same on every rank), ``clear``,
    ``save``, ``Variable.load(path, comm=...)`` and
    ``numbaemb.optimizers.apply_gradients`` / ``slot_values``.  Local:
    ``export`` (the keys this rank owns and their rows), ``size(index)`` (local
    shard ``index``), ``local_size()``.
    """

    def __init__(self, dim, *, comm, key_dtype=np.int64, value_dtype=np.float32, num_shards=1,
                 partitioner=None, name=None, initializer=None, init_size=0, seed=None,
                 device="cpu", max_hbm_bytes=None, **bounds):
        world = size_of(comm)
        self.user_comm = comm
        self._comm = Comm.of(comm)
        self.rank, self.world_size = self._comm.rank, self._comm.size
        error = None
        try:      # a bad argument on one rank must reach the others (they wait in the exchange)
            self._build(dim, world, key_dtype, value_dtype, num_shards, partitioner, name,
                        initializer, init_size, seed, device, max_hbm_bytes, bounds)
        except Exception as e:      # noqa: BLE001
            error = e
        with self._comm.lock:
            serial = self._comm.tables
            self._comm.tables += 1
            cfg = None if error else self._identity()
            self._tag = crc(cfg, serial)
            self._comm.start(OPS["create"], self._tag, 0, 0, error,
                             f"creating table {name!r} (#{serial}) with {cfg}")

    def _build(self, dim, world, key_dtype, value_dtype, num_shards, partitioner, name,
               initializer, init_size, seed, device, max_hbm_bytes, bounds):
        if partitioner is not None and not callable(partitioner):
            raise TypeError(f"partitioner must be callable, got {type(partitioner).__name__}")
        num_shards = _checks.positive_int(num_shards, "num_shards")
        init_size = -(-_checks.positive_int(init_size, "init_size", minimum=0) // world)
        self.local = Variable(dim, key_dtype=key_dtype, value_dtype=value_dtype,
                              num_shards=num_shards,
                              partitioner=LocalPartitioner(world) if num_shards > 1 else None,
                              name=name, initializer=initializer, init_size=init_size,
                              seed=seed, device=device, max_hbm_bytes=max_hbm_bytes, **bounds)
        for attr in ("dim", "key_dtype", "value_dtype", "num_shards", "name", "initializer",
                     "seed", "device", "max_hbm_bytes", "_arrays", "_store", "max_capacity",
                     "evict", "evict_window", "steps_to_live"):
            setattr(self, attr, getattr(self.local, attr))
        self.partitioner = partitioner
        if self.local._arrays.device_id is None:
            self._x = HostExchange(self._comm, world, partitioner, self.key_dtype)
        else:
            self._x = DeviceExchange(self._comm, world, self.key_dtype, self.local._arrays,
                                     partitioner)

    def _identity(self):
        """What every rank must agree on."""
        from .admission import config_of
        part = self.partitioner
        return dict(name=self.name, dim=self.dim, gpu=self.device != "cpu",
                    key_dtype=self.key_dtype.name,
                    value_dtype=self.value_dtype.name, seed=int(self.seed),
                    initializer=self.initializer.get_config(),
                    partitioner="default" if part is None or part is default_partitioner
                    else getattr(part, "__qualname__", type(part).__qualname__),
                    max_capacity=self.max_capacity, evict=self.evict,
                    evict_window=self.evict_window, steps_to_live=self.steps_to_live,
                    admit=None if self.admit is None else config_of(self.admit))

    # bounds live in the local table: capacity per rank, each rank's own admission filter
    # (counting the keys it owns), clocks and epochs of the keys it owns
    admit = property(lambda self: self.local.admit,
                     lambda self, f: setattr(self.local, "admit", f))
    _clock = property(lambda self: self.local._clock,
                      lambda self, v: setattr(self.local, "_clock", v))
    _epoch = property(lambda self: self.local._epoch,
                      lambda self, v: setattr(self.local, "_epoch", v))
    _last_step = property(lambda self: self.local._last_step,
                          lambda self, v: setattr(self.local, "_last_step", v))

    def set_epoch(self, epoch):
        """The epoch of this rank's epoch-scored keys (not collective: set it alike on
        every rank)."""
        self.local.set_epoch(epoch)

    @property
    def epoch(self):
        return self.local.epoch

    @property
    def comm(self):
        return self.user_comm

    @property
    def shards(self):
        """This rank's local shards."""
        return self.local.shards

    @property
    def _lock(self):
        return self.local._lock

    key_range = property(lambda self: self.local.key_range,
                         lambda self, r: setattr(self.local, "key_range", r))

    def config(self) -> dict:
        cfg = self.local.config()
        cfg.update(partitioner=self.partitioner, world_size=self.world_size)
        return cfg

    def __repr__(self):
        return (f"DistributedVariable(name={self.name!r}, dim={self.dim}, rank={self.rank}, "
                f"world_size={self.world_size}, local_size={self.local_size()}, "
                f"num_shards={self.num_shards}{self._settings()})")

    # ---- the exchange ------------------------------------------------------------------
    def _what(self, op):
        return f"{op} on table {self.name!r}"

    def _begin(self, op, prepare, arg=0):
        """Validate and plan (``prepare() -> (result, counts)``), then open the collective.

        Returns ``(result, recv_counts)``; every rank raises if any rank's input was bad
        or the ranks are in different ops."""
        c = self._comm
        t0 = time.perf_counter()
        result, counts, error = None, 0, None
        try:
            result, counts = prepare()
        except Exception as e:      # noqa: BLE001  every rank must learn of it, or they hang
            error = e
        c.add_time("plan", t0)
        what = self._what(op) + (f" with {arg!r}" if arg else "")
        return result, c.start(OPS[op], self._tag, crc(op, arg), counts, error, what)

    def _plan(self, keys, unique=True):
        keys, flat = self.local._keys(keys)      # checks the local table's key_range
        return keys, self._x.plan(flat, unique)

    @property
    def transport(self):
        """How this table's arrays move between ranks: ``"mpi"`` (host tables),
        ``"nccl"`` or ``"mpi (staged through host memory)"`` (GPU tables, chosen at
        their first exchange)."""
        return self._x.transport

    def _keys_plan(self, keys, unique=True):
        k, p = self._plan(keys, unique)
        return (k, p), p.counts

    def _local(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self._comm.add_time("local", t0)

    def _back(self, rows, recv_counts, p, shape):
        """Rows in send order from the owners -> ``shape + (width,)`` in batch order."""
        c = self._comm
        rows = self._x.ours(rows)       # (a GPU table's slot values come from the host)
        shown, store = rows.dtype, _checks.storage_dtype(rows.dtype)   # 16-bit floats: bits
        back = self._x.alltoallv(rows.view(store), recv_counts, p.counts)
        t0 = time.perf_counter()
        out = self._x.back(back, p.slot)
        c.add_time("order", t0)
        return out.view(shown).reshape(tuple(shape) + (back.shape[1],))

    def _read(self, op, keys, owner_fn, arg=0, check=None):
        """Collective read: keys to owners, ``owner_fn(keys) -> rows``, rows back;
        ``check()`` validates other arguments inside the exchange."""
        def prepare():
            if check is not None:
                check()
            return self._keys_plan(keys)

        with self._comm.lock:
            (keys, p), rc = self._begin(op, prepare, arg)
            recv = self._x.alltoallv(p.send_keys, p.counts, rc)
            return self._back(self._local(owner_fn, recv), rc, p, keys.shape)

    # ---- reads ---------------------------------------------------------------------------
    def lookup(self, keys, return_exists=False):
        """Collective ``Variable.lookup``: every rank gets the rows of its own keys."""
        if not return_exists:
            return self._read("lookup", keys, self.local.lookup)
        return self._rows_and_flags("lookup", keys, self.local.lookup, first_only=False)

    def _rows_and_flags(self, op, keys, local_fn, first_only, scores=None, check=None,
                        arg=True):
        """Rows and ``exists`` flags of ``keys`` from ``local_fn(keys, return_exists=True)``
        on the owners; ``first_only``: repeats of a key in the batch report True.
        ``scores`` (or None): each key's int score goes with it (a key's last position's,
        the last rank's last), as ``local_fn``'s ``scores``; ``check()`` validates other
        arguments inside the exchange."""
        def prepare():
            if check is not None:
                check()
            (k, p), counts = self._keys_plan(keys)
            sc = self.local._check_scores(scores, k.shape)    # the owner's check, made here
            send = None
            if sc is not None:      # a key's last position's score
                send = self._x.last_wins(self._x.scores(sc), p.slot, p.send_keys.shape[0])
            return (k, p, send), counts

        with self._comm.lock:
            (k, p, send), rc = self._begin(op, prepare, arg)
            x = self._x
            recv = x.alltoallv(p.send_keys, p.counts, rc)
            # (the owner's table takes scores on the host)
            kw = {} if send is None else {"scores": x.host(x.alltoallv(send, p.counts, rc))[:, 0]}
            rows, found = self._local(local_fn, recv, return_exists=True, **kw)
            out = self._back(rows, rc, p, k.shape)
            exists = x.flags(x.alltoallv(found, rc, p.counts), p, first_only)
            return out, exists.reshape(k.shape)

    def size(self, index=None) -> int:
        """Keys in the whole table (collective), or in local shard ``index`` of this rank."""
        if index is not None:
            return self.local.size(index)
        with self._comm.lock:
            _, sizes = self._begin("size", lambda: (None, self.local.size()))
            return int(sizes.sum())

    def local_size(self) -> int:
        """Keys this rank owns (not collective)."""
        return self.local.size()

    def export(self, column="values"):
        """The keys this rank owns and their rows (not collective)."""
        return self.local.export(column)

    # ---- writes --------------------------------------------------------------------------
    def find_or_insert(self, keys, return_exists=False, return_evicted=False, scores=None):
        """Collective ``Variable.find_or_insert``; with ``return_exists``, only a new
        key's first occurrence in rank order (then batch order) reports absent.  A
        bounded table inserts on each owner in the order the keys reach it (rank order,
        then first occurrence).  ``return_evicted`` adds what *this rank's* table evicted
        in the call (the keys it owned and lost, to spill), as ``Variable``'s does.
        ``scores`` (``evict="custom"``, ``keys.shape``) travel with the keys: a key's
        score is its last position's, then the last rank's (as one process fed the
        batches in rank order).  Every rank passes the same ``return_exists`` /
        ``return_evicted`` and gives scores or not alike."""
        evicted = []

        def local(k, return_exists=False, scores=None):
            out = self.local.find_or_insert(k, return_exists=return_exists,
                                            return_evicted=return_evicted, scores=scores)
            if not return_evicted:
                return out
            evicted.extend(out[-2:])
            return out[0] if len(out) == 3 else out[:2]

        def check():
            if return_evicted not in (False, True, "columns"):
                raise ValueError(f"return_evicted must be False, True or 'columns', got "
                                 f"{return_evicted!r}")
            if return_evicted and self.max_capacity is None:
                raise ValueError("return_evicted is for bounded tables (max_capacity)")

        if scores is None and not return_evicted and not return_exists:   # rows only
            return self._read("find_or_insert", keys, local)
        # arg: every rank must ask alike (else every rank raises; none waits in vain)
        rows, exists = self._rows_and_flags(
            "find_or_insert", keys, local, first_only=True, scores=scores, check=check,
            arg=f"evicted={return_evicted!r}, scores={scores is not None}")
        out = ((rows, exists) if return_exists else (rows,)) + tuple(evicted)
        return out[0] if len(out) == 1 else out

    def upsert(self, keys, values, scores=None):
        """Collective ``Variable.upsert``: for a key sent by several ranks (or repeated
        in a batch) the value of the last rank (last position) wins, and so does its
        score (``scores``: ``evict="custom"``, ``keys.shape``; every rank gives scores
        or not alike)."""
        def prepare():
            k, p = self._plan(keys)
            vals = self.local._values(values, k.shape)       # as stored
            sc = self.local._check_scores(scores, k.shape)    # the owner's check, made here
            t0 = time.perf_counter()
            n = p.send_keys.shape[0]
            send = self._x.last_wins(vals, p.slot, n)
            send_sc = None if sc is None else self._x.last_wins(self._x.scores(sc), p.slot, n)
            self._comm.add_time("order", t0, moved_from="plan")
            return (p, send, send_sc), p.counts

        with self._comm.lock:
            (p, send, send_sc), rc = self._begin("upsert", prepare,
                                                 f"scores={scores is not None}")
            x = self._x
            recv_keys = x.alltoallv(p.send_keys, p.counts, rc)
            recv_vals = x.alltoallv(send, p.counts, rc)
            # (the owner's table takes scores on the host)
            kw = {} if send_sc is None else {
                "scores": x.host(x.alltoallv(send_sc, p.counts, rc))[:, 0]}
            self._local(self.local.upsert, recv_keys, self.local._shown(recv_vals), **kw)

    def accum(self, keys, old_values, new_values, exists):
        """Collective ``Variable.accum``: every position goes to its owner, in batch
        order, so the owner applies the sequential rule to the rank-ordered sequence."""
        def prepare():
            k, p = self._plan(keys, unique=False)
            old = self.local._operands(old_values, k.shape, "old_values")
            new = self.local._operands(new_values, k.shape, "new_values")
            ex = self.local._arrays.exists(exists, k.shape)
            t0 = time.perf_counter()
            sends = [self._x.spread(a, p.slot) for a in (old, new, ex)]   # in send order
            self._comm.add_time("order", t0, moved_from="plan")
            return (p, sends), p.counts

        with self._comm.lock:
            (p, sends), rc = self._begin("accum", prepare)
            recv_keys = self._x.alltoallv(p.send_keys, p.counts, rc)
            old, new, flags = (self._x.alltoallv(a, p.counts, rc) for a in sends)
            self._local(self.local.accum, recv_keys, old, new, flags)

    def remove(self, keys):
        """Collective ``Variable.remove``."""
        self._on_owners("remove", keys, self.local.remove)

    def _on_owners(self, op, keys, fn, unique=True):
        """Collective: each rank's ``keys`` (its distinct ones; ``unique=False``: every
        position, in batch order) go to their owners, which return ``fn(the keys they
        received, in rank order)``."""
        with self._comm.lock:
            (_, p), rc = self._begin(op, lambda: self._keys_plan(keys, unique))
            recv = self._x.alltoallv(p.send_keys, p.counts, rc)
            return self._local(fn, recv)

    def clear(self):
        """Collective: every rank drops its keys."""
        with self._comm.lock:
            self._begin("clear", lambda: (None, 0))
            self.local.clear()

    # ---- training --------------------------------------------------------------------------
    def _apply_gradients(self, optimizer, keys, grads, step, lr, assume_unique, delta):
        """``numbaemb.optimizers.apply_gradients`` (arguments unchecked yet): owners apply
        ``grads`` of ``keys``: each rank sums its
        duplicates, sends one row per distinct id to the owner, which sums what the
        ranks sent (in rank order) and applies one update per id."""
        from .optimizers import _check, _step_and_rate, apply_gradients
        checked = []

        def prepare():
            _check(self, optimizer)
            checked.extend(_step_and_rate(optimizer, step, lr))
            k, p = self._plan(keys, unique=not assume_unique)
            g = self.local._arrays.values(grads, k.shape, self.dim,
                                          _checks.compute_dtype(self.value_dtype), "grads")
            t0 = time.perf_counter()
            sums = self._x.sums(g, p.slot, p.send_keys.shape[0])
            self._comm.add_time("order", t0, moved_from="plan")
            return (p, sums), p.counts

        arg = (repr(optimizer), repr(step), repr(lr), bool(assume_unique), bool(delta))
        with self._comm.lock:
            (p, sums), rc = self._begin("apply_gradients", prepare, arg)
            recv_keys = self._x.alltoallv(p.send_keys, p.counts, rc)
            recv_sums = self._x.alltoallv(sums, p.counts, rc)
            step, lr = checked
            if self.max_keys is not None:
                self._check_capacity(recv_keys)
            self._local(apply_gradients, self.local, optimizer, recv_keys, recv_sums,
                        step=step, learning_rate=lr, delta=delta)

    def _check_capacity(self, keys):
        """Every rank raises if inserting ``keys`` (received distinct keys) would take any
        rank past ``max_keys`` (one small Allgather, only for tables with a limit)."""
        after = np.array([self.local.size() + self.local._count_new(keys)], np.int64)
        every = np.empty(self.world_size, np.int64)
        self._comm.comm.Allgather(after, every)
        over = [r for r in range(self.world_size) if every[r] > self.max_keys]
        if over:
            raise ValueError(
                f"table {self.name!r} is full: this step would put "
                f"{', '.join(f'{every[r]} keys on rank {r}' for r in over)}, over its capacity "
                f"of {self.max_keys} keys per rank (nothing was applied)")

    def _slot_values(self, optimizer, slot_name, keys):
        from .optimizers import _check_slot, slot_values
        return self._read("slot_values", keys,
                          lambda k: slot_values(self.local, optimizer, slot_name,
                                                self._x.host(k)),
                          (repr(optimizer), repr(slot_name)),
                          check=lambda: _check_slot(self, optimizer, slot_name))

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, path):
        """Collective: one checkpoint directory ``path``, a part per rank, committed
        atomically by rank 0.  See :mod:`numbaemb.distributed_checkpoint`."""
        from . import distributed_checkpoint
        distributed_checkpoint.save(self, path)
