"""A shard on a CUDA device: :class:`numbaemb.shard.Shard` with its index, columns
and free list in device memory, driven by :mod:`jit_kernels.cuda_table`.

Same interface and bookkeeping as ``Shard``; keys, values and outputs are
Numba device arrays (a caller converts numpy / CuPy input first, see
:mod:`numbaemb._device`).  Importing this module needs no GPU; creating a
``CudaShard`` needs numba-cuda and a GPU (or the simulator).

Mutations reuse per-shard scratch buffers (:class:`jit_kernels.cuda_table.Scratch`,
safe because mutations run alone under the Variable's write lock): the
``rows`` / ``inserted`` arrays that ``find_or_insert`` and ``upsert`` return
are valid until the shard's next mutation.  Reads (``lookup``, ``find_rows``,
``export``) allocate their results and may run concurrently.

Hybrid mode (``max_hbm_bytes``): rows ``[0, hbm_rows)`` of every column live in
device memory and the rows after them in pinned host memory mapped into the
device's address space; the same kernels read and write both (see
:class:`jit_kernels.cuda_table.SplitRows`).  ``hbm_rows`` is the most rows
whose bytes (all columns, at creation) fit in ``max_hbm_bytes``; the hash
index always lives in device memory and is not counted, nor are the columns a
subclass names in ``_device_columns`` (a bounded shard's scores, read beside the
index).
"""
import numpy as np

from jit_kernels import cuda_table as k

from ._memory import kept_view
from .shard import MAX_LOAD, ROW_GROWTH, Column, IndexedRows, _index_capacity

# Lookups probe four slots a step (cuda_table.lookup(step=4)) from this share of full
# and deleted slots on: on an H100 (1M keys, dim 8 / 64) that read 0.95x / 0.99x the
# keys a second of one slot a step at load 0.5 and 1.35x / 1.16x at load 0.9.
X4_LOAD = 0.6


