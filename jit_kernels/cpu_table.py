"""CPU drivers for the hash-index kernels: ``prange`` loops over per-element bodies.

Shapes: ``keys`` (n,) int64; ``rows`` (n,) int64; ``values`` (row_capacity, dim);
``out`` / ``src`` (n, dim); ``slots`` as in :mod:`jit_kernels.slots`.
Initializer parameters ``init = (kind, a, b, seed, const)`` follow
:mod:`jit_kernels.initializers`.

Writers that can see one row several times in a batch (duplicate keys) give
each row to one owner thread that walks the batch in order, so the result is
that of the sequential loop, without locks.

Speed: a table is far larger than the caches, so every probe and every row copy
is a cache miss.  The loops here ask for the home slot of the key ``AHEAD``
positions on (and for the row ``ROWS_AHEAD`` positions on) before working on
the current one, so that many misses are in flight at once instead of one.
Prefetching is a CPU driver concern only: the per-element bodies are unchanged.

Numba's on-disk cache does not follow imports: a driver cached before a
per-element body (``probing``, ``initializers``, ...) changed keeps running the
old body.  After editing a body, clear ``jit_kernels/__pycache__`` (or set
``NUMBA_CACHE_DIR``); ``benchmarks/bench_table.py`` compiles into a fresh cache.
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._inner import inner
from ._twins import BySize
from .initializers import init_row
from .probing import accum_group, erase_key, find_or_insert_key, find_row, insert_unique
from .slots import first_slot, is_full
from .streams import CHUNK, STREAM_MIN, store_fence, stream_line, streams

_opts = dict(parallel=True, nogil=True, cache=True)

AHEAD = 16        # keys whose home slot is requested ahead of the probe
ROWS_AHEAD = 8    # rows requested ahead of a row copy
LINE = 64         # cache line bytes


def _prefetch_intrinsic(write, locality=3):
    @intrinsic
    def prefetch(typingctx, arr, offset):
        sig = types.void(arr, types.intp)

        def codegen(context, builder, sig, args):
            if builder.module.triple.startswith("nvptx"):    # a GPU has no such hint: a
                return context.get_dummy_value()             # body shared with CUDA skips it
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            ptr = builder.gep(builder.bitcast(ary.data, i8p), [args[1]])
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
            builder.call(fn, [ptr, i32(write), i32(locality), i32(1)])
            return context.get_dummy_value()

        return sig, codegen

    return prefetch


# Hint that the byte ``offset`` of ``arr``'s data is about to be read / written.
# A hint never faults, whatever the address.
prefetch_read = _prefetch_intrinsic(0)
prefetch_write = _prefetch_intrinsic(1)
# ... read a while later: requested into the second-level cache, not the first
# (prefetcht1: a stream of lines that would evict the lines in use from the first).
prefetch_later = _prefetch_intrinsic(0, 2)


@inner
def prefetch_at(arr, off, write):
    """Request byte ``off`` of ``arr``'s data, to be written or read."""
    if write:
        prefetch_write(arr, off)
    else:
        prefetch_read(arr, off)


@inner
def prefetch_slot(slots, mask, key, write):
    """Request the home slot of ``key``."""
    prefetch_at(slots, 2 * first_slot(key, mask) * slots.itemsize, write)


@inner
def prefetch_second(slots, mask, key):
    """A second stage of a find's look-ahead, nearer its turn: nothing in a linear
    index (its home slot, requested first, is where the find starts).  The bucketed
    index's twins of the find kernels (:mod:`jit_kernels.bucket_reads`) request here
    the slot the key's digest points to."""


@inner
def prefetch_probe(slots, mask, key, write):
    """Request the home slot of ``key`` and the slot 3 on: the next cache line for 3 of
    the 4 places a slot can take in a line (at load 0.5 the probe of an absent key runs
    past its home slot's line about a third of the time)."""
    off = 2 * first_slot(key, mask) * slots.itemsize
    if write:
        prefetch_write(slots, off)
        prefetch_write(slots, off + 6 * slots.itemsize)
    else:
        prefetch_read(slots, off)
        prefetch_read(slots, off + 6 * slots.itemsize)


@inner
def prefetch_row(values, r, write):
    """Request every cache line of row ``r`` of a 2-D C-contiguous array."""
    width = values.shape[1] * values.itemsize
    start = r * values.strides[0]
    for off in range(start, start + width, LINE):
        if write:
            prefetch_write(values, off)
        else:
            prefetch_read(values, off)
    if write:
        prefetch_write(values, start + width - 1)
    else:
        prefetch_read(values, start + width - 1)


