"""One shard: a hash index ``key -> row`` plus row-aligned columns.

Columns are 2-D arrays ``(row_capacity, width)`` that share row numbers: the
embedding (``"values"``) and whatever else belongs to a key (optimizer slots,
policy scores).  One probe finds every column of a key.  The index grows by
rehashing keys and row numbers only; rows never move.  Removed rows go to a
free list and are handed out again before fresh ones.

Columns are row arenas (:mod:`numbaemb._arena`): growing one is a longer view
of reserved address space, and its next pages are populated in the background
before rows land there.

A shard does no locking and no argument checking: :class:`numbaemb.Variable`
does both.  Keys reaching a shard are flat, C-contiguous int64.
"""
import numba
import numpy as np

from jit_kernels import cpu_table as k
from jit_kernels import initializers as _ki
from jit_kernels.slots import empty_slots

from ._arena import Column, arena_empty, arena_grow, index_empty, populate, prefault

MAX_LOAD = 0.75      # grow when full + tombstone slots would pass this fraction
MIN_CAPACITY = 16
ROW_GROWTH = 1.25    # row arena grows by this factor (memory matters more than copies)


def _pow2_at_least(n):
    return 1 << max(int(n) - 1, 0).bit_length()


def _index_capacity(n_keys):
    return max(MIN_CAPACITY, _pow2_at_least(int(np.ceil(n_keys / MAX_LOAD))))