class CudaShard(IndexedRows):
    """Hash index plus row arena on one CUDA device.

    Example (needs a GPU or the simulator, so not a doctest)::

        s = CudaShard(dim=2, dtype=np.float32, init=(ZEROS, 0.0, 0.0, 0, np.zeros(2)))
        rows, new = s.find_or_insert(s.to_device(np.array([5, 5, -1])))
        s.size, int(new.copy_to_host().sum())    # (2, 2): one of the 5s inserts
    """

    _kernels = k
    _device_columns = ()     # columns kept whole in device memory in hybrid mode

    def __init__(self, dim, dtype, init, init_size=0, device=0, max_hbm_bytes=None):
        self.cuda = k.cuda_api()
        self.device = int(device)
        self.dim = dim
        self.dtype = np.dtype(dtype)
        self._init_size = int(init_size)
        self.max_hbm_bytes = None if max_hbm_bytes is None else int(max_hbm_bytes)
        with self.on():
            self._scratch = k.Scratch()
            self.columns = {"values": Column(None, self._device_init(init))}
            self._widths = {"values": (dim, self.dtype)}
            self._reset()

    def on(self):
        """Context manager making this shard's GPU current."""
        return self.cuda.gpus[self.device]

    def to_device(self, a):
        with self.on():
            return self.cuda.to_device(np.ascontiguousarray(a))

    def _device_init(self, init):
        kind, a, b, seed, const = init
        # a plain int, not a Kind: the CUDA kernels keep one build for every kind
        return (int(kind), a, b, seed, self.cuda.to_device(np.ascontiguousarray(const, np.float64)))

    # ---- storage --------------------------------------------------------------------
    def _hbm_rows(self):
        if self.max_hbm_bytes is None:
            return None
        per_row = sum(w * dt.itemsize for name, (w, dt) in self._widths.items()
                      if name not in self._device_columns)
        return max(1, self.max_hbm_bytes // per_row)

    def _new_column(self, n_rows, width, dtype, name="values"):
        """Storage for ``n_rows`` rows of column ``name``: a device array, or a SplitRows
        past the budget."""
        n_rows = max(1, n_rows)
        hbm = self._hbm_rows()
        if hbm is None or n_rows <= hbm or name in self._device_columns:
            return self.cuda.device_array((n_rows, width), dtype)
        tail = self.cuda.mapped_array((n_rows - hbm, width), dtype)
        return k.SplitRows(self.cuda.device_array((hbm, width), dtype), tail)

    @staticmethod
    def _copy_rows(dst, src, n):
        """dst[:n] = src[:n] for columns that are device arrays or SplitRows."""
        def parts(a):
            if isinstance(a, k.SplitRows):
                return [(0, a.split, a.head, False), (a.split, a.shape[0], a.tail, True)]
            return [(0, a.shape[0], a, False)]
        for s0, s1, sa, s_host in parts(src):
            for d0, d1, da, d_host in parts(dst):
                lo, hi = max(s0, d0), min(s1, d1, n)
                if lo >= hi:
                    continue
                piece, into = sa[lo - s0:hi - s0], da[lo - d0:hi - d0]
                if d_host and s_host:
                    into[...] = piece
                elif d_host:
                    piece.copy_to_host(into)
                else:
                    into.copy_to_device(piece)

    def _reset(self):
        cap = _index_capacity(self._init_size)
        self.slots = k.device_empty_slots(cap)
        self.n_full = 0
        self.n_deleted = 0
        self._free = self.cuda.device_array(max(16, self._init_size), np.int64)
        self.n_free = 0
        self.fresh = 0
        for name, col in self.columns.items():
            width, dtype = self._widths[name]
            col.data = self._new_column(self._init_size, width, dtype, name)

    @property
    def free_rows(self):
        free, n = self._free, self.n_free
        return kept_view(self, "_free_view", free, n, lambda: free[:n])

    def nbytes(self):
        """Bytes held by the index, columns (device and mapped host) and free list."""
        def size(a):
            return a.head.nbytes + a.tail.nbytes if isinstance(a, k.SplitRows) else a.nbytes
        return (self.slots.nbytes + self._free.nbytes
                + sum(size(c.data) for c in self.columns.values()))

    def add_column(self, name, width, dtype, init):
        """Add a row-aligned column; existing keys get their initial values."""
        if name in self.columns:
            raise ValueError(f"column {name!r} already exists")
        with self.on():
            self._widths[name] = (width, np.dtype(dtype))
            data = self._new_column(self.values.shape[0], width, dtype, name)
            col = self.columns[name] = Column(data, self._device_init(init))
            if not self.n_full:          # (no keys: no export, whose scans cost most in
                return                   # the simulator)
            keys, rows = self.export_rows()
            ones = k.filled(keys.shape[0], True, np.bool_)
            k.init_rows(data, rows, keys, ones, *col.init)

    # ---- capacity -------------------------------------------------------------------
    def _count_absent(self, keys):
        return k.find_rows(self.slots, self.mask, keys,
                           self._scratch.array("probe", keys.shape[0], np.int64), self._scratch)

    _empty_index = staticmethod(k.device_empty_slots)

    def _reserve_rows(self, n_new):
        need = self.fresh + max(0, n_new - self.n_free)
        have = self.values.shape[0]
        if need <= have:
            return
        new_cap = max(need, int(have * ROW_GROWTH) + 8)
        for name, col in self.columns.items():
            width, dtype = self._widths[name]
            data = self._new_column(new_cap, width, dtype, name)
            self._copy_rows(data, col.data, self.fresh)
            col.data = data

    def _take_rows(self, handed_out):
        """Account for ``handed_out`` rows taken by a kernel (free list first)."""
        from_free = min(handed_out, self.n_free)
        self.n_free -= from_free
        self.fresh += handed_out - from_free
        self.n_full += handed_out

    def _new(self, n, dtype):
        a = self.cuda.device_array(max(n, 1), dtype)
        return a if n else a[:0]

    def _insert(self, keys, then=None):
        """Rows of ``keys``, inserting absent ones (columns not yet initialised);
        ``then(rows, inserted)`` is queued behind the insert (see ``insert_rows``)."""
        self._reserve(keys)
        n = keys.shape[0]
        rows = self._scratch.array("rows", n, np.int64)
        inserted = self._scratch.array("inserted", n, np.bool_)
        handed = k.insert_rows(self.slots, self.mask, keys, rows, inserted, self._free,
                               self.n_free, self.fresh, self._scratch,
                               then and (lambda: then(rows, inserted)))
        self._take_rows(handed)
        return rows, inserted

    # ---- operations -------------------------------------------------------------------
    def lookup(self, keys, out, exists):
        """out[i] = value of keys[i] or its initial value; exists[i] says which."""
        with self.on():
            step = 4 if self.n_full + self.n_deleted >= X4_LOAD * self.capacity else 1
            k.lookup(self.slots, self.mask, keys, self.values, out, exists,
                     *self.columns["values"].init, step=step)

    def find_rows(self, keys):
        with self.on():
            rows = self._new(keys.shape[0], np.int64)
            k.find_rows(self.slots, self.mask, keys, rows)
            return rows

    def read_rows(self, column, keys):
        """As ``Shard.read_rows``: the found rows gathered on the device, then copied."""
        with self.on():
            rows = self.find_rows(keys).copy_to_host()
            found = rows >= 0
            data = self.columns[column].data
            out = self.cuda.device_array((int(found.sum()), data.shape[1]), data.dtype)
            if out.shape[0]:
                k.gather(data, self.to_device(rows[found]), out)
            return found, out.copy_to_host()

    def find_or_insert(self, keys, out=None):
        """See :meth:`numbaemb.shard.IndexedRows.find_or_insert` (``out`` a device array).

        With ``out`` the values are filled by launches queued behind the insert,
        before the host waits for the insert's row count.
        """
        with self.on():
            return super().find_or_insert(keys, out)

    def upsert(self, keys, values, **kw):
        """Assign ``values`` (n, dim); for a repeated key the last one wins.  (``kw``: a
        bounded shard's insert arguments; a key it does not admit has row -1, which
        ``assign_rows`` passes by.)"""
        with self.on():
            rows, inserted = self._insert(keys, **kw)
            self._init_new(rows, keys, inserted, skip=("values",))
            k.assign_rows(self.values, rows, values, scratch=self._scratch)
            return rows

    def accum(self, keys, old, new, exists):
        """TFRA accum: see :func:`jit_kernels.cpu_table.accum_groups`."""
        n = keys.shape[0]
        if not n:
            return
        with self.on():
            sc = self._scratch
            order, starts = k.group_keys(keys, sc)
            n_absent = n - k.count_true(exists, sc)
            self._reserve_rows(n_absent)
            if self.n_full + self.n_deleted + n_absent > MAX_LOAD * self.capacity:
                self._rehash(self.n_full + n_absent)
            rows = sc.array("rows", n, np.int64)
            inserted = sc.array("inserted", n, np.bool_)
            alloc, c0 = sc.counter("alloc")       # see cuda_table.insert_rows
            k.accum_groups(self.slots, self.mask, keys, order, starts, self.values, old, new,
                           exists, rows, inserted, alloc, self._free, self.n_free + c0,
                           self.fresh)
            self._take_rows(sc.read("alloc"))
            self._init_new(rows, keys, inserted, skip=("values",))

    def remove(self, keys):
        """Remove present keys (absent ones are ignored); returns how many were removed."""
        n = keys.shape[0]
        if not n:
            return 0
        with self.on():
            freed = self._scratch.array("freed", n, np.int64)
            tombs = self._erase_keys(keys, freed)
            self._free_room(n)
            m = k.compact_nonneg(freed, self._free, self.n_free)
            if m > 1:       # in row order, as on the CPU (the erase's credit is a race)
                part = self._free[self.n_free:self.n_free + m]
                part.copy_to_device(np.sort(part.copy_to_host()))
            self.n_free += m
            self.n_full -= m
            self.n_deleted += m if tombs else 0
            return m

    def _free_room(self, n):
        """Room for ``n`` more rows in the free list."""
        if self.n_free + n > self._free.shape[0]:
            grown = self.cuda.device_array(max(self.n_free + n, 2 * self._free.shape[0]),
                                           np.int64)
            if self.n_free:
                grown[:self.n_free].copy_to_device(self._free[:self.n_free])
            self._free = grown

    def _release_rows(self, rows):
        """Rows ``rows`` (host int64) join the free list."""
        self._free_room(rows.shape[0])
        if rows.shape[0]:
            self._free[self.n_free:self.n_free + rows.shape[0]].copy_to_device(
                np.ascontiguousarray(rows, np.int64))
        self.n_free += rows.shape[0]

    def export_rows(self):
        """(keys, rows) of every key, in slot order."""
        with self.on():
            return k.export_slots(self.slots)

    def export(self, column="values"):
        with self.on():
            keys, rows = self.export_rows()
            data = self.columns[column].data
            out = self.cuda.device_array((keys.shape[0], data.shape[1]), data.dtype)
            k.gather(data, rows, out)
            return keys, out

    def clear(self):
        with self.on():
            self._reset()
