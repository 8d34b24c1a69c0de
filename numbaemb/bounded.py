"""Bounded shards: at most ``limit`` keys, the lowest-scored key of a bucket or window evicted.

``Variable(dim, max_capacity=N, evict="lru")`` builds one :class:`BoundedShard`
(see :mod:`jit_kernels.bounded` for the scores and the eviction rule).  Its index is
bucketed by default (:mod:`jit_kernels.buckets`, HierarchicalKV's layout): a key's
window is its bucket of 32 slots, a full bucket evicts even while the table has
room, a call runs the kernels of :mod:`jit_kernels.bucket_bounded` (a stretch of
buckets a thread) and lookups those of :mod:`jit_kernels.bucket_reads` (on a GPU:
:mod:`jit_kernels.cuda_buckets`, the same bodies).  With ``evict_window=W`` (an int)
the index is linear and a new key of a full table looks at W slots from its home
(:mod:`jit_kernels.bounded`): serial, or in ranges of the index when the call has
``RANGES_MIN`` keys and the table is full or cannot fill in the call; its evicting
inserts are about 1.6x as slow on the CPU.  Every inserting call (``find_or_insert``,
``upsert``, optimizer steps) runs these kernels; lookups neither insert nor touch
scores.  A key that is not admitted gets no row: ``find_or_insert`` returns its
initial values and reports it absent, ``upsert`` drops its value, an optimizer step
drops its gradient.  An evicted key leaves with every column (optimizer slots too),
and its row is reused; the evicted keys and their values of the last call are kept
in ``last_evicted`` (``find_or_insert(..., return_evicted=True)`` returns them).

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=1, max_capacity=2, evict="lru")
>>> v.upsert(np.array([1, 2]), np.array([[1.0], [2.0]]))
>>> v.upsert(np.array([3]), np.array([[3.0]]))           # full: the least recent key goes
>>> sorted(v.export()[0].tolist())
[2, 3]
"""
import warnings
from types import SimpleNamespace

import numba
import numpy as np

from jit_kernels import bounded as kb
from jit_kernels import bounded_accum as ka
from jit_kernels import bucket_bounded as bb
from jit_kernels import bucket_reads as br
from jit_kernels.buckets import (BUCKET, bucket_capacity, empty_buckets, place_all,
                                 place_by_score)
from jit_kernels.initializers import ZEROS

from . import _checks
from ._arena import index_empty
from ._memory import kept_view
from .shard import Shard, _index_capacity

__all__ = ["BoundedShard", "BoundedRows", "POLICIES", "check_bounds"]

POLICIES = tuple(kb.POLICIES)
SCORE = "score"          # the row-aligned score column (checkpointed with the rest)
BUCKETS = "bucket"       # evict_window of a bucketed index (jit_kernels.bucket_bounded)


def stretches_for():
    """Stretches of buckets a bucketed call is cut into: one a thread (the result does
    not depend on it; 1: the serial pass)."""
    return numba.get_num_threads()


# a bucketed index's kernels on the CPU (jit_kernels.cuda_buckets on a GPU: the same names)
CPU_BUCKETS = SimpleNamespace(
    bucket_insert=bb.bucket_insert, bucket_insert_ranges=bb.bucket_insert_ranges,
    find_rows=br.find_rows, lookup=br.lookup, erase_keys=br.erase_keys, place_all=place_all,
    empty_buckets=lambda cap: empty_buckets(cap, index_empty),
    stretches_for=lambda cap: stretches_for())


def highest_first(scores):
    """Positions of the int64 ``scores``, the highest first, equal ones in their order
    (``~``: descending with no overflow, where ``-`` keeps INT64_MIN as it is).

    >>> highest_first(np.array([3, -2**63, 7, 3])).tolist()
    [2, 0, 3, 1]
    """
    return np.argsort(~np.asarray(scores, np.int64).reshape(-1), kind="stable")