class IndexedRows:
    """What every shard (CPU or CUDA) derives from its index and columns."""

    @property
    def mask(self):
        return self.slots.shape[0] // 2 - 1

    @property
    def capacity(self):
        """Slots in the hash index."""
        return self.slots.shape[0] // 2

    @property
    def size(self):
        return self.n_full

    @property
    def values(self):
        return self.columns["values"].data

    def _init_new(self, rows, keys, inserted, skip=()):
        """Initial values into every column (but ``skip``) of the rows just inserted."""
        if isinstance(inserted, np.ndarray) and not inserted.any():
            return                   # (a step on known ids: no kernel launch per column)
        for name, col in self.columns.items():
            if name not in skip:
                self._kernels.init_rows(col.data, rows, keys, inserted, *col.init)

    def find_or_insert(self, keys, out=None):
        """Rows of ``keys``; absent keys are inserted with initial values in every column.

        With ``out`` (shape ``(n, dim)``) the values of the rows are also copied
        there, in the same pass that initialises the new ones (cheaper than a
        separate gather: new rows are copied while in cache).  Shapes: ``keys``
        (n,) int64, ``rows`` (n,) int64, ``inserted`` (n,) bool.

        >>> from jit_kernels.initializers import CONSTANT
        >>> s = Shard(dim=2, dtype=np.float32, init=(CONSTANT, 0.0, 0.0, 0, np.array([1.5, 2.5])))
        >>> out = np.empty((3, 2), np.float32)
        >>> rows, new = s.find_or_insert(np.array([4, 4, 9]), out=out)
        >>> out.tolist(), int(new.sum()), bool(rows[0] == rows[1])   # one of the 4s inserts
        ([[1.5, 2.5], [1.5, 2.5], [1.5, 2.5]], 2, True)
        """
        if out is None:
            rows, inserted = self._insert(keys)
            self._init_new(rows, keys, inserted)
            return rows, inserted
        k, init = self._kernels, self.columns["values"].init
        fresh_start = self.fresh if self.free_rows.shape[0] == 0 else None

        def fill(rows, inserted):   # runs right after the insert (see _insert)
            if fresh_start is None:     # rows came from the free list: no fused pass
                k.init_rows(self.values, rows, keys, inserted, *init)
                k.gather(self.values, rows, out)
            else:
                k.init_gather(self.values, rows, keys, inserted, fresh_start, out, *init)

        rows, inserted = self._insert(keys, then=fill)
        self._init_new(rows, keys, inserted, skip=("values",))
        return rows, inserted

    # ---- capacity (shared; subclasses provide _count_absent, _empty_index, _reserve_rows) ----
    def _place(self, pairs, slots):
        """Insert the ``(key, row)`` pairs of ``pairs`` (an index or a flat pair array,
        in this shard's memory; empty slots skipped) into the index ``slots``: the rehash
        kernel (a bounded shard places them serially, see :mod:`numbaemb.bounded`)."""
        self._kernels.rehash(pairs, slots, slots.shape[0] // 2 - 1)

    def _erase_keys(self, keys, freed):
        """Free each present key's slot: ``freed[i]`` = the row ``keys[i]`` released, else
        -1.  Returns whether the freed slots became tombstones."""
        self._kernels.erase_keys(self.slots, self.mask, keys, freed)
        return True

    def _rehashed(self, cap):
        new = self._empty_index(cap)
        self._place(self.slots, new)
        return new

    def _reserve(self, keys):
        """Make room for every absent key of ``keys``; returns the bound used."""
        n_new = keys.shape[0]
        if self.n_full + self.n_deleted + n_new > MAX_LOAD * self.capacity:
            if self.n_full or self.n_deleted:    # (an empty index: every position is
                n_new = self._count_absent(keys)  # absent, no count, no compile of it)
            if self.n_full + self.n_deleted + n_new > MAX_LOAD * self.capacity:
                self._rehash(self.n_full + n_new)
        self._reserve_rows(n_new)
        return n_new

    def _rehash(self, n_keys):
        """Index with room for ``n_keys`` (at least double the old one when it grows)."""
        cap = _index_capacity(n_keys)
        if cap > self.capacity:
            cap = max(cap, 2 * self.capacity)
        # an index with no key and no tombstone: nothing to move (no kernel, no compile)
        empty = self.n_full == 0 and self.n_deleted == 0
        self.slots = self._empty_index(cap) if empty else self._rehashed(cap)
        self.n_deleted = 0


class Shard(IndexedRows):
    """Hash index plus row arena.

    >>> import numpy as np
    >>> from jit_kernels.initializers import ZEROS
    >>> s = Shard(dim=2, dtype=np.float32, init=(ZEROS, 0.0, 0.0, 0, np.zeros(2)))
    >>> rows, new = s.find_or_insert(np.array([5, 5, -1]))
    >>> int(s.size), new.tolist()[2], int(new[:2].sum())   # either 5 may be the inserter
    (2, True, 1)
    """

    _kernels = k

    def __init__(self, dim, dtype, init, init_size=0):
        self.dim = dim
        self.dtype = np.dtype(dtype)
        self._init_size = int(init_size)
        self.columns = {"values": Column(np.empty((0, dim), self.dtype), init)}
        self._reset()

    # ---- bookkeeping -------------------------------------------------------------
    def _reset(self):
        cap = _index_capacity(self._init_size)
        self.slots = self._empty_index(cap)
        self.n_full = 0
        self.n_deleted = 0
        self.free_rows = np.empty(0, np.int64)
        self.fresh = 0            # rows [0, fresh) have been handed out at least once
        for col in self.columns.values():
            col.data = arena_empty(self._init_size, col.data.shape[1], col.data.dtype)
            populate(col.data)    # rows asked for up front: fault their pages in now

    def nbytes(self):
        """Bytes held by the index, columns and free list."""
        return (self.slots.nbytes + self.free_rows.nbytes
                + sum(c.data.nbytes for c in self.columns.values()))

    def add_column(self, name, width, dtype, init):
        """Add a row-aligned column; existing keys get their initial values."""
        if name in self.columns:
            raise ValueError(f"column {name!r} already exists")
        data = arena_empty(self.values.shape[0], width, dtype)
        if self._init_size:
            populate(data)
        self.columns[name] = Column(data, init)
        if init[0] in (_ki.ZEROS, _ki.CONSTANT):     # optimizer slots: the same row for every
            data[:self.fresh] = 0 if init[0] == _ki.ZEROS else init[4][:width]   # key, so
            return                                     # no export of the keys, no keyed kernel
        keys, rows = self.export_rows()
        k.init_rows(data, rows, keys, np.ones(keys.shape[0], np.bool_), *init)

    # ---- capacity ----------------------------------------------------------------
    def _count_absent(self, keys):
        return k.find_rows(self.slots, self.mask, keys, np.empty(keys.shape[0], np.int64))

    @staticmethod
    def _empty_index(cap):
        """A fresh index of ``cap`` slots (in big pages: :func:`._arena.index_empty`)."""
        return empty_slots(cap, index_empty)

    def _reserve_rows(self, n_new):
        need = self.fresh + max(0, n_new - self.free_rows.shape[0])
        have = self.values.shape[0]
        if need > have:
            new_cap = max(need, int(have * ROW_GROWTH) + 8)
            for col in self.columns.values():
                arena_grow(col, self.fresh, new_cap)
        for col in self.columns.values():     # the next pages, off this thread
            prefault(col, need)

    def _take_rows(self, handed_out):
        """Account for ``handed_out`` rows taken by a kernel (free list first)."""
        n_free = self.free_rows.shape[0]
        from_free = min(handed_out, n_free)
        self.free_rows = self.free_rows[:n_free - from_free]
        self.fresh += handed_out - from_free
        self.n_full += handed_out

    def _insert(self, keys, then=None):
        """Rows of ``keys``, inserting absent ones (columns not yet initialised);
        ``then(rows, inserted)``, when given, runs right after the insert."""
        self._reserve(keys)
        rows, inserted = self._insert_reserved(keys)
        if then is not None:
            then(rows, inserted)
        return rows, inserted

    def _insert_reserved(self, keys):
        """``_insert`` once room was made (benchmarks time the probe alone)."""
        n = keys.shape[0]
        rows = np.empty(n, np.int64)
        inserted = np.empty(n, np.bool_)
        alloc = np.zeros(1, np.int64)
        k.find_or_insert_rows(self.slots, self.mask, keys, rows, inserted, alloc,
                              self.free_rows, self.free_rows.shape[0], self.fresh)
        self._take_rows(int(alloc[0]))
        return rows, inserted

    # ---- operations ----------------------------------------------------------------
    def lookup(self, keys, out, exists):
        """out[i] = value of keys[i] or its initial value; exists[i] says which."""
        k.lookup(self.slots, self.mask, keys, self.values, out, exists,
                 *self.columns["values"].init)

    def find_rows(self, keys):
        rows = np.empty(keys.shape[0], np.int64)
        k.find_rows(self.slots, self.mask, keys, rows)
        return rows

    def read_rows(self, column, keys):
        """``(found, rows)``: which of ``keys`` (n,) are present and a host copy of their
        rows of ``column`` (``found.sum()``, width), in key order."""
        rows = self.find_rows(keys)
        found = rows >= 0
        return found, self.columns[column].data[rows[found]]

    def find_or_insert_for_update(self, keys, values, valid, columns, **kw):
        """Rows of ``keys`` for an update that starts the new rows itself, in its own
        pass (:mod:`jit_kernels.optimizers`' ``fresh`` rows): returns ``(rows,
        inserted, w0)``.  Absent keys are inserted; their columns other than
        ``"values"`` and ``columns`` get initial values here; ``w0[i]`` is the
        weights a new row starts from: ``values[i]`` where ``valid[i]`` (e.g. the
        initial rows a lookup drew), else the key's initial value.  The caller writes
        the weights and ``columns`` of every inserted row before it releases the
        variable's lock.  Shapes: ``keys`` (n,), ``values`` (n, dim), ``valid`` (n,).

        >>> from jit_kernels.initializers import CONSTANT
        >>> s = Shard(dim=1, dtype=np.float32, init=(CONSTANT, 0.0, 0.0, 0, np.array([9.0])))
        >>> rows, new, w0 = s.find_or_insert_for_update(
        ...     np.array([1, 2]), np.array([[5.0], [6.0]], np.float32), np.array([True, False]), [])
        >>> new.tolist(), w0.ravel().tolist()
        ([True, True], [5.0, 9.0])
        """
        rows, inserted = self._insert(keys, **kw)       # kw: a bounded shard's
        self._init_new(rows, keys, inserted, skip=("values", *columns))
        draw = inserted & ~valid
        if draw.any():
            values = values.copy()
            k.init_rows(values, np.arange(keys.shape[0]), keys, draw,
                        *self.columns["values"].init)
        return rows, inserted, values

    def upsert(self, keys, values):
        """Assign ``values`` (n, dim); for a repeated key the last one wins."""
        rows, inserted = self._insert(keys)
        self._init_new(rows, keys, inserted, skip=("values",))
        k.assign_rows(self.values, rows, values, numba.get_num_threads())
        return rows

    def accum(self, keys, old, new, exists):
        """TFRA accum: see :func:`jit_kernels.cpu_table.accum_groups`."""
        order = np.argsort(keys, kind="stable")
        starts = k.group_starts(keys[order])
        n_absent = int(np.count_nonzero(~exists))
        self._reserve_rows(n_absent)
        if self.n_full + self.n_deleted + n_absent > MAX_LOAD * self.capacity:
            self._rehash(self.n_full + n_absent)
        n = keys.shape[0]
        rows = np.empty(n, np.int64)
        inserted = np.empty(n, np.bool_)
        alloc = np.zeros(1, np.int64)
        k.accum_groups(self.slots, self.mask, keys, order, starts, self.values, old, new,
                       exists, rows, inserted, alloc, self.free_rows,
                       self.free_rows.shape[0], self.fresh)
        self._take_rows(int(alloc[0]))
        self._init_new(rows, keys, inserted, skip=("values",))

    def remove(self, keys):
        """Remove present keys (absent ones are ignored); returns how many were removed."""
        freed = np.empty(keys.shape[0], np.int64)
        tombs = self._erase_keys(keys, freed)
        # in row order: which position of a repeated key frees its row is a race between
        # threads, the rows freed are not (the free list, and so later rows, are the same
        # whatever the threads, and on a GPU)
        freed = np.sort(freed[freed >= 0])
        self._release_rows(freed)
        self.n_full -= freed.shape[0]
        self.n_deleted += freed.shape[0] if tombs else 0
        return freed.shape[0]

    def _release_rows(self, rows):
        """Rows ``rows`` (host int64) join the free list."""
        self.free_rows = np.concatenate([self.free_rows, rows])

    def export_rows(self):
        """(keys, rows) of every key, in row order (columns are then read in order)."""
        return k.export_by_row(self.slots, self.fresh, 64)

    def export(self, column="values"):
        keys, rows = self.export_rows()
        data = self.columns[column].data
        out = np.empty((keys.shape[0], data.shape[1]), data.dtype)
        k.gather(data, rows, out)
        return keys, out

    def clear(self):
        self._reset()
