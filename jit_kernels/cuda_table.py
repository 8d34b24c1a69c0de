"""CUDA drivers for the hash-index kernels (host side): launch, scratch, results.

Mirrors :mod:`jit_kernels.cpu_table` one for one: same names, same arguments
(Numba device arrays where the CPU takes numpy arrays) and the same results.
The kernels (:mod:`jit_kernels.cuda_kernels`) call the very ``@njit`` bodies
of :mod:`jit_kernels.probing` and :mod:`jit_kernels.initializers`; their
atomics (:mod:`jit_kernels.atomics`) compile to NVPTX ``atom.*``.

Nothing here touches ``numba.cuda`` until a driver is first called, so
``import jit_kernels.cuda_table`` needs neither numba-cuda nor a GPU.

How the CPU's sequential semantics are kept on the GPU:

* ``assign_rows`` (last value wins for a repeated key): ``atomic.max`` elects
  the last batch position of each row in a row-indexed scratch array, and only
  that position writes.
* ``accum_groups``: :func:`group_keys` groups positions by key with a
  batch-local index (the same ``find_or_insert_key`` body), a counting sort
  and a per-group heapsort, so each group is replayed in batch order by one
  thread, as on the CPU.
* ``export_slots``: per-block counts, a host prefix sum, and a block-wide scan
  that writes each block's full slots in slot order.

Drivers that need temporaries take an optional :class:`Scratch` so that a
caller running many batches (a shard) does not allocate per call.

>>> import numpy as np
>>> launch_config(0)[0] >= 1, tile_width(64)
(True, 16)
"""
import os

import numpy as np

cuda = None          # numba.cuda, bound by _kernels() on first use (the simulator swaps it)
_K = None            # the compiled kernels (a namespace), built on first use

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
WAVES = 4            # grid-stride kernels launch at most this many full-occupancy waves
# Columns per lane in row kernels (tuned on an H100 with benchmarks/bench_cuda.py's
# tables: a lookup also probes, and more keys per warp hide more probe latency).
COLS_PER_LANE = 4          # gather, scatter, assign, init
COLS_PER_LANE_PROBING = 8  # lookup


# ---- launch configuration (the one place that decides blocks and threads) ----------
class _Launch:
    threads = 32 if SIMULATOR else 256   # simulator: one Python thread per CUDA thread
    max_blocks = 2 if SIMULATOR else None