class BoundedRows:
    """A bounded shard's work, on the CPU (:class:`BoundedShard`) or a GPU
    (:class:`numbaemb.cuda_bounded.CudaBoundedShard`): the kernels come from ``_bk``
    (:mod:`jit_kernels.bounded` or :mod:`jit_kernels.cuda_bounded`, the same names and
    results; a bucketed index's from ``_buckets``), arrays from the shard's ``_new`` /
    ``_full`` / ``_copy`` / ``_take`` / ``_host``."""

    _bk = kb
    _buckets = CPU_BUCKETS

    def _bounds(self, limit, policy, window):
        self.limit = int(limit)
        self.policy = kb.POLICIES[policy]
        self.bucketed = window == BUCKETS     # a key's window: its bucket of 32 slots
        self.window = BUCKET if self.bucketed else int(window)
        self._batch = 0
        self._top = -1                # no key scores above this (LRU: see _hold)
        self.last_evicted = (np.empty(0, np.int64), {})
        self.keep_evicted = False     # gather every call's evicted columns (tests, spilling)

    @property
    def capacity(self):
        """Slots in the index (a bucketed one has its digests after them)."""
        return bucket_capacity(self.slots) if self.bucketed else self.slots.shape[0] // 2

    @property
    def mask(self):
        return self.capacity - 1

    def _reset(self):
        super()._reset()
        # a fixed index at load <= 1/2 when full: room for the tombstones of removals
        # (evictions leave none) between rehashes; a bucketed one has the same slots
        cap = _index_capacity(1.5 * self.limit)
        self.slots = self._buckets.empty_buckets(max(cap, BUCKET)) if self.bucketed \
            else self._empty_index(cap)
        # per slot: a copy of its key's score (MAX: free, or a key of the running call)
        # and the number of the last call that touched it (see jit_kernels.bounded)
        self.mscore = self._full(self.capacity, kb.MAX, np.int64)
        self.mark = self._full(self.capacity, 0, kb.MARK)
        self._overflow, self.n_overflow = [], 0     # a load's keys whose bucket was full

    def nbytes(self):
        """Bytes held: the shard's, and the score copies and call marks beside the index."""
        return super().nbytes() + self.mscore.nbytes + self.mark.nbytes

    def _reserve_rows(self, n_new):
        super()._reserve_rows(min(n_new, max(0, self.limit - self.n_full)))

    def _place(self, pairs, slots):
        """Keys placed serially in slot order: the same layout whatever the threads do,
        so evictions (which depend on the keys' neighbours in the index) are
        reproducible, after a rehash or a checkpoint load, on the CPU or a GPU.  In a
        bucketed index a key whose bucket is full waits, with its row, for
        :meth:`_settle_overflow` (keys saved from another layout: resharded)."""
        if not self.bucketed:
            self._bk.rehash_serial(pairs, slots, slots.shape[0] // 2 - 1)
            return
        over = np.empty(pairs.shape[0], np.int64)
        m = self._buckets.place_all(pairs, slots, bucket_capacity(slots) - 1, over)
        if m:       # (their rows are filled in too; _loaded places them by score)
            self._overflow.append(over[:2 * m].copy())
            self.n_overflow += m

    def _settle_overflow(self):
        """The loaded keys whose bucket was full (:meth:`_place`), now that their scores
        are in: each displaces the lowest-scored key of its bucket when it scores
        higher, as an insert evicts; the keys left out (as many) are dropped, with a
        warning, and their rows freed."""
        over, m = np.concatenate(self._overflow), self.n_overflow
        self._overflow, self.n_overflow = [], 0
        if np.unique(over[0::2]).shape[0] != m:
            raise ValueError("the loaded keys hold duplicates")
        slots, freed, dropped = self._host(self.slots), np.empty(m, np.int64), \
            np.empty(m, np.int64)
        place_by_score(over, slots, self.mask, self._host(self._scores()), freed, dropped)
        if slots is not self.slots:
            self._copy(self.slots, slots)
        self._release_rows(freed)
        self.n_full -= m
        warnings.warn(f"{m} loaded keys did not fit the bounded table's bucketed index "
                      f"(max_capacity={self.limit}: a bucket holds {BUCKET} keys and these "
                      f"were saved from another layout); the lowest-scored key of each full "
                      f"bucket was dropped, as an insert evicts (first dropped keys: "
                      f"{dropped[:5].tolist()})", stacklevel=4)

    def _rehash(self, n_keys):
        """Clear the tombstones (the index keeps its size: it was made for ``limit``);
        a bucketed index has none."""
        if self.bucketed:
            return
        self.slots = self._rehashed(self.capacity)
        self.n_deleted = 0
        self._loaded()

    def _loaded(self):
        """Rebuild ``mscore`` / ``mark`` from the index and the score column (after a
        rehash or a checkpoint load wrote them; a load's keys whose bucket was full are
        placed by score first)."""
        if self._overflow:
            self._settle_overflow()
        if SCORE in self.columns:
            self._bk.sync_meta(self.slots, self._scores(), self.mscore, self.mark)
            self._top = self._max_score()

    def _hold(self, clock):
        """What ``mscore`` holds for the keys of a call with this clock (see
        :mod:`jit_kernels.bounded`): an LRU call's clock when no key scores as high
        (then the copies need no restoring after the call), else ``MAX``."""
        if self.policy != kb.LRU:
            return kb.MAX
        hold = kb.MAX if clock <= self._top else np.int64(clock)
        self._top = max(self._top, int(clock))
        return hold

    def _driver_kw(self):
        """Keyword arguments of the insert drivers (the GPU's: their scratch)."""
        return {}

    def _work(self, name, n, dtype):
        """A work array of the running call (the GPU's: a buffer reused call to call)."""
        return self._new(n, dtype)

    def _zeros(self, n):
        """``n`` zero scores (read only: the calls that bring no scores), kept."""
        z = getattr(self, "_zero_scores", None)
        if z is None or z.shape[0] < n:
            z = self._zero_scores = self._full(max(16, n + n // 4), 0, np.int64)
        return kept_view(self, "_zeros_view", z, n, lambda: z[:n])

    def _scores(self):
        """The score column as a 1-D view (kept while the column is the same array)."""
        data = self.columns[SCORE].data
        return kept_view(self, "_scores_view", data, 0, lambda: data[:, 0])

    def _max_score(self):
        """The highest score of any row (free rows too), -1 for none."""
        scores = self._host(self._scores())
        return int(scores.max()) if scores.shape[0] else -1

    def _insert(self, keys, then=None, scores=None, epoch=0, clock=0, evicted=False,
                present=None):
        """Rows of ``keys`` (-1: not admitted), inserting or evicting; chunks keep the
        index's tombstones bounded between rehashes.  ``last_evicted`` gets the evicted
        keys, and with ``evicted`` (or ``keep_evicted``) their columns, gathered before
        their rows are reused; ``present`` (n,) bool, if given, which keys were in the
        table when the call started."""
        bk, n = self._bk, keys.shape[0]
        rows, where = self._new(n, np.int64), self._work("where", n, np.int64)
        inserted = self._new(n, np.bool_)
        given = self._zeros(n) if scores is None else scores
        ev_keys, ev_rows = self._new(n, np.int64), self._new(n, np.int64)
        if self._batch >= kb.MARK_CALLS:        # one byte a mark: clear them, count anew
            self.mark = self._full(self.capacity, 0, kb.MARK)
            self._batch = 0
        self._batch += 1
        hold = self._hold(clock)
        if self.bucketed:
            n_ev = self._bucket_calls(keys, given, scores is None, epoch, clock, hold, rows,
                                      where, inserted, present, ev_keys, ev_rows)
        else:
            bk.find_present(self.slots, self.mask, keys, rows, where, self.mscore,
                            self.mark, self._batch, hold)
            if present is not None:
                self._present(rows, present)
            n_ev = self._window_calls(keys, given, scores is None, epoch, clock, hold, rows,
                                      where, inserted, ev_keys, ev_rows)
            if hold == kb.MAX:
                bk.restore_scores(self.slots, self.mask, keys, where, self._scores(),
                                  self.mscore)
        ev_keys, ev_rows = ev_keys[:n_ev], ev_rows[:n_ev]
        # hand out the evicted keys' columns before their rows are initialised again
        cols = {name: self._take(col.data, ev_rows) for name, col in self.columns.items()} \
            if evicted or self.keep_evicted else {}
        self.last_evicted = (ev_keys, cols)
        if then is not None:
            then(rows, inserted)
        return rows, inserted

    def _window_calls(self, keys, given, keep, epoch, clock, hold, rows, where, inserted,
                      ev_keys, ev_rows):
        """:meth:`_insert`'s kernels on a linear index, in chunks that keep its
        tombstones bounded between rehashes; returns how many keys were evicted."""
        bk, n, kw = self._bk, keys.shape[0], self._driver_kw()
        n_ev = 0
        step = max(1, self.capacity // 4)
        part = (lambda a, lo, hi: a) if n <= step else (lambda a, lo, hi: a[lo:hi])
        window = min(self.window, self.capacity)    # (wider: the same slots again)
        ranges = kb.ranges_for(self.capacity, window)   # (the index keeps its size)
        for lo in range(0, n, step):        # (one chunk: no slices, ~25 us each on a GPU)
            k = part(keys, lo, lo + step)
            if self.n_full + self.n_deleted + k.shape[0] > 0.75 * self.capacity:
                self._rehash(self.n_full)      # clears the tombstones (and the call marks:
                r2 = self._new(n, np.int64)    # mark again; earlier positions' slots moved)
                bk.find_present(self.slots, self.mask, keys, r2, where, self.mscore,
                                self.mark, self._batch, hold)
                self._copy(rows[lo:], r2[lo:])
            self._reserve_rows(k.shape[0])      # (may move the columns)
            r = part(rows, lo, lo + step)
            call = (self.slots, self.mask, k, part(given, lo, lo + step), self._scores(),
                    self.mscore, self.mark, self._batch, hold, r, part(where, lo, lo + step),
                    part(inserted, lo, lo + step))
            wide = k.shape[0] >= kb.RANGES_MIN and ranges > 1
            if wide and self.n_full < self.limit:    # a fill: the call cannot fill the table
                wide = self.n_full + bk.absent_count(r) <= self.limit
            free = self.free_rows
            rest = (free, free.shape[0], self.fresh, self.n_full)
            evs = (ev_keys, ev_rows) if n_ev == 0 else (ev_keys[n_ev:], ev_rows[n_ev:])
            if wide:                # ranges of the index on all threads
                taken, ev, made, size = bk.bounded_insert_ranges(
                    *call, *rest, ranges, self.limit, window, self.policy, epoch,
                    clock, keep, *evs, self._work("deferred", k.shape[0], np.int64),
                    **kw)
            else:
                taken, ev, made, size = bk.bounded_insert(
                    *call, *rest, self.limit, window, self.policy, epoch, clock,
                    keep, *evs, **kw)
            self._take_rows(taken)
            self.n_full = size
            self.n_deleted += made
            n_ev += ev
        return n_ev

    def _bucket_calls(self, keys, given, keep, epoch, clock, hold, rows, where, inserted,
                      present, ev_keys, ev_rows):
        """:meth:`_insert`'s kernels on a bucketed index (:mod:`jit_kernels.bucket_bounded`):
        into a full table or one the call cannot fill, a stretch of buckets a thread
        (the find, the inserts and the scores put back in one kernel), else
        ``find_present``, the serial pass and ``restore_scores``; returns how many keys
        were evicted."""
        bk, ops, n = self._bk, self._buckets, keys.shape[0]
        self._reserve_rows(n)                   # (may move the columns)
        stretches = ops.stretches_for(self.capacity)    # (the result does not depend on it)
        wide = n >= kb.RANGES_MIN and stretches > 1
        if not wide or self.n_full < self.limit:    # (a full table: no count needed)
            bk.find_present(self.slots, self.mask, keys, rows, where, self.mscore,
                            self.mark, self._batch, hold)
            # a fill in stretches: the call cannot fill the table
            wide = wide and self.n_full + bk.absent_count(rows) <= self.limit
        head = (self.slots, self.mask, keys, given, self._scores(), self.mscore, self.mark,
                self._batch, hold, rows, where, inserted)
        rest = (self.free_rows, self.free_rows.shape[0], self.fresh, self.n_full)
        tail = (self.limit, self.policy, epoch, clock, keep, ev_keys, ev_rows)
        kw = self._driver_kw()
        if wide:
            out = self._work("present", n, np.bool_) if present is None else present
            taken, n_ev, size = ops.bucket_insert_ranges(*head, out, *rest, stretches, *tail,
                                                         **kw)
        else:
            if present is not None:
                self._present(rows, present)
            taken, n_ev, size = ops.bucket_insert(*head, *rest, *tail, **kw)
            if hold == kb.MAX:
                bk.restore_scores(self.slots, self.mask, keys, where, self._scores(),
                                  self.mscore)
        self._take_rows(taken)
        self.n_full = size
        return n_ev

    def remove(self, keys):
        self._bk.forget(self.slots, self.mask, keys, self.mscore)
        return super().remove(keys)

    def _erase_keys(self, keys, freed):
        if not self.bucketed:
            return super()._erase_keys(keys, freed)
        self._buckets.erase_keys(self.slots, self.mask, keys, freed)
        return False                        # (frees the slots: no tombstones)

    # ---- reads of a bucketed index: jit_kernels.bucket_reads' kernels ----------------
    def lookup(self, keys, out, exists):
        if not self.bucketed:
            return super().lookup(keys, out, exists)
        self._buckets.lookup(self.slots, self.mask, keys, self.values, out, exists,
                             *self.columns["values"].init)

    def find_rows(self, keys):
        if not self.bucketed:
            return super().find_rows(keys)
        rows = self._new(keys.shape[0], np.int64)
        self._buckets.find_rows(self.slots, self.mask, keys, rows)
        return rows

    def _count_absent(self, keys):
        if not self.bucketed:
            return super()._count_absent(keys)
        return self._buckets.find_rows(self.slots, self.mask, keys,
                                       self._work("probe", keys.shape[0], np.int64))

    def _init_new(self, rows, keys, inserted, skip=()):
        """(Rows -1, keys not admitted, are not inserted: the kernels pass them by.)"""
        super()._init_new(rows, keys, inserted, skip=(SCORE, *skip))

    def find_or_insert(self, keys, out=None, **kw):
        if out is None:
            rows, inserted = self._insert(keys, **kw)
            self._init_new(rows, keys, inserted)
            return rows, inserted
        present = self._work("present", keys.shape[0], np.bool_)
        rows, inserted = self._insert(keys, present=present, **kw)
        # new rows' values and the output in one pass (not admitted: initial values)
        self._bk.init_copy(self.values, rows, keys, inserted, present, out,
                           *self.columns["values"].init)
        self._init_new(rows, keys, inserted, skip=("values",))
        return rows, inserted


class BoundedShard(BoundedRows, Shard):
    """A :class:`numbaemb.shard.Shard` that never holds more than ``limit`` keys."""

    def __init__(self, dim, dtype, init, limit, policy, window, init_size=0):
        self._bounds(limit, policy, window)
        super().__init__(dim, dtype, init, min(int(init_size), self.limit))
        self.add_column(SCORE, 1, np.int64, (ZEROS, 0.0, 0.0, 0, np.zeros(1)))

    # ---- arrays on the host (BoundedRows' hooks) --------------------------------------
    _new = staticmethod(np.empty)

    @staticmethod
    def _full(n, value, dtype):
        """``np.full``; the score copies and call marks of a large index in big pages
        (:func:`numbaemb._arena.index_empty`)."""
        out = index_empty(n, dtype)
        out[...] = value
        return out
    _present = staticmethod(lambda rows, out: np.greater_equal(rows, 0, out=out))
    _host = staticmethod(lambda a: a)

    @staticmethod
    def _copy(dst, src):
        dst[...] = src

    def _take(self, data, rows):
        """A new array of rows ``rows`` of the 2-D column ``data``, gathered on all
        threads with the rows requested ahead (numpy's ``data[rows]`` took 3x as long
        for 100k evicted rows of 64 float32)."""
        out = np.empty((rows.shape[0], data.shape[1]), data.dtype)
        self._kernels.gather(data, rows, out)
        return out

    def upsert(self, keys, values, **kw):
        rows, inserted = self._insert(keys, **kw)
        self._init_new(rows, keys, inserted, skip=("values",))
        ok = rows >= 0
        if not ok.all():
            rows, values = rows[ok], values[ok]
        self._kernels.assign_rows(self.values, rows, values, numba.get_num_threads())
        return rows

    def accum(self, keys, old, new, exists, **kw):
        """TFRA accum (see :func:`jit_kernels.cpu_table.accum_groups`) with bounded
        inserts: each key is found or inserted once, at its first position that does
        something (scores touched, evictions as an insert's, in batch order); a key not
        admitted does nothing at any of its positions (a sequential loop would try it
        again at its next absent, not-``exists`` position)."""
        order = np.argsort(keys, kind="stable")
        starts = self._kernels.group_starts(keys[order])
        present = self.find_rows(keys) >= 0
        touch = np.empty(starts.shape[0] - 1, np.int64)
        ka.accum_plan(order, starts, present, exists, touch)
        acts = touch >= 0
        pos = np.sort(touch[acts])               # the acting positions, in batch order
        rows, inserted = self._insert(keys[pos], **kw)     # kw: the clock, epoch (no scores)
        self._init_new(rows, keys[pos], inserted, skip=("values",))
        touch_rows = np.full(touch.shape[0], -1, np.int64)
        touch_rows[acts] = rows[np.searchsorted(pos, touch[acts])]
        ka.accum_apply(order, starts, touch, touch_rows, present, self.values, old, new, exists,
                       np.empty(keys.shape[0], np.int64), np.empty(keys.shape[0], np.bool_))


EVICT_WINDOW = "bucket"     # where a new key of a bounded table looks for its victim: its
# bucket of 32 slots (HierarchicalKV's layout); an int: that many slots of a linear index
MAX_CAPACITY = 1 << 48      # the largest bound (its index is allocated up front)


def check_bounds(max_capacity, evict, window, num_shards):
    """Checked ``(max_capacity, evict, window)`` of a bounded table (None, ... if not)."""
    if evict not in POLICIES:
        raise ValueError(f"evict must be one of {list(POLICIES)}, got {evict!r}")
    if not (isinstance(window, str) and window == BUCKETS):
        if isinstance(window, str):
            raise ValueError(f"evict_window must be a positive int or {BUCKETS!r}, "
                             f"got {window!r}")
        window = _checks.positive_int(window, "evict_window")
    if max_capacity is None:
        if evict != "lru" or window != EVICT_WINDOW:
            raise ValueError(f"evict={evict!r} and evict_window={window} need max_capacity "
                             f"(a table without max_capacity grows and never evicts)")
        return None, evict, window
    max_capacity = _checks.positive_int(max_capacity, "max_capacity")
    if max_capacity > MAX_CAPACITY:
        raise ValueError(f"max_capacity must be <= 2**48 (a bounded table's index is made "
                         f"for it up front, 50-100 bytes a key), got {max_capacity}")
    if num_shards != 1:
        raise ValueError(f"a bounded table (max_capacity) has one shard (its kernels run in "
                         f"parallel within it), got num_shards={num_shards}")
    return max_capacity, evict, window
