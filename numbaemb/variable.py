"""``Variable``: a dynamic embedding table of int64 or int32 keys and float rows.

Keys may have any shape; values come back with shape ``keys.shape + (dim,)``.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=2, name="doc")
>>> v.upsert(np.array([1, 2]), np.ones((2, 2), np.float32))
>>> v.lookup(np.array([[1, 99]])).tolist()        # 99 is absent: initial value, not inserted
[[[1.0, 1.0], [0.0, 0.0]]]
>>> v.size()
2

Thread safety: every method may be called from several threads.  Lookups,
``export`` and ``size`` run concurrently with each other; mutations
(``upsert``, ``find_or_insert``, ``accum``, ``remove``, ``clear``) run alone, so
a lookup sees each row entirely before or entirely after a concurrent write,
never a torn row.  Compiled kernels release the GIL, so concurrent lookups use
several cores.
"""
import zlib

import numpy as np

from jit_kernels.segment import unique_inverse

from . import _ahead, _checks
from . import initializers as inits
from ._device import DeviceArrays, HostArrays, parse_device
from ._lock import RWLock
from .admission import admitted
from .bounded import EVICT_WINDOW
from .bounded import check_bounds as _bounds
from .shard import Shard
from .sharding import default_partitioner, split

__all__ = ["Variable", "get_variable"]


def sequential_exists(keys, found):
    """``exists`` as a sequential loop over the batch would report it.

    ``found[i]`` is False only at the one position that inserted its key (which
    of a key's duplicates wins the insert depends on thread timing).  In batch
    order, only a new key's *first* occurrence was absent; later ones find it.

    >>> sequential_exists(np.array([5, 7, 5]), np.array([True, True, False])).tolist()
    [False, True, True]
    """
    if found.all():
        return found
    _, inv = unique_inverse(keys)
    new_key = np.zeros(int(inv.max()) + 1, np.bool_)
    new_key[inv[~found]] = True
    first = np.ones(inv.shape[0], np.bool_)
    first[1:] = inv[1:] > np.maximum.accumulate(inv)[:-1]
    return ~(new_key[inv] & first)