def _max_blocks():
    if _Launch.max_blocks is None:
        dev = cuda.get_current_device()
        per_sm = max(1, dev.MAX_THREADS_PER_MULTIPROCESSOR // _Launch.threads)
        _Launch.max_blocks = dev.MULTIPROCESSOR_COUNT * per_sm * WAVES
    return _Launch.max_blocks


def launch_config(n, width=1):
    """``(blocks, threads)`` for a grid-stride launch over ``n`` items of ``width`` lanes."""
    threads = _Launch.threads
    want = max(1, -(-int(n) * int(width) // threads))
    if _Launch.max_blocks is None and (cuda is None or not cuda.is_available()):
        return want, threads    # not launching anywhere yet: no device to size the grid for
    return min(want, _max_blocks()), threads


def tile_width(dim, cols_per_lane=None):
    """Lanes that cooperate on one row of ``dim`` columns: a power of two <= 32 giving
    each lane about ``cols_per_lane`` (default ``COLS_PER_LANE``) columns."""
    cols = COLS_PER_LANE if cols_per_lane is None else cols_per_lane
    t = 1
    while t < 32 and t * cols < dim:
        t *= 2
    return t


# ---- lazy compilation ----------------------------------------------------------------
def _kernels():
    global cuda, _K
    if _K is None:
        # numba-cuda 0.30.4 registers an overload for np.row_stack, which NumPy 2.5
        # removed (it was an alias of vstack): restore the alias before compiling.
        if not hasattr(np, "row_stack"):
            np.row_stack = np.vstack
        try:
            from numba import cuda as _cuda
            from numba.cuda.core import config as _config   # absent from numba's legacy built-in CUDA
        except ImportError as e:
            raise ImportError("the CUDA drivers need numba-cuda (pip install numba-cuda)") from e

        from . import cuda_kernels
        # Small launches (counters, short batches) are deliberate here; numba-cuda's
        # low-occupancy warning would fire on each and costs ~0.1 ms per launch.
        # An explicit NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS setting is respected.
        if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
            _config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
        if not SIMULATOR and _cuda.is_available():
            cc = _cuda.get_current_device().compute_capability
            if tuple(cc) < (7, 0):   # the kernels' atomics use PTX acquire/release forms
                raise RuntimeError(f"CUDA tables need compute capability 7.0 or newer, "
                                   f"this GPU has {cc[0]}.{cc[1]}")
        cuda = _cuda
        _K = cuda_kernels.build(_Launch.threads)
    return _K


# ---- storage helpers -------------------------------------------------------------------
class SplitRows:
    """A column stored in two parts: rows ``[0, split)`` in ``head`` (device memory)
    and the rest in ``tail`` (e.g. pinned host memory mapped into the device's
    address space).  Drivers take it wherever they take a ``values`` array.
    """

    def __init__(self, head, tail):
        self.head, self.tail = head, tail

    @property
    def split(self):
        return self.head.shape[0]

    @property
    def shape(self):
        return (self.head.shape[0] + self.tail.shape[0], self.head.shape[1])

    @property
    def dtype(self):
        return self.head.dtype


class Scratch:
    """Device buffers and counters that drivers reuse from call to call.

    One per caller that runs drivers one at a time (a shard, under its write
    lock).  A buffer is valid until the next driver call given the same
    scratch.  Counters only ever grow (kernels add to them), so they need no
    reset between calls: :meth:`read` returns how much they grew.
    """

    def __init__(self):
        self._bufs = {}
        self._views = {}     # name -> the last view handed out (slicing costs ~25 us)
        self._counters = {}
        self.made = False    # whether the last array() call allocated

    def array(self, name, n, dtype):
        """A 1-D device array of ``n`` elements (uninitialised; ``made`` says whether
        this call allocated it, or it holds what the last user of ``name`` left)."""
        dtype = np.dtype(dtype)
        buf = self._bufs.get(name)
        self.made = buf is None or buf.shape[0] < n or buf.dtype != dtype
        if self.made:
            buf = cuda.device_array(max(16, n + n // 4), dtype)
            self._bufs[name] = buf
            self._views.pop(name, None)
        view = self._views.get(name)
        if view is None or view.shape[0] != n:
            view = self._views[name] = buf[:n]
        return view

    def whole(self, name):
        """The whole buffer behind :meth:`array`'s views of ``name``."""
        return self._bufs[name]

    def counter(self, name):
        """``(device int64[1], its value now)``."""
        if name not in self._counters:   # device counter, last value, pinned host copy
            self._counters[name] = [filled(1, 0, np.int64), 0, cuda.pinned_array(1, np.int64)]
        return tuple(self._counters[name][:2])

    def read(self, name):
        """How much counter ``name`` grew since the last read (waits for the GPU)."""
        c = self._counters[name]
        now = int(c[0].copy_to_host(c[2])[0])
        grew, c[1] = now - c[1], now
        return grew


def _split(values):
    """Kernel arguments ``(values, spill, split)`` for a column or a SplitRows."""
    if isinstance(values, SplitRows):
        return values.head, values.tail, values.split
    return values, values, values.shape[0]


def _go(kernel, n, *args, width=1):
    if n:
        blocks, threads = launch_config(n, width)
        kernel[blocks, threads](*args)


def _rows(kernel, n, dim, *args, cols_per_lane=None):
    """Launch a row kernel: ``tile_width(dim)`` lanes per item, log2 of it last."""
    t = tile_width(dim, cols_per_lane)
    _go(kernel, n, *args, t.bit_length() - 1, width=t)


def _chunks(n):
    """(blocks, chunk): split ``n`` items into per-block chunks (multiples of the block)."""
    threads = _Launch.threads
    blocks = max(1, min(_max_blocks(), -(-n // (threads * 4))))
    chunk = -(-n // blocks)
    chunk = -(-chunk // threads) * threads
    return -(-n // chunk) if n else 1, chunk


def _offsets(counts, scratch, name):
    """Host exclusive prefix sum of per-block counts: (device offsets in ``scratch``'s
    buffer ``name``, total)."""
    c = counts.copy_to_host()
    off = np.zeros(c.shape[0] + 1, np.int64)
    np.cumsum(c, out=off[1:])
    dev = scratch.array(name, off.shape[0], np.int64)
    dev.copy_to_device(off)
    return dev, int(off[-1])


def _counted(count_kernel, a, n, scratch, name):
    """A two-pass compaction's first pass: ``count_kernel(a, chunk, counts)`` writes each
    block's count of its chunk of ``n`` items to ``counts`` (``scratch``'s ``name +
    "_counts"``); returns ``(blocks, chunk, offsets, total)`` with the blocks' device
    offsets (``name + "_offsets"``, :func:`_offsets`) for the second pass."""
    blocks, chunk = _chunks(n)
    counts = scratch.array(name + "_counts", blocks, np.int64)
    count_kernel[blocks, _Launch.threads](a, chunk, counts)
    return (blocks, chunk) + _offsets(counts, scratch, name + "_offsets")


def cuda_api():
    """``numba.cuda`` (imported, with the NumPy shim applied, on first use)."""
    _kernels()
    return cuda


def filled(n, value, dtype, scratch=None, name=None):
    """A 1-D device array of ``n`` copies of ``value``: new, or ``scratch``'s buffer
    ``name`` when given."""
    _kernels()
    a = cuda.device_array(int(n), dtype) if scratch is None else \
        scratch.array(name, int(n), dtype)
    _go(_K.fill, a.shape[0], a, np.dtype(dtype).type(value))
    return a


def device_empty_slots(capacity, out=None):
    """A device index of ``capacity`` slots (a power of two), all EMPTY (in ``out``
    when given: a device int64 array of ``2 * capacity``)."""
    _kernels()
    if capacity < 1 or capacity & (capacity - 1):
        raise ValueError(f"capacity must be a power of two, got {capacity}")
    slots = cuda.device_array(2 * capacity, np.int64) if out is None else out
    _go(_K.clear_slots, capacity, slots)
    return slots


# ---- drivers (same names and arguments as cpu_table) ------------------------------------
def lookup(slots, mask, keys, values, out, exists, kind, a, b, seed, const, step=1):
    """out[i] = values[row(keys[i])], or the key's initial value when absent; ``step``:
    slots a probe step reads, the same result (1: ``find_row``; 4: ``find_row_x4``,
    four slots' loads issued together, for long chains at high load)."""
    K = _kernels()
    kernel = K.lookup_x4 if step == 4 else K.lookup
    _rows(kernel, keys.shape[0], out.shape[1], slots, mask, keys, *_split(values), out,
          exists, kind, a, b, seed, const, cols_per_lane=COLS_PER_LANE_PROBING)


def find_rows(slots, mask, keys, rows, scratch=None):
    """rows[i] = row of keys[i] or -1; returns how many are -1 (waits for the GPU)."""
    K = _kernels()
    scratch = scratch or Scratch()
    missing, _ = scratch.counter("missing")
    _go(K.find_rows, keys.shape[0], slots, mask, keys, rows, missing)
    return scratch.read("missing")


def find_or_insert_rows(slots, mask, keys, rows, inserted, alloc, free_rows, n_free, fresh_start):
    """rows[i] = row of keys[i], inserting absent keys; inserted[i] marks the inserter.

    ``alloc[0]`` counts the rows handed out, as on the CPU.
    """
    K = _kernels()
    _go(K.find_or_insert_rows, keys.shape[0], slots, mask, keys, rows, inserted, alloc,
        free_rows, n_free, fresh_start)


def insert_rows(slots, mask, keys, rows, inserted, free_rows, n_free, fresh_start, scratch,
                then=None):
    """:func:`find_or_insert_rows` with a counter from ``scratch``; returns the rows handed
    out.  The counter is never reset: it starts at some ``c0``, so the kernel is
    told that the free list holds ``n_free + c0`` rows, which makes
    ``take_row`` hand out exactly what it would from zero.

    ``then()``, when given, is called right after the launch, before the host
    waits for the count: work it launches queues behind the insert, so the
    GPU is not idle while the host launches it."""
    alloc, c0 = scratch.counter("alloc")
    find_or_insert_rows(slots, mask, keys, rows, inserted, alloc, free_rows, n_free + c0,
                        fresh_start)
    if then is not None:
        then()
    return scratch.read("alloc")


def init_rows(values, rows, keys, inserted, kind, a, b, seed, const):
    """Write initial values into values[rows[i]] wherever inserted[i]."""
    K = _kernels()
    _rows(K.init_rows, keys.shape[0], values.shape[1], *_split(values), rows, keys, inserted,
          kind, a, b, seed, const)


def init_gather(values, rows, keys, inserted, fresh_start, out, kind, a, b, seed, const):
    """:func:`init_rows` and :func:`gather` in one launch; rows ``>= fresh_start`` must
    be those the insert just before handed out (see ``cpu_table.init_gather``)."""
    K = _kernels()
    _rows(K.init_gather, keys.shape[0], out.shape[1], *_split(values), rows, keys, inserted,
          fresh_start, out, kind, a, b, seed, const)


def gather(values, rows, out):
    """out[i] = values[rows[i]] (rows must all be valid)."""
    K = _kernels()
    _rows(K.gather, rows.shape[0], out.shape[1], *_split(values), rows, out)


def scatter(src, pos, out):
    """out[pos[i]] = src[i] (positions distinct); the inverse of :func:`gather`."""
    K = _kernels()
    _rows(K.scatter, pos.shape[0], src.shape[1], src, pos, out)


def cast(src, dst):
    """dst[i] = src[i] converted to dst's dtype (1-D arrays)."""
    _go(_kernels().cast, src.shape[0], src, dst)


def narrow(src, dst):
    """``dst[i] = src[i]`` rounded into 16-bit float bits (``dst`` uint16 / int16, 1-D)."""
    _go(_kernels().narrow, src.shape[0], src, dst)


def widen(src, dst):
    """``dst[i]`` = the value of 16-bit float bits ``src[i]`` (``dst`` float32, 1-D)."""
    _go(_kernels().widen, src.shape[0], src, dst)


def invert(src, dst):
    """dst[i] = not src[i] (1-D bool arrays)."""
    _go(_kernels().invert, src.shape[0], src, dst)


def count_true(flags, scratch=None):
    """How many of ``flags`` (1-D) are true (waits for the GPU)."""
    K = _kernels()
    scratch = scratch or Scratch()
    count, _ = scratch.counter("true")
    _go(K.count_true, flags.shape[0], flags, count)
    return scratch.read("true")


def assign_rows(values, rows, src, owners=None, scratch=None):
    """values[rows[i]] = src[i]; for repeated rows the last i wins.

    ``owners`` is accepted for the CPU signature and ignored: the last writer of
    each row is elected with ``atomic.max`` in a row-indexed scratch array (only
    the batch's rows are touched, so it needs no clearing).
    """
    K = _kernels()
    n = rows.shape[0]
    if not n:
        return
    last = (scratch or Scratch()).array("last", values.shape[0], np.int64)
    _go(K.scatter_fill, n, last, rows, np.int64(-1))
    _go(K.elect_last, n, rows, last)
    _rows(K.assign_last, n, src.shape[1], *_split(values), rows, src, last)


def number_keys(keys, scratch=None):
    """Dense ids of the distinct keys of a batch: ``(ids, counts, n_distinct)``.

    ``ids[i]`` is in ``[0, n_distinct)``, equal for equal keys; ``counts[g]``
    is how often id ``g`` occurs (``counts`` has ``n + 1`` entries).  Uses a
    batch-local index and the same ``find_or_insert_key`` body as the table.
    """
    K = _kernels()
    scratch = scratch or Scratch()
    n = keys.shape[0]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    tmp = device_empty_slots(cap, scratch.array("tmp_slots", 2 * cap, np.int64))
    ids = scratch.array("ids", n, np.int64)
    counts = scratch.array("counts", n + 1, np.int64)
    _go(K.fill, n + 1, counts, np.int64(0))
    alloc, c0 = scratch.counter("ids")
    _go(K.number_keys, n, tmp, cap - 1, keys, ids, alloc, scratch.array("none", 1, np.int64),
        c0, counts)
    return ids, counts, scratch.read("ids")


def exclusive_scan(a, scratch=None):
    """In place exclusive prefix sum of a 1-D int64 device array; returns the total
    (its work space in ``scratch`` when given)."""
    K = _kernels()
    n = a.shape[0]
    if not n:
        return 0
    _, chunk, offsets, total = _counted(K.scan_blocks, a, n, scratch or Scratch(), "scan")
    _go(K.add_offsets, n, a, chunk, offsets)
    return total


def group_keys(keys, scratch=None, radix=None):
    """``(order, starts)`` grouping a batch by key, as ``accum_groups`` takes them.

    ``order[starts[g]:starts[g+1]]`` are the positions of one key, in batch
    order.  Groups come in no particular key order (the CPU sorts by key; only
    the grouping and the order inside a group matter to ``accum_groups``).
    ``radix``: see :func:`_group` (None: chosen by the largest group).
    """
    scratch = scratch or Scratch()
    ids, counts, g = number_keys(keys, scratch)
    return _group(ids, counts, g, scratch, radix)


GROUP_CHUNK = 256   # positions a thread counts and places in group_positions' few groups


def group_positions(inverse, n_groups, scratch=None):
    """``(order, starts)`` of positions grouped by ``inverse`` (n,) int64 in
    ``[0, n_groups)``: group ``g`` is ``order[starts[g]:starts[g + 1]]``, in batch
    order (a stable counting sort).  Up to ``4 * GROUP_CHUNK`` groups (a bounded
    table's ranges): a thread counts and then places each chunk of ``GROUP_CHUNK``
    positions in order, offsets from one scan of the (group, chunk) counts; more
    groups: atomic placement, then each group's positions sorted."""
    K = _kernels()
    scratch = scratch or Scratch()
    n = inverse.shape[0]
    if n >= GROUP_CHUNK and n_groups <= 4 * GROUP_CHUNK:
        return _group_chunked(inverse, n_groups, scratch)
    counts = scratch.array("counts", max(n, n_groups) + 1, np.int64)
    _go(K.fill, counts.shape[0], counts, np.int64(0))
    _go(K.group_counts, n, inverse, counts)
    return _group(inverse, counts, n_groups, scratch)


def group_heads(keys, order, starts, out):
    """``out[g]`` = the key of group ``g`` of :func:`group_keys` (its distinct keys)."""
    _go(_kernels().group_heads, out.shape[0], keys, order, starts, out)
    return out


def update_rows(rule, columns, rows, grads, order, starts, hyper, flag, scratch=None):
    """One optimizer step on rows ``rows`` (u,) of ``columns`` ``[values, slot a, b, c]``
    (device arrays or SplitRows; a slot the rule lacks: pass ``values``), the CPU's
    ``{rule}_row`` body per row (:mod:`jit_kernels.optimizers`).  Row ``i``'s gradient
    is ``grads[i]`` when ``order`` is None, else the sum of the rows
    ``grads[order[starts[i]:starts[i + 1]]]`` (a backward pass's output gradient, one row
    per position) added from zero in that order, in the same kernel.  ``hyper``: the
    body's scalar arguments after the gradient (up to six), ``flag`` its bool option."""
    K = _kernels()
    scratch = scratch or Scratch()
    u, dim = rows.shape[0], grads.shape[1]
    if not u:
        return
    args = [a for col in columns for a in _split(col)]
    if order is None:
        order = starts = scratch.array("no_groups", 0, np.int64)
        acc = grads[:1]
    else:
        acc = scratch.array("grad_sums", u * dim, grads.dtype).reshape(u, dim)
    hyper = tuple(float(x) for x in hyper) + (0.0,) * (6 - len(hyper))
    _rows(getattr(K, rule + "_groups"), u, dim, *args, rows, grads, order, starts, acc, hyper,
          bool(flag))


def _group_chunked(ids, g, scratch):
    """:func:`group_positions` for few groups: counts ``hist[group * chunks + chunk]``,
    their exclusive scan, then each chunk's positions placed in order."""
    order = scratch.array("order", ids.shape[0], np.int64)
    starts = scratch.array("chunk_starts", g + 1, np.int64)
    _radix_pass(ids, scratch.array("no_seq", 0, np.int64), 0, g, order, scratch, starts)
    return order, starts


def _radix_pass(ids, seq, shift, buckets, out, scratch, starts=None):
    """One stable counting-sort pass: ``out`` = the positions ``seq`` (empty: all, in
    order) ordered by the digit ``ids[p] >> shift`` masked to the bits of ``buckets - 1``
    (``buckets``: every value the digit takes), ties in sequence order, from the scanned counts
    ``hist[digit * chunks + chunk]``; ``starts`` (buckets + 1,): each digit's first
    place in ``out``, and ``out.shape[0]``."""
    K = _kernels()
    n = out.shape[0]
    chunks = -(-n // GROUP_CHUNK)
    mask = np.int64((1 << max(buckets - 1, 0).bit_length()) - 1)
    hist = scratch.array("chunk_hist", buckets * chunks, np.int64)
    _go(K.fill, hist.shape[0], hist, np.int64(0))
    _go(K.chunk_counts, chunks, ids, seq, np.int64(shift), mask, GROUP_CHUNK, chunks, hist)
    exclusive_scan(hist, scratch)
    if starts is not None:
        _go(K.chunk_starts, buckets + 1, hist, chunks, n, starts)
    _go(K.chunk_place, chunks, ids, seq, np.int64(shift), mask, GROUP_CHUNK, chunks, hist, out)


RADIX_BITS = 10         # digit of the radix grouping: 1,024 buckets a pass
RADIX_ABOVE = 64        # a batch whose largest group is larger is grouped by radix passes
#                         (a module setting: optimizer steps group with the automatic choice)


def _group(ids, counts, g, scratch, radix=None):
    """``(order, starts)`` from dense group ids and their counts (``counts[:g]``).

    Positions are placed by atomics (any order within a group), then each group is
    heapsorted by one thread, unless a group holds more than ``RADIX_ABOVE`` positions
    (a hot key in a skewed batch, whose heapsort on one GPU thread would take
    milliseconds): then a stable LSD radix sort of the positions by group id, a
    counting-sort pass per digit of at most ``RADIX_BITS`` (digits of even widths: 64K
    groups take two passes of 256 buckets), as :func:`group_positions`' few-group path.
    ``radix`` True / False forces one or the other (benchmarks, tests)."""
    K = _kernels()
    n = ids.shape[0]
    starts = counts[:g + 1]
    if radix is None and g:
        big = scratch.array("largest", 1, np.int64)
        _go(K.fill, 1, big, np.int64(0))
        _go(K.largest, g, counts, g, big)
        radix = int(big.copy_to_host()[0]) > RADIX_ABOVE
    exclusive_scan(starts, scratch)
    if radix and g:
        seq = scratch.array("no_seq", 0, np.int64)
        bufs = [scratch.array("order", n, np.int64), scratch.array("order_b", n, np.int64)]
        bits = (g - 1).bit_length()
        passes = max(1, -(-bits // RADIX_BITS))     # the fewest passes, digits as even
        width = max(1, -(-bits // passes))          # as can be
        for shift in range(0, max(bits, 1), width):
            out = bufs[0]
            _radix_pass(ids, seq, shift, min(1 << width, ((g - 1) >> shift) + 1), out, scratch)
            seq, bufs = out, bufs[::-1]
        return seq, starts
    cursor = scratch.array("cursor", max(g, 1), np.int64)
    if g:
        cursor[:g].copy_to_device(starts[:g])
    order = scratch.array("order", n, np.int64)
    _go(K.place_groups, n, ids, cursor, order)
    _go(K.sort_groups, g, order, starts)
    return order, starts


def accum_groups(slots, mask, keys, order, starts, values, old, new, exists,
                 rows, inserted, alloc, free_rows, n_free, fresh_start):
    """TFRA ``accum`` with the semantics of a sequential loop over the batch.

    See :func:`jit_kernels.cpu_table.accum_groups`; ``order``/``starts`` come
    from :func:`group_keys`.  One thread replays each group in batch order.
    """
    K = _kernels()
    _go(K.accum_groups, starts.shape[0] - 1, slots, mask, keys, order, starts, *_split(values),
        old, new, exists, rows, inserted, alloc, free_rows, n_free, fresh_start)


def erase_keys(slots, mask, keys, freed):
    """Tombstone each present key; freed[i] = the row released by keys[i], else -1."""
    _go(_kernels().erase_keys, keys.shape[0], slots, mask, keys, freed)


def rehash(old_slots, new_slots, new_mask):
    """Insert every full slot of old_slots into new_slots (tombstones dropped)."""
    _go(_kernels().rehash, old_slots.shape[0] // 2, old_slots, new_slots, new_mask)


def export_slots(slots, n_chunks=None):
    """(keys, rows) of all full slots, in slot order (``n_chunks`` is ignored:
    the chunks are the launch's blocks)."""
    K = _kernels()
    blocks, chunk, offsets, total = _counted(K.count_full, slots, slots.shape[0] // 2,
                                             Scratch(), "full")
    keys = cuda.device_array(max(total, 1), np.int64)
    rows = cuda.device_array(max(total, 1), np.int64)
    K.write_full[blocks, _Launch.threads](slots, chunk, offsets, keys, rows)
    return keys[:total], rows[:total]


def compact_nonneg(a, out, at=0, scratch=None):
    """Append the entries ``>= 0`` of ``a`` (in order) to ``out[at:]``; returns how many
    (its work space in ``scratch`` when given)."""
    K = _kernels()
    n = a.shape[0]
    if not n:
        return 0
    blocks, chunk, offsets, total = _counted(K.count_nonneg, a, n, scratch or Scratch(),
                                             "nonneg")
    if total:
        K.write_nonneg[blocks, _Launch.threads](a, chunk, offsets, out[at:at + total])
    return total


__all__ = ["lookup", "find_rows", "find_or_insert_rows", "insert_rows", "init_rows",
           "init_gather", "gather",
           "scatter", "assign_rows", "group_keys", "accum_groups", "erase_keys", "rehash",
           "export_slots", "compact_nonneg", "exclusive_scan", "number_keys", "count_true",
           "cast", "narrow", "widen", "invert", "filled", "device_empty_slots", "cuda_api", "launch_config",
           "tile_width", "SplitRows", "Scratch"]