def lookup(slots, mask, keys, values, out, exists, kind, a, b, seed, const):
    """out[i] = values[row(keys[i])], or the key's initial value when absent;
    ``exists[i]`` whether the key is present (:func:`lookup_rows` with its scratch; a
    large output is written with streaming stores, :mod:`jit_kernels.streams`)."""
    lookup_rows(slots, mask, keys, values, out, exists, kind, a, b, seed, const,
                np.empty(keys.shape[0], np.int64), STREAM_MIN)


@njit(**_opts)
def lookup_rows(slots, mask, keys, values, out, exists, kind, a, b, seed, const, rows,
                stream_min):
    """:func:`lookup`, given ``rows`` (n,) int64 to hold each key's row between the
    probe pass and the copy (any contents), and the least output bytes written with
    streaming stores, ``stream_min`` (:func:`jit_kernels.streams.streams`).  (``rows``
    is not allocated here: an ``np.empty`` in a kernel is an overload that every cold
    process compiles with it, 0.1 s.)"""
    n = keys.shape[0]
    for i in prange(n):                   # probe every key (slots requested ahead) ...
        if i + AHEAD < n:
            prefetch_slot(slots, mask, keys[i + AHEAD], False)
        if i + AHEAD // 2 < n:
            prefetch_second(slots, mask, keys[i + AHEAD // 2])
        rows[i] = find_row(slots, mask, keys[i])
    stream = streams(out, values, stream_min)
    for t in prange((n + CHUNK - 1) // CHUNK):   # ... then copy the rows (rows requested
        end = min(n, (t + 1) * CHUNK)            # ahead), CHUNK at a time, then a fence
        for i in range(t * CHUNK, end):
            if i + ROWS_AHEAD < end and rows[i + ROWS_AHEAD] >= 0:
                prefetch_row(values, rows[i + ROWS_AHEAD], False)
            r = rows[i]
            if r >= 0:
                if stream:                # (written out here: a helper called for each row
                    #                       cost 10-25 ns a row, 40% of a 1M-key lookup)
                    d0, s0 = i * out.strides[0], r * values.strides[0]
                    for off in range(0, out.shape[1] * out.itemsize, LINE):
                        stream_line(out, d0 + off, values, s0 + off)
                else:
                    for c in range(out.shape[1]):
                        out[i, c] = values[r, c]
                exists[i] = True
            else:
                init_row(out[i], keys[i], kind, a, b, seed, const)
                exists[i] = False
        if stream:
            store_fence()


@njit(**_opts)
def find_rows(slots, mask, keys, rows):
    """rows[i] = row of keys[i] or -1; returns how many are -1."""
    n = keys.shape[0]
    missing = 0
    for i in prange(n):
        if i + AHEAD < n:
            prefetch_slot(slots, mask, keys[i + AHEAD], False)
        if i + AHEAD // 2 < n:
            prefetch_second(slots, mask, keys[i + AHEAD // 2])
        rows[i] = find_row(slots, mask, keys[i])
        if rows[i] < 0:
            missing += 1
    return missing


@njit(**_opts)
def find_or_insert_rows(slots, mask, keys, rows, inserted, alloc, free_rows, n_free, fresh_start):
    """rows[i] = row of keys[i], inserting absent keys; inserted[i] marks the inserter."""
    n = keys.shape[0]
    for i in prange(n):
        if i + AHEAD < n:
            prefetch_probe(slots, mask, keys[i + AHEAD], True)
        rows[i], inserted[i] = find_or_insert_key(
            slots, mask, keys[i], alloc, free_rows, n_free, fresh_start)


@njit(**_opts)
def init_rows(values, rows, keys, inserted, kind, a, b, seed, const):
    """Write initial values into values[rows[i]] wherever inserted[i]."""
    for i in prange(keys.shape[0]):
        if inserted[i]:
            init_row(values[rows[i]], keys[i], kind, a, b, seed, const)


@njit(**_opts)
def init_gather(values, rows, keys, inserted, fresh_start, out, kind, a, b, seed, const):
    """``init_rows`` then ``gather`` in one pass: a new row is copied out while it
    is still in cache.

    Rows ``>= fresh_start`` must be the ones the insert just before handed out
    (it took no row from the free list).  A repeat of a key inserted there may
    run before its inserter has written the row, so it draws the key's initial
    value itself (the same bits) instead of reading the row.
    """
    n = rows.shape[0]
    for i in prange(n):
        if i + ROWS_AHEAD < n and rows[i + ROWS_AHEAD] < fresh_start:
            prefetch_row(values, rows[i + ROWS_AHEAD], False)
        r = rows[i]
        if inserted[i] or r < fresh_start:
            if inserted[i]:
                init_row(values[r], keys[i], kind, a, b, seed, const)
            for c in range(out.shape[1]):
                out[i, c] = values[r, c]
        else:
            init_row(out[i], keys[i], kind, a, b, seed, const)


def gather(values, rows, out):
    """out[i] = values[rows[i]] (rows must all be valid); a large output is written with
    streaming stores (:mod:`jit_kernels.streams`)."""
    gather_rows(values, rows, out, STREAM_MIN)


@njit(**_opts)
def gather_rows(values, rows, out, stream_min):
    """:func:`gather` with the least output bytes written with streaming stores."""
    n = rows.shape[0]
    stream = streams(out, values, stream_min)
    for t in prange((n + CHUNK - 1) // CHUNK):   # CHUNK rows at a time, then a fence
        end = min(n, (t + 1) * CHUNK)
        for i in range(t * CHUNK, end):
            if i + ROWS_AHEAD < end:
                prefetch_row(values, rows[i + ROWS_AHEAD], False)
            r = rows[i]
            # (the copy as lookup_rows': written out in both, not a call a row; one helper
            # called once per chunk by both cost 5-17% on rows of 10-16 values or batches
            # of 2-4K keys, and -14% to +24% inlined by Numba: RESULTS_train.md, session 44)
            if stream:
                d0, s0 = i * out.strides[0], r * values.strides[0]
                for off in range(0, out.shape[1] * out.itemsize, LINE):
                    stream_line(out, d0 + off, values, s0 + off)
            else:
                for c in range(out.shape[1]):
                    out[i, c] = values[r, c]
        if stream:
            store_fence()


@njit(**_opts)
def copy_rows(src, dst, n):
    """dst[:n] = src[:n] (2-D arrays of one width)."""
    for i in prange(n):
        for c in range(src.shape[1]):
            dst[i, c] = src[i, c]


@njit(**_opts)
def assign_rows(values, rows, src, owners):
    """values[rows[i]] = src[i]; for repeated rows the last i wins.

    ``owners`` threads each own the rows ``r % owners == t`` and walk the batch
    in order (pass ``numba.get_num_threads()``).
    """
    n = rows.shape[0]
    for t in prange(owners):
        for i in range(n):
            if i + ROWS_AHEAD < n and rows[i + ROWS_AHEAD] % owners == t:
                prefetch_row(values, rows[i + ROWS_AHEAD], True)
            r = rows[i]
            if r % owners == t:
                for c in range(src.shape[1]):
                    values[r, c] = src[i, c]


@njit(**_opts)
def group_starts(sorted_keys):
    """Start offsets of runs of equal keys in a sorted array, plus the end."""
    n = sorted_keys.shape[0]
    flag = np.zeros(n + 1, np.bool_)
    for i in prange(n):
        flag[i] = i == 0 or sorted_keys[i] != sorted_keys[i - 1]
    flag[n] = True
    return np.nonzero(flag)[0]


@njit(**_opts)
def accum_groups(slots, mask, keys, order, starts, values, old, new, exists,
                 rows, inserted, alloc, free_rows, n_free, fresh_start):
    """TFRA ``accum`` with the semantics of a sequential loop over the batch.

    ``order`` sorts positions by key (stably) and ``starts`` delimits the runs
    of one key.  Each run is replayed in batch order: where the key is present
    and ``exists`` is true add ``new - old``; where it is absent and ``exists``
    is false insert ``new``; otherwise do nothing.  ``rows[p]`` gets the row
    touched (or -1) and ``inserted[p]`` marks the inserting position.
    """
    for g in prange(starts.shape[0] - 1):
        accum_group(slots, mask, keys, order, starts[g], starts[g + 1], values, values,
                    values.shape[0], old, new, exists, rows, inserted, alloc, free_rows,
                    n_free, fresh_start)


@njit(**_opts)
def erase_keys(slots, mask, keys, freed):
    """Tombstone each present key; freed[i] = the row released by keys[i], else -1.

    A key repeated in the batch releases its row once.
    """
    n = keys.shape[0]
    for i in prange(n):
        if i + AHEAD < n:
            prefetch_slot(slots, mask, keys[i + AHEAD], True)
        freed[i] = erase_key(slots, mask, keys[i])


@njit(**_opts)
def rehash(old_slots, new_slots, new_mask):
    """Insert every full slot of old_slots into new_slots (tombstones dropped)."""
    cap = old_slots.shape[0] // 2
    for s in prange(cap):
        if s + AHEAD < cap and is_full(old_slots[2 * (s + AHEAD) + 1]):
            prefetch_slot(new_slots, new_mask, old_slots[2 * (s + AHEAD)], True)
        word = old_slots[2 * s + 1]
        if is_full(word):
            insert_unique(new_slots, new_mask, old_slots[2 * s], word)


@njit(**_opts)
def export_slots(slots, n_chunks):
    """(keys, rows) of all full slots, in slot order."""
    cap = slots.shape[0] // 2
    step = (cap + n_chunks - 1) // n_chunks
    counts = np.zeros(n_chunks + 1, np.int64)
    for k in prange(n_chunks):
        n = 0
        for s in range(k * step, min(cap, (k + 1) * step)):
            if is_full(slots[2 * s + 1]):
                n += 1
        counts[k + 1] = n
    offsets = counts                      # prefix sums in place (np.cumsum: 0.2 s to compile)
    for c in range(n_chunks):
        offsets[c + 1] += offsets[c]
    keys = np.empty(offsets[-1], np.int64)
    rows = np.empty(offsets[-1], np.int64)
    for k in prange(n_chunks):
        j = offsets[k]
        for s in range(k * step, min(cap, (k + 1) * step)):
            word = slots[2 * s + 1]
            if is_full(word):
                keys[j] = slots[2 * s]
                rows[j] = word
                j += 1
    return keys, rows


@njit(**_opts)
def export_by_row(slots, n_rows, n_chunks):
    """(keys, rows) of all full slots, in row order; every row is below ``n_rows``.

    Reading the rows of an export in this order streams through the columns,
    where slot order jumps at random.

    >>> from jit_kernels.slots import empty_slots
    >>> s, keys = empty_slots(16), np.array([30, -7, 12])
    >>> rows, ins = np.empty(3, np.int64), np.empty(3, np.bool_)
    >>> find_or_insert_rows(s, 15, keys, rows, ins, np.zeros(1, np.int64), np.zeros(0, np.int64), 0, 0)
    >>> k, r = export_by_row(s, 3, 4)
    >>> r.tolist(), dict(zip(r.tolist(), k.tolist())) == dict(zip(rows.tolist(), keys.tolist()))
    ([0, 1, 2], True)
    """
    cap = slots.shape[0] // 2
    key_of = np.empty(n_rows, np.int64)
    live = np.zeros(n_rows, np.bool_)
    bad = 0
    for s in prange(cap):                 # a row belongs to one slot: no write races
        word = slots[2 * s + 1]
        if is_full(word):
            if word < n_rows:
                key_of[word] = slots[2 * s]
                live[word] = True
            else:
                bad += 1
    if bad:
        raise ValueError("export_by_row: a slot holds a row beyond n_rows")
    step = (n_rows + n_chunks - 1) // n_chunks
    counts = np.zeros(n_chunks + 1, np.int64)
    for c in prange(n_chunks):
        m = 0
        for r in range(c * step, min(n_rows, (c + 1) * step)):
            if live[r]:
                m += 1
        counts[c + 1] = m
    offsets = counts                      # prefix sums in place (np.cumsum: 0.2 s to compile)
    for c in range(n_chunks):
        offsets[c + 1] += offsets[c]
    keys = np.empty(offsets[-1], np.int64)
    rows = np.empty(offsets[-1], np.int64)
    for c in prange(n_chunks):
        j = offsets[c]
        for r in range(c * step, min(n_rows, (c + 1) * step)):
            if live[r]:
                keys[j] = key_of[r]
                rows[j] = r
                j += 1
    return keys, rows


# Small batches run the serial builds (a parallel launch costs more than their work; on
# a 2-core VM, 4,096 keys: lookup of dim 16 23 against 155 us, find_rows 15 against
# 76 us; rows of dim 64 from 8,192 keys on run in parallel): see jit_kernels._twins.
lookup_rows = BySize(lookup_rows, 2, 4)
find_rows = BySize(find_rows, 2)
find_or_insert_rows = BySize(find_or_insert_rows, 2)
init_rows = BySize(init_rows, 2, 0)
init_gather = BySize(init_gather, 1, 5)
gather_rows = BySize(gather_rows, 1, 2)
# (a parallel rehash places colliding keys in thread-timing order; bounded tables, whose
# evictions depend on the index's layout, use rehash.serial: see numbaemb.bounded)
rehash = BySize(rehash, 0)
copy_rows = BySize(copy_rows, 0, 0)      # (the source's rows: at least the n copied)
# (by the index's size; its three parallel loops are 1.5 s of compile, the serial build 0.3)
export_by_row = BySize(export_by_row, 0)
# (the serial build with one owner: one pass over the batch, not `owners`)
assign_rows = BySize(assign_rows, 1, 2, serial_args=lambda a: a[:3] + (1,))