class Variable:
    """A sharded hash table ``key -> row of dim values``, grown as keys arrive.

    Args:
      dim: row width.
      key_dtype: ``np.int64`` (default) or ``np.int32``; every value of it is a valid key.
      value_dtype: ``np.float32`` (default) or ``np.float64``; ``np.float16`` or
        ``"bfloat16"`` (``ml_dtypes.bfloat16``) for half the memory: stored as their bits,
        initial values and optimizer / ``accum`` math in float32, rounded once to nearest
        even on store, optimizer slots float32; or ``np.int8`` / ``int32`` / ``int64`` for
        tables that are not trained (id maps, counters; initial values are the
        initializer's, truncated).
      num_shards: shards in this process; keys go to ``partitioner(keys, num_shards)``.
      partitioner: ``f(keys, n) -> shard ids``; default key mod n on the unsigned value.
      name: optional name (``get_variable`` registry; default seed).
      initializer: value of absent keys; a ``numbaemb.initializers`` object, a number
        or an array of shape ``(dim,)``; default zeros.
      init_size: keys to make room for up front: the index and the rows of every column
        for that many keys are allocated and their pages faulted in at creation
        (memory ``init_size x dim x itemsize`` per column), so inserting them later
        costs no page faults (a fresh page cost 2 us on a 2-core VM).
      seed: seed of random initializers that have none; default a hash of ``name``.
      device: ``"cpu"`` (default), ``"cuda"`` or ``"cuda:N"``.  On a GPU the table
        lives in device memory; inputs may be numpy or device arrays (CuPy, Numba:
        anything with ``__cuda_array_interface__``) and ``lookup``,
        ``find_or_insert`` and ``export`` return Numba device arrays (wrap them
        zero-copy with ``cupy.asarray``).  Needs numba-cuda.
      max_hbm_bytes: GPU only (hybrid mode): device memory for each shard's rows;
        rows beyond it live in pinned host memory mapped into the GPU.  Default:
        no limit.
      comm: an mpi4py communicator: with more than one rank the table is split
        across its ranks and the result is a
        :class:`numbaemb.distributed.DistributedVariable` (every op collective);
        ``None`` or one rank: this process holds every key.
      max_capacity: None (default: the table grows), or the most keys it may hold: an
        insert into a full table (or a full bucket) evicts the lowest-scored key of the
        new key's bucket (:mod:`numbaemb.bounded`; one shard, on the CPU or a GPU, where
        it holds what the CPU one holds after the same calls:
        :mod:`numbaemb.cuda_bounded`).
      evict: the score of a bounded table: ``"lru"`` (default), ``"lfu"``,
        ``"epoch_lru"``, ``"epoch_lfu"`` (epoch from :meth:`set_epoch`, else the last
        optimizer step) or ``"custom"`` (``scores=`` of ``find_or_insert`` / ``upsert``).
      evict_window: ``"bucket"`` (default): a bucketed index, HierarchicalKV's
        (:mod:`jit_kernels.bucket_bounded`; a key lives in one bucket of 32 slots and a
        new key evicts the lowest score of its bucket, also when only the bucket is
        full; on a GPU a thread a bucket, :mod:`jit_kernels.cuda_buckets`), or an int:
        a linear-probing index whose new key looks at that many slots from its home
        for its victim (a window wider than the index is the whole index; evicting
        inserts about 1.6x as slow as the buckets' on the CPU, evictions only when
        the table is full, 0.5% more hits of an exact LRU cache's on a drifting
        stream).  ``evict`` and ``evict_window`` need ``max_capacity``.  A bounded table's index (with the
        victim search's score copies) is allocated for ``max_capacity`` up front:
        50-100 bytes a key (50 at a power of two); rows are made as keys arrive.
      steps_to_live: None, or keep per key the optimizer step that last updated it, so
        that :func:`numbaemb.expiry.expire` can drop the keys not updated in that many
        steps (see :mod:`numbaemb.expiry`; CPU or GPU).
      admit: None, or an admission filter (:mod:`numbaemb.admission`:
        ``CounterFilter(min_count)`` / ``BloomFilter(min_count, capacity, error_rate)``:
        an absent id gets a row only once it has been seen ``min_count`` times;
        ``RandomFilter(p, seed)``: with probability ``p`` each call).

    Limits (attributes, None by default): ``key_range = (lo, hi)`` makes every op
    reject keys outside ``[lo, hi)`` with a ValueError before it changes anything;
    ``max_keys`` bounds the table's size for optimizer steps
    (:func:`numbaemb.optimizers.apply_gradients`): a step that would insert past it
    raises ValueError and applies nothing.
    """

    comm = None           # the communicator of a distributed table
    key_range = None      # None or (lo, hi)
    max_keys = None       # None or the most keys optimizer steps may fill the table to

    def __new__(cls, *args, comm=None, **kwargs):
        from ._mpi import size_of
        string = cls is Variable and _checks.key_dtype(
            kwargs.get("key_dtype", np.int64)) == _checks.STRING
        if cls is Variable and comm is not None and size_of(comm) > 1:
            if string:
                raise ValueError("string keys (key_dtype='string') are for tables in one "
                                 "process; a table split across MPI ranks needs int keys")
            from .distributed import DistributedVariable
            return super().__new__(DistributedVariable)
        if string:
            from .string_keys import StringVariable
            return super().__new__(StringVariable)
        return super().__new__(cls)

    def __init__(self, dim, *, key_dtype=np.int64, value_dtype=np.float32, num_shards=1,
                 partitioner=None, name=None, initializer=None, init_size=0, seed=None,
                 device="cpu", max_hbm_bytes=None, comm=None, max_capacity=None,
                 evict="lru", evict_window=EVICT_WINDOW, admit=None, steps_to_live=None):
        self.dim = _checks.positive_int(dim, "dim")
        self.key_dtype = _checks.key_dtype(key_dtype)
        self.value_dtype = _checks.value_dtype(value_dtype)
        self._store = _checks.storage_dtype(self.value_dtype)   # the columns' dtype
        self.num_shards = _checks.positive_int(num_shards, "num_shards")
        init_size = _checks.positive_int(init_size, "init_size", minimum=0)
        if partitioner is not None and not callable(partitioner):
            raise TypeError(f"partitioner must be callable, got {type(partitioner).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self.partitioner = partitioner
        self.name = name
        self.initializer = inits.get(initializer)
        self.seed = seed if seed is not None else zlib.crc32((name or "").encode())
        params = self.initializer.params(self.dim, self.seed)
        per_shard = -(-init_size // self.num_shards)
        device_id = parse_device(device)
        if max_hbm_bytes is not None:
            max_hbm_bytes = _checks.positive_int(max_hbm_bytes, "max_hbm_bytes")
            if device_id is None:
                raise ValueError("max_hbm_bytes needs a CUDA device (device='cuda')")
        self.device = "cpu" if device_id is None else f"cuda:{device_id}"
        self.max_hbm_bytes = max_hbm_bytes
        self.max_capacity, self.evict, self.evict_window = _bounds(
            max_capacity, evict, evict_window, self.num_shards)
        self._clock, self._epoch, self._last_step = 0, None, 0
        if admit is not None and not (hasattr(admit, "count") and hasattr(admit, "min_count")):
            raise TypeError(f"admit must be None or an admission filter (numbaemb.admission."
                            f"CounterFilter / BloomFilter / RandomFilter), got {type(admit).__name__}")
        self.admit = admit
        if self.max_capacity is not None and device_id is not None:
            from .cuda_bounded import CudaBoundedShard
            self._arrays = DeviceArrays(device_id)
            self.shards = [CudaBoundedShard(self.dim, self._store, params, self.max_capacity,
                                            self.evict, self.evict_window, init_size,
                                            device_id, max_hbm_bytes)]
        elif self.max_capacity is not None:
            from .bounded import BoundedShard
            self._arrays = HostArrays()
            self.shards = [BoundedShard(self.dim, self._store, params, self.max_capacity,
                                        self.evict, self.evict_window, init_size)]
        elif device_id is None:
            self._arrays = HostArrays()
            self.shards = [Shard(self.dim, self._store, params, per_shard)
                           for _ in range(self.num_shards)]
            _ahead.note_table(self)     # what a cold start's helper compiles for
        else:
            from .cuda_shard import CudaShard
            self._arrays = DeviceArrays(device_id)
            budget = None if max_hbm_bytes is None else -(-max_hbm_bytes // self.num_shards)
            self.shards = [CudaShard(self.dim, self._store, params, per_shard, device_id,
                                     budget) for _ in range(self.num_shards)]
        self._lock = RWLock()
        self.steps_to_live = None if steps_to_live is None else _checks.positive_int(
            steps_to_live, "steps_to_live")
        if self.steps_to_live is not None:
            from .expiry import add_step_column
            add_step_column(self)

    # ---- helpers -------------------------------------------------------------------
    def config(self) -> dict:
        """Everything that defines the table except its contents."""
        return dict(dim=self.dim, key_dtype=_checks.dtype_name(self.key_dtype),
                    value_dtype=self.value_dtype.name, num_shards=self.num_shards,
                    partitioner=self.partitioner, name=self.name,
                    initializer=self.initializer, seed=self.seed, device=self.device,
                    max_hbm_bytes=self.max_hbm_bytes, max_capacity=self.max_capacity,
                    evict=self.evict, evict_window=self.evict_window,
                    steps_to_live=self.steps_to_live)

    @property
    def _id_dtype(self):
        """The dtype of the shards' keys (a string table's shards hold int64 ids)."""
        return self.key_dtype

    def _keys(self, keys, insert=False):
        """``(keys, flat int64)`` of the shards; ``insert``: the op may insert them (a
        string table registers new strings then)."""
        keys, flat = self._arrays.keys(keys, self._id_dtype)
        if self.key_range is not None and flat.shape[0]:
            lo, hi = self.key_range
            kmin, kmax = int(flat.min()), int(flat.max())
            if kmin < lo or kmax >= hi:
                raise ValueError(f"keys must be in [{lo}, {hi}) for table {self.name!r}, got "
                                 f"min {kmin}, max {kmax}")
        return keys, flat

    def _host_keys(self, keys, insert=False, name="keys"):
        """Host ``keys`` as an array of the shards' key dtype (shape kept); string tables
        resolve strings to ids here (``insert``: registering new ones)."""
        return _checks.as_keys(keys, self._id_dtype, name)

    def _present(self, keys, flat):
        """Host bool mask: which of ``flat`` (the keys of :meth:`_keys`) have a row
        (probe only; the caller holds the lock)."""
        host = self._arrays.host          # (a GPU table's rows: to the host)
        present = np.zeros(flat.shape[0], np.bool_)
        for shard, pos, k in self._parts(keys, flat):
            found = host(shard.find_rows(k)) >= 0
            if pos is None:
                present[:] = found
            else:
                present[host(pos)] = found
        return present

    def _count_new(self, keys) -> int:
        """How many of the distinct ``keys`` are absent (each shard's probe-only count:
        no rows are read)."""
        keys, flat = self._keys(keys)
        if not flat.shape[0]:
            return 0
        with self._lock.read():
            return sum(int(shard._count_absent(k)) for shard, _, k in self._parts(keys, flat))

    def _check_room(self, keys, what="this step"):
        """ValueError, before anything is applied, when inserting the distinct ``keys``
        would take the table past ``max_keys``."""
        if self.max_keys is None:
            return
        after = self.size() + self._count_new(keys)
        if after > self.max_keys:
            raise ValueError(f"table {self.name!r} is full: {what} would put {after} keys in "
                             f"it, over its capacity of {self.max_keys} keys (nothing was "
                             "applied)")

    def _parts(self, keys, flat):
        """[(shard, positions or None, shard keys)], computed before any mutation."""
        if self.num_shards == 1:
            return [(self.shards[0], None, flat)]
        a = self._arrays
        pos = split(a.host(keys).reshape(-1), self.num_shards,
                    self.partitioner or default_partitioner)
        pos = [a.positions(p) for p in pos]
        return [(s, p, a.take(flat, p)) for s, p in zip(self.shards, pos) if p.shape[0]]

    def _values(self, values, shape, name="values"):
        """``values`` checked, as the columns store them (16-bit floats: their bits)."""
        out = self._arrays.values(values, shape, self.dim, self.value_dtype, name)
        return out if self._store == self.value_dtype else out.view(self._store)

    def _operands(self, values, shape, name):
        """``values`` for arithmetic on rows (accum): in the compute dtype (float32 for
        16-bit floats: their values exactly), see :func:`_checks.compute_dtype`."""
        return self._arrays.operands(values, shape, self.dim, self.value_dtype, name)

    def _shown(self, rows):
        """Rows as stored, seen as the value dtype (16-bit floats: a view of their bits)."""
        return rows if self._store == self.value_dtype else rows.view(self.value_dtype)

    # ---- reads -----------------------------------------------------------------------
    def lookup(self, keys, return_exists=False, out=None):
        """Rows of ``keys`` (shape ``keys.shape + (dim,)``); absent keys get their
        initial value and are not inserted.  With ``return_exists`` also a bool
        array of ``keys.shape``.  The result is 64-byte aligned, or written into
        ``out`` (CPU tables: a C-contiguous numpy array of ``(keys.size, dim)`` rows
        of the value dtype, e.g. a buffer reused every step) and returned as its view."""
        keys, flat = self._keys(keys)
        n, a = flat.shape[0], self._arrays
        out = a.empty((n, self.dim), self._store) if out is None else self._out(out, n)
        exists = a.empty(n, np.bool_)
        with self._lock.read():
            for shard, pos, k in self._parts(keys, flat):
                if pos is None:
                    shard.lookup(k, out, exists)
                else:
                    o = a.empty((k.shape[0], self.dim), self._store)
                    e = a.empty(k.shape[0], np.bool_)
                    shard.lookup(k, o, e)
                    a.put(out, pos, o)
                    a.put(exists, pos, e)
        out = self._shown(out).reshape(keys.shape + (self.dim,))
        return (out, exists.reshape(keys.shape)) if return_exists else out

    def _out(self, out, n):
        """``out`` checked as a destination of ``n`` rows, seen as stored."""
        if self.device != "cpu" or not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array on a CPU table, got "
                            f"{type(out).__name__} for a table on {self.device}")
        if out.dtype != self.value_dtype or out.shape != (n, self.dim) or \
                not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {self.value_dtype} array of shape "
                             f"{(n, self.dim)}, got {out.dtype} {out.shape}")
        return out.view(self._store)

    def block_until_ready(self):
        """Wait for this table's deferred work: a Keras training step's update of the table
        runs after the step returns (``tf_bridge.optimizer.DEFERRED``), and every other
        call on the table waits for it first, so calling this is never needed for
        correct results; it raises that update's error, if any (``RuntimeError``).
        Returns the table."""
        self._lock.settle()
        return self

    def size(self, index=None) -> int:
        """Number of keys, in all shards or in shard ``index``."""
        self._lock.settle()
        if index is None:
            return sum(s.size for s in self.shards)
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int or None, got {type(index).__name__}")
        if not 0 <= index < self.num_shards:
            raise ValueError(f"index must be in [0, {self.num_shards}), got {index}")
        return self.shards[index].size

    def nbytes(self) -> int:
        """Bytes the table holds, in host or device memory: every shard's index, columns
        (values, optimizer slots, scores) and free rows as allocated (columns grow
        ahead of the keys), a bounded table's score copies and call marks, a string
        table's names and an admission filter's state.  On a table split across MPI
        ranks, this rank's part (not collective).

        >>> import numpy as np, numbaemb as ne
        >>> v = ne.Variable(dim=4); v.find_or_insert(np.arange(1000)).shape
        (1000, 4)
        >>> v.nbytes() >= 1000 * (8 + 4 * 4)
        True
        """
        with self._lock.read():
            n = sum(int(shard.nbytes()) for shard in self.shards)
        names = getattr(self, "names", None)            # a string table's
        if names is not None:
            n += int(names.nbytes)
        filter_bytes = getattr(self.admit, "nbytes", None)
        return n + (int(filter_bytes()) if filter_bytes is not None else 0)

    def export(self, column="values"):
        """All keys (key dtype, shape (n,)) and their rows (shape (n, dim)), shard by shard.

        ``column``: ``"values"`` or another column of the table (an optimizer's slot,
        e.g. ``"Adam/m"`` after an Adam step; a bounded table's ``"score"``); an unknown
        name is a ``ValueError`` that lists the table's columns."""
        with self._lock.read():
            return self._export(column)

    def _export(self, column):
        """``export`` for a caller that holds the lock: shard keys (ids) and rows."""
        names = self.shards[0].columns
        if not isinstance(column, str) or column not in names:
            raise ValueError(f"column must be one of the table's columns {sorted(names)}, "
                             f"got {column!r}")
        parts = [s.export(column) for s in self.shards]
        keys = self._arrays.concat([p[0] for p in parts], self._id_dtype)
        rows = self._arrays.concat([p[1] for p in parts], parts[0][1].dtype)
        return keys, self._shown(rows) if column == "values" else rows

    # ---- writes ----------------------------------------------------------------------
    def find_or_insert(self, keys, return_exists=False, return_evicted=False, scores=None,
                       out=None, _admitted_call=False):
        """Like ``lookup``, but absent keys are inserted with their initial values
        (``out`` as ``lookup``'s: the rows are written there).

        Bounded tables (``max_capacity``): a key that is not admitted gets its initial
        values and is reported absent; ``scores`` (int64, ``keys.shape``) are the
        ``"custom"`` policy's; ``return_evicted`` adds ``(evicted_keys (m,),
        evicted_values (m, dim))`` to the result, or with ``return_evicted="columns"``
        a dict of every evicted column (optimizer slots, the score)."""
        keys, flat = self._keys(keys, insert=True)
        n, a = flat.shape[0], self._arrays
        out = a.empty((n, self.dim), self._store) if out is None else self._out(out, n)
        exists = a.empty(n, np.bool_)
        if self.admit is not None and not _admitted_call:   # (the inner call: see below)
            with self._lock.write():
                ok = admitted(self, keys, flat)
            if ok is not None:
                return self._filtered_find_or_insert(keys, flat, ok, return_exists,
                                                     return_evicted, scores, out)
        if self.max_capacity is not None:
            return self._bounded_find_or_insert(keys, flat, out, return_exists,
                                                return_evicted, scores)
        if return_evicted or scores is not None:
            raise ValueError("return_evicted and scores are for bounded tables (max_capacity)")
        with self._lock.write():
            for shard, pos, k in self._parts(keys, flat):
                if pos is None:
                    _, inserted = shard.find_or_insert(k, out=out)
                    a.invert(inserted, exists)
                else:
                    o = a.empty((k.shape[0], self.dim), self._store)
                    e = a.empty(k.shape[0], np.bool_)
                    _, inserted = shard.find_or_insert(k, out=o)
                    a.invert(inserted, e)
                    a.put(out, pos, o)
                    a.put(exists, pos, e)
        out = self._shown(out).reshape(keys.shape + (self.dim,))
        if not return_exists:
            return out
        host = a.host
        seq = a.from_host(sequential_exists(host(flat), host(exists)))   # (to the rows' side)
        return out, seq.reshape(keys.shape)

    def upsert(self, keys, values, scores=None):
        """Insert or overwrite ``keys`` with ``values`` (shape ``keys.shape + (dim,)``).
        For a key repeated in the batch the last value wins.  Bounded tables: a key
        that is not admitted keeps no value; ``scores``: see ``find_or_insert``."""
        keys, flat = self._keys(keys, insert=True)
        values = self._values(values, keys.shape)
        with self._lock.write():
            ok = admitted(self, keys, flat)
            if ok is not None:                  # ids the filter does not admit yet: dropped
                a = self._arrays
                pos = a.positions(np.flatnonzero(ok))
                keys = flat = a.take(flat, pos)
                values = a.take(values, pos)
                scores = None if scores is None else np.asarray(scores).reshape(-1)[ok]
            kw = self._bound_kw(scores, keys.shape)
            for shard, pos, k in self._parts(keys, flat):
                shard.upsert(k, values if pos is None else self._arrays.take(values, pos), **kw)

    def _filtered_find_or_insert(self, keys, flat, ok, return_exists, return_evicted, scores,
                                 out):
        """``find_or_insert`` where only the positions ``ok`` may insert (an admission
        filter's verdict); the others read their initial values and are absent."""
        a = self._arrays
        flat = a.host(flat)         # (a GPU table: put together on the host, then moved)
        sub = Variable.find_or_insert(      # (this class's: not a subclass's wrapper)
            self, flat[ok], return_exists=True, return_evicted=return_evicted, _admitted_call=True,
            scores=None if scores is None else np.asarray(scores).reshape(-1)[ok])
        rest = a.host(self.lookup(flat[~ok]))
        if self.device != "cpu":     # (out was made for the device: rows meet on the host)
            out = np.empty((flat.shape[0], self.dim), self._store)
        out = self._shown(out)
        out[ok], out[~ok] = a.host(sub[0]), rest
        exists = np.zeros(flat.shape[0], np.bool_)
        exists[ok] = a.host(sub[1])
        out, exists = a.from_host(out), a.from_host(exists)
        result = [out.reshape(keys.shape + (self.dim,))]
        if return_exists:
            result.append(exists.reshape(keys.shape))
        result += list(sub[2:])
        return result[0] if len(result) == 1 else tuple(result)

    # ---- bounded tables (numbaemb.bounded) ------------------------------------------------
    def set_epoch(self, epoch):
        """The epoch of ``"epoch_lru"`` / ``"epoch_lfu"`` scores (an int >= 0)."""
        self._epoch = _checks.positive_int(epoch, "epoch", minimum=0)

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch`, else the last optimizer step (0 before)."""
        self._lock.settle()
        return self._last_step if self._epoch is None else self._epoch

    def _check_scores(self, scores, shape):
        """``scores`` (custom eviction scores of keys of ``shape``) as flat int64; None
        stays None; ValueError for a table that takes none."""
        if scores is None:
            return None
        if self.max_capacity is None:
            raise ValueError("scores are for bounded tables (max_capacity, evict='custom')")
        if self.evict != "custom":
            raise ValueError(f"scores are for evict='custom', this table's is {self.evict!r}")
        scores = _checks.flat_int64(_checks.as_keys(scores, np.dtype(np.int64), "scores"))
        if scores.shape[0] != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"scores must have the shape of keys {tuple(shape)}")
        return scores

    def _bound_kw(self, scores, shape):
        """Keyword arguments of a bounded shard's inserting call (caller holds the write
        lock; each call is one tick of the LRU clock); ``{}`` for other tables."""
        scores = self._check_scores(scores, shape)
        if self.max_capacity is None:
            return {}
        self._clock += 1
        return dict(scores=scores, epoch=self.epoch, clock=self._clock)

    def _bounded_find_or_insert(self, keys, flat, out, return_exists, return_evicted, scores):
        if return_evicted not in (False, True, "columns"):
            raise ValueError(f"return_evicted must be False, True or 'columns', got "
                             f"{return_evicted!r}")
        (shard,) = self.shards
        with self._lock.write():
            kw = self._bound_kw(scores, keys.shape)
            rows, inserted = shard.find_or_insert(flat, out=out, evicted=bool(return_evicted),
                                                  **kw)
            ev_keys, ev_cols = shard.last_evicted
        a = self._arrays
        result = [self._shown(out).reshape(keys.shape + (self.dim,))]
        if return_exists:
            exists = a.from_host((a.host(rows) >= 0) & ~a.host(inserted))
            result.append(exists.reshape(keys.shape))
        if return_evicted:
            ev_keys = a.concat([ev_keys], self._id_dtype)
            if return_evicted == "columns":
                cols = dict(ev_cols, values=self._shown(ev_cols["values"]))
                result += [ev_keys, cols]
            else:
                result += [ev_keys, self._shown(ev_cols["values"])]
        return result[0] if len(result) == 1 else tuple(result)

    def accum(self, keys, old_values, new_values, exists):
        """Add ``new - old`` where the key is present and ``exists``; insert ``new``
        where it is absent and not ``exists``; ignore the rest (TFRA semantics,
        applied in batch order; a bounded table acts on a key once a call, see
        :meth:`numbaemb.bounded.BoundedShard.accum`)."""
        keys, flat = self._keys(keys, insert=True)
        old = self._operands(old_values, keys.shape, "old_values")
        new = self._operands(new_values, keys.shape, "new_values")
        ex = self._arrays.exists(exists, keys.shape)
        take = self._arrays.take
        with self._lock.write():
            kw = self._bound_kw(None, keys.shape)          # a bounded table's clock tick
            for shard, pos, k in self._parts(keys, flat):
                if pos is None:
                    shard.accum(k, old, new, ex, **kw)
                else:
                    shard.accum(k, take(old, pos), take(new, pos), take(ex, pos), **kw)

    def remove(self, keys):
        """Remove ``keys``; absent keys are ignored."""
        keys, flat = self._keys(keys)
        with self._lock.write():
            for shard, _, k in self._parts(keys, flat):
                shard.remove(k)

    def clear(self):
        """Remove every key and release the memory."""
        with self._lock.write():
            for s in self.shards:
                s.clear()

    def __repr__(self):
        return (f"Variable(name={self.name!r}, dim={self.dim}, size={self.size()}, "
                f"num_shards={self.num_shards}{self._settings()})")

    def _settings(self):
        """``, key_dtype=..., value_dtype=...`` and the settings that are not defaults."""
        key = "string" if self.key_dtype == np.dtype(object) else self.key_dtype
        out = f", key_dtype={key}, value_dtype={self.value_dtype}"
        if self.device != "cpu":
            out += f", device={self.device!r}"
        if self.max_capacity is not None:
            out += f", max_capacity={self.max_capacity}, evict={self.evict!r}"
            if self.evict_window != EVICT_WINDOW:
                out += f", evict_window={self.evict_window!r}"
        if self.admit is not None:
            out += f", admit={self.admit!r}"
        if self.steps_to_live is not None:
            out += f", steps_to_live={self.steps_to_live}"
        return out

    # ---- native checkpoint -----------------------------------------------------------
    def save(self, path):
        """Write keys, values, extra columns and config to the file ``path``, atomically
        (temporary name, fsync, rename).  See :mod:`numbaemb.checkpoint`.

        >>> import os, tempfile, numpy as np, numbaemb as ne
        >>> d = tempfile.TemporaryDirectory(); p = os.path.join(d.name, "v.nbe")
        >>> v = ne.Variable(dim=2); v.upsert(np.array([4]), np.ones((1, 2)))
        >>> v.save(p)
        >>> ne.Variable.load(p, num_shards=2).lookup(np.array([4])).tolist()
        [[1.0, 1.0]]
        >>> d.cleanup()
        """
        from . import checkpoint
        checkpoint.save(self, path)

    @_checks.class_only
    def load(cls, path, num_shards=None, partitioner=None, device=None, max_hbm_bytes=None,
             comm=None, max_capacity=None, evict_window=None):
        """A new Variable read from a checkpoint written by ``save``; ``num_shards``
        and ``device`` (default: as saved) may differ, and a bounded table's
        ``max_capacity`` and ``evict_window`` (smaller: the lowest-scored keys are left
        out, with a warning).  A truncated or corrupt file raises ``ValueError``.  See
        :func:`numbaemb.checkpoint.load`.

        Call it on the class (``v = Variable.load(path)``): on an instance it raises a
        ``TypeError`` rather than leave that instance as it was.

        A directory ``path`` is a checkpoint saved by a distributed table (a part per
        rank): with ``comm`` of any world size it loads collectively, each rank taking
        the keys it owns; without, one process takes every key.  See
        :mod:`numbaemb.distributed_checkpoint`."""
        import os
        from ._mpi import size_of
        if os.path.isdir(_checks.as_path(path)) or size_of(comm) > 1:
            from . import distributed_checkpoint
            return distributed_checkpoint.load(path, comm=comm, num_shards=num_shards,
                                               partitioner=partitioner, device=device,
                                               max_hbm_bytes=max_hbm_bytes,
                                               max_capacity=max_capacity,
                                               evict_window=evict_window)
        from . import checkpoint
        return checkpoint.load(path, num_shards=num_shards, partitioner=partitioner,
                               device=device, max_hbm_bytes=max_hbm_bytes,
                               max_capacity=max_capacity, evict_window=evict_window)

    # ---- pickling --------------------------------------------------------------------
    def __reduce__(self):
        """Pickles (and ``copy.copy`` / ``copy.deepcopy`` copies) as its checkpoint
        (:func:`numbaemb.checkpoint.to_bytes`): an independent table with the same keys,
        columns, configuration, shards and device, and its partitioner (if that
        pickles) and limits.  A table split across MPI ranks raises a TypeError.

        >>> import pickle, numpy as np, numbaemb as ne
        >>> v = ne.Variable(dim=2); v.upsert(np.array([4]), np.ones((1, 2)))
        >>> pickle.loads(pickle.dumps(v)).lookup(np.array([4])).tolist()
        [[1.0, 1.0]]
        """
        from .checkpoint import to_bytes      # (a TypeError for a split table)
        return _unpickle, (to_bytes(self), self.partitioner, self.key_range, self.max_keys)


def _unpickle(data, partitioner, key_range, max_keys):
    from .checkpoint import from_bytes
    v = from_bytes(data, partitioner=partitioner)
    if key_range is not None:
        v.key_range = key_range
    if max_keys is not None:
        v.max_keys = max_keys
    return v


_REGISTRY = {}


def get_variable(name, dim, **kwargs) -> Variable:
    """The variable called ``name``, created on first use.

    A second call with the same configuration returns the same object; one with a
    clashing configuration raises ``ValueError``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    fresh = Variable(dim, name=name, **kwargs)
    old = _REGISTRY.get(name)
    if old is None:
        _REGISTRY[name] = fresh
        return fresh
    if old.config() != fresh.config():
        diff = {k: (v, fresh.config()[k]) for k, v in old.config().items() if fresh.config()[k] != v}
        raise ValueError(f"variable {name!r} already exists with another configuration: "
                         + ", ".join(f"{k}: existing {a!r}, requested {b!r}" for k, (a, b) in diff.items()))
    return old
