"""The ``@cuda.jit`` kernels behind :mod:`jit_kernels.cuda_table`, built on first use.

Every kernel is a grid-stride loop over the per-element bodies of
:mod:`jit_kernels.probing` and :mod:`jit_kernels.initializers` (called as they
are: ``@njit`` functions compile for CUDA too).  Nothing here imports
``numba.cuda`` until :func:`build` runs.

Row kernels give each key a *tile* of ``2**log_t`` consecutive lanes: every
lane runs the same read-only probe (one memory transaction for the tile) and
then handles columns ``lane, lane + tile, ...``; :func:`copy_row` issues four
loads before their stores so a row is fetched in one round trip, and initial
values are drawn per column (``key_stream`` + ``init_value``, exactly what
``init_row`` computes) so new rows are written coalesced too.

Columns may be split between two arrays (hybrid mode): row kernels take
``(values, spill, split)`` and read row ``r`` from ``spill[r - split]`` when
``r >= split``.  A plain column is passed as ``(values, values, len(values))``.
"""
import os

import numpy as np

from . import initializers as _inits
from . import optimizers as _opt
from . import probing as _probing
from .halfs import load, store
from .slots import EMPTY, is_full

cuda = None            # numba.cuda, bound by build() (the simulator swaps this global)
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _host(a):
    """The numpy array behind a simulator array (identity for anything else)."""
    a = getattr(a, "_item", a)
    return getattr(a, "_ary", a)


def _body(fn, returns=None):
    """A per-element body as a kernel calls it: the ``@njit`` function itself on a
    GPU; under the simulator a wrapper handing it the numpy arrays behind the
    simulator's array objects (the body still runs compiled, with CPU atomics).
    ``returns`` restores a result type that boxing to Python loses (uint64)."""
    if not SIMULATOR:
        return fn

    def call(*args):
        out = fn(*[_host(a) for a in args])
        return out if returns is None else returns(out)
    return call


def registrar(kernels, prefix=""):
    """``@kernel``: compile ``fn`` with ``cuda.jit`` and keep it in ``kernels`` as
    ``prefix + fn.__name__`` (:func:`build` and the ``add_kernels`` of the other
    ``cuda_*`` modules)."""
    def kernel(fn):
        kernels[prefix + fn.__name__] = compiled = cuda.jit(fn)
        return compiled
    return kernel


def build(threads):
    """Compile-on-first-call kernels for blocks of ``threads`` threads (a namespace)."""
    global cuda
    from numba import cuda as _cuda
    cuda = _cuda
    find_row = _body(_probing.find_row)
    find_row_x4 = _body(_probing.find_row_x4)
    find_or_insert_key = _body(_probing.find_or_insert_key)
    insert_unique = _body(_probing.insert_unique)
    erase_key = _body(_probing.erase_key)
    accum_group = _body(_probing.accum_group)
    key_stream = _body(_inits.key_stream, returns=np.uint64)
    init_value = _body(_inits.init_value)
    full = _body(is_full)
    jit = cuda.jit
    kernels = {}
    kernel = registrar(kernels)

    # ---- device helpers ---------------------------------------------------------------
    @jit(device=True)
    def copy_row(src, dst, lane, lanes):
        """dst[c] = src[c] for c = lane, lane + lanes, ... (four loads in flight)."""
        n = dst.shape[0]
        c = lane
        while c + 3 * lanes < n:
            v0 = src[c]
            v1 = src[c + lanes]
            v2 = src[c + 2 * lanes]
            v3 = src[c + 3 * lanes]
            dst[c] = v0
            dst[c + lanes] = v1
            dst[c + 2 * lanes] = v2
            dst[c + 3 * lanes] = v3
            c += 4 * lanes
        while c < n:
            dst[c] = src[c]
            c += lanes

    @jit(device=True)
    def init_cols(dst, key, kind, a, b, seed, const, lane, lanes):
        """This lane's columns of ``init_row(dst, key, ...)``."""
        stream = key_stream(seed, key)
        for c in range(lane, dst.shape[0], lanes):
            store(dst, c, init_value(stream, c, kind, a, b, const))   # 16-bit: rounded once

    @jit(device=True)
    def init_both(dst, out, key, kind, a, b, seed, const, lane, lanes):
        """:func:`init_cols` into ``dst`` and ``out`` at once (the same values).  (Session
        5's float64 generator drawn in two passes, as ``init_row`` then did on the CPU,
        was slower here: 0.98 vs 0.84 ms for 1M rows of 64 on an H100.)"""
        stream = key_stream(seed, key)
        for c in range(lane, dst.shape[0], lanes):
            v = init_value(stream, c, kind, a, b, const)
            store(dst, c, v)
            store(out, c, v)

    @jit(device=True)
    def block_scan(buf, v):
        """Exclusive prefix of ``v`` over the block, and the block total."""
        t = cuda.threadIdx.x
        buf[t] = v
        cuda.syncthreads()
        d = 1
        while d < threads:
            x = buf[t - d] if t >= d else 0
            cuda.syncthreads()
            buf[t] += x
            cuda.syncthreads()
            d *= 2
        incl = buf[t]
        total = buf[threads - 1]
        cuda.syncthreads()
        return incl - v, total

    @jit(device=True)
    def count_block(buf, a, n, step, at, chunk, counts):
        """``counts[b]`` = the items ``j < n`` of block b's chunk with ``a[step * j + at] >= 0``
        (written, not added to: no zeroing launch before); ``buf``: the block's shared
        scratch of ``threads``."""
        blk = cuda.blockIdx.x
        hi = min(n, (blk + 1) * chunk)
        m = 0
        for j in range(blk * chunk + cuda.threadIdx.x, hi, threads):
            if a[step * j + at] >= 0:
                m += 1
        _, total = block_scan(buf, m)
        if cuda.threadIdx.x == 0:
            counts[blk] = total

    @jit(device=True)
    def sift_down(a, lo, root, n):
        while True:
            child = 2 * root + 1
            if child >= n:
                return
            if child + 1 < n and a[lo + child + 1] > a[lo + child]:
                child += 1
            if a[lo + root] >= a[lo + child]:
                return
            a[lo + root], a[lo + child] = a[lo + child], a[lo + root]
            root = child

    # ---- element-wise ---------------------------------------------------------------------
    @kernel
    def fill(a, v):
        for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
            a[i] = v

    @kernel
    def scatter_fill(a, idx, v):
        for i in range(cuda.grid(1), idx.shape[0], cuda.gridsize(1)):
            if idx[i] >= 0:
                a[idx[i]] = v

    @kernel
    def cast(src, dst):
        for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
            dst[i] = src[i]

    @kernel
    def narrow(src, dst):
        """``dst[i] = src[i]`` rounded into 16-bit float storage bits (``store``)."""
        for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
            store(dst, i, src[i])

    @kernel
    def widen(src, dst):
        """``dst[i]`` = the value of 16-bit float storage bits ``src[i]`` (``load``)."""
        for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
            dst[i] = load(src, i)

    @kernel
    def invert(src, dst):
        for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
            dst[i] = not src[i]

    @kernel
    def count_true(flags, count):
        n = 0
        for i in range(cuda.grid(1), flags.shape[0], cuda.gridsize(1)):
            if flags[i]:
                n += 1
        if n:
            cuda.atomic.add(count, 0, n)

    @kernel
    def clear_slots(slots):
        for s in range(cuda.grid(1), slots.shape[0] // 2, cuda.gridsize(1)):
            slots[2 * s] = 0
            slots[2 * s + 1] = EMPTY

    # ---- index ------------------------------------------------------------------------------
    @jit(device=True)
    def row_or_init(r, i, values, spill, split, keys, out, exists, kind, a, b, seed, const,
                    lane, lanes):
        """This lane's columns of out[i]: row ``r`` (head or tail of a SplitRows), or the
        initial value of keys[i] when ``r`` < 0; lane 0 sets exists[i]."""
        if r >= 0:
            copy_row(values[r] if r < split else spill[r - split], out[i], lane, lanes)
        else:
            init_cols(out[i], keys[i], kind, a, b, seed, const, lane, lanes)
        if lane == 0:
            exists[i] = r >= 0

    def lookup_with(find):
        """The lookup kernel with ``find(slots, mask, key)`` -> row or -1 as its find: a
        tile of lanes a key, each lane finding it, then copying its columns."""
        def lookup(slots, mask, keys, values, spill, split, out, exists, kind, a, b, seed,
                   const, log_t):
            tid = cuda.grid(1)
            lane = tid & ((1 << log_t) - 1)
            for i in range(tid >> log_t, keys.shape[0], cuda.gridsize(1) >> log_t):
                row_or_init(find(slots, mask, keys[i]), i, values, spill, split, keys, out,
                            exists, kind, a, b, seed, const, lane, 1 << log_t)
        return lookup

    kernels["lookup"] = jit(lookup_with(find_row))
    # the probe that reads four slots a step
    kernels["lookup_x4"] = jit(lookup_with(find_row_x4))

    @kernel
    def find_rows(slots, mask, keys, rows, missing):
        n = 0
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            r = find_row(slots, mask, keys[i])
            rows[i] = r
            if r < 0:
                n += 1
        if n:
            cuda.atomic.add(missing, 0, n)

    @kernel
    def find_or_insert_rows(slots, mask, keys, rows, inserted, alloc, free_rows, n_free, fresh):
        # One probe per key: acquire loads until the key or an EMPTY slot, where a
        # compare-and-swap claims it; new rows come from a warp-shared counter (claim).
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            rows[i], inserted[i] = find_or_insert_key(
                slots, mask, keys[i], alloc, free_rows, n_free, fresh)

    @kernel
    def erase_keys(slots, mask, keys, freed):
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            freed[i] = erase_key(slots, mask, keys[i])

    @kernel
    def rehash(old_slots, new_slots, new_mask):
        for s in range(cuda.grid(1), old_slots.shape[0] // 2, cuda.gridsize(1)):
            word = old_slots[2 * s + 1]
            if full(word):
                insert_unique(new_slots, new_mask, old_slots[2 * s], word)

    # ---- rows -----------------------------------------------------------------------------
    @kernel
    def init_rows(values, spill, split, rows, keys, inserted, kind, a, b, seed, const, log_t):
        tid = cuda.grid(1)
        lane = tid & ((1 << log_t) - 1)
        for i in range(tid >> log_t, keys.shape[0], cuda.gridsize(1) >> log_t):
            if inserted[i]:
                r = rows[i]
                init_cols(values[r] if r < split else spill[r - split], keys[i],
                          kind, a, b, seed, const, lane, 1 << log_t)

    @kernel
    def init_gather(values, spill, split, rows, keys, inserted, fresh_start, out, kind, a, b,
                    seed, const, log_t):
        tid = cuda.grid(1)
        lane = tid & ((1 << log_t) - 1)
        for i in range(tid >> log_t, keys.shape[0], cuda.gridsize(1) >> log_t):
            r = rows[i]
            if inserted[i]:
                init_both(values[r] if r < split else spill[r - split], out[i], keys[i],
                          kind, a, b, seed, const, lane, 1 << log_t)
            elif r >= fresh_start:   # a repeat of a key inserted by this batch
                init_cols(out[i], keys[i], kind, a, b, seed, const, lane, 1 << log_t)
            else:
                copy_row(values[r] if r < split else spill[r - split], out[i], lane,
                         1 << log_t)

    @kernel
    def gather(values, spill, split, rows, out, log_t):
        tid = cuda.grid(1)
        lane = tid & ((1 << log_t) - 1)
        for i in range(tid >> log_t, rows.shape[0], cuda.gridsize(1) >> log_t):
            r = rows[i]
            copy_row(values[r] if r < split else spill[r - split], out[i], lane, 1 << log_t)

    @kernel
    def scatter(src, pos, out, log_t):
        tid = cuda.grid(1)
        lane = tid & ((1 << log_t) - 1)
        for i in range(tid >> log_t, pos.shape[0], cuda.gridsize(1) >> log_t):
            copy_row(src[i], out[pos[i]], lane, 1 << log_t)

    @kernel
    def elect_last(rows, last):
        for i in range(cuda.grid(1), rows.shape[0], cuda.gridsize(1)):
            if rows[i] >= 0:            # (-1: a key a bounded table did not admit)
                cuda.atomic.max(last, rows[i], i)

    @kernel
    def assign_last(values, spill, split, rows, src, last, log_t):
        tid = cuda.grid(1)
        lane = tid & ((1 << log_t) - 1)
        for i in range(tid >> log_t, rows.shape[0], cuda.gridsize(1) >> log_t):
            r = rows[i]
            if r >= 0 and last[r] == i:
                copy_row(src[i], values[r] if r < split else spill[r - split], lane, 1 << log_t)

    # ---- grouping (accum) -------------------------------------------------------------------
    @kernel
    def number_keys(tmp, tmask, keys, ids, alloc, no_free, base, counts):
        """ids[i] = dense number of keys[i] in the batch (0, 1, ... per distinct key)."""
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            g, _ = find_or_insert_key(tmp, tmask, keys[i], alloc, no_free, base, 0)
            ids[i] = g
            cuda.atomic.add(counts, g, 1)

    @kernel
    def place_groups(ids, cursor, order):
        for i in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
            order[cuda.atomic.add(cursor, ids[i], 1)] = i

    @kernel
    def chunk_counts(ids, seq, shift, mask, chunk, chunks, hist):
        """hist[d * chunks + c] = positions of chunk c of the sequence whose digit
        ``(ids[p] >> shift) & mask`` is d (a thread a chunk); ``seq`` the positions in
        order (empty: 0, 1, ..., ids.shape[0] - 1)."""
        n = seq.shape[0] if seq.shape[0] else ids.shape[0]
        for c in range(cuda.grid(1), chunks, cuda.gridsize(1)):
            for j in range(c * chunk, min(n, (c + 1) * chunk)):
                p = seq[j] if seq.shape[0] else j
                hist[((ids[p] >> shift) & mask) * chunks + c] += 1

    @kernel
    def chunk_starts(hist, chunks, n, starts):
        for g in range(cuda.grid(1), starts.shape[0], cuda.gridsize(1)):
            starts[g] = hist[g * chunks] if g < starts.shape[0] - 1 else n

    @kernel
    def chunk_place(ids, seq, shift, mask, chunk, chunks, hist, order):
        """Chunk c's positions, in sequence order, at their digit's next offset (hist
        scanned): one stable counting-sort pass (see :func:`chunk_counts`)."""
        n = seq.shape[0] if seq.shape[0] else ids.shape[0]
        for c in range(cuda.grid(1), chunks, cuda.gridsize(1)):
            for j in range(c * chunk, min(n, (c + 1) * chunk)):
                p = seq[j] if seq.shape[0] else j
                at = ((ids[p] >> shift) & mask) * chunks + c
                order[hist[at]] = p
                hist[at] += 1

    @kernel
    def largest(counts, g, out):
        """out[0] = max(out[0], counts[:g])."""
        for i in range(cuda.grid(1), g, cuda.gridsize(1)):
            cuda.atomic.max(out, 0, counts[i])

    @kernel
    def sort_groups(order, starts):
        """Heapsort each group's positions (groups of one are skipped)."""
        for g in range(cuda.grid(1), starts.shape[0] - 1, cuda.gridsize(1)):
            lo = starts[g]
            n = starts[g + 1] - lo
            if n > 1:
                for root in range(n // 2 - 1, -1, -1):
                    sift_down(order, lo, root, n)
                for end in range(n - 1, 0, -1):
                    order[lo], order[lo + end] = order[lo + end], order[lo]
                    sift_down(order, lo, 0, end)

    @kernel
    def accum_groups(slots, mask, keys, order, starts, values, spill, split, old, new, exists,
                     rows, inserted, alloc, free_rows, n_free, fresh):
        for g in range(cuda.grid(1), starts.shape[0] - 1, cuda.gridsize(1)):
            accum_group(slots, mask, keys, order, starts[g], starts[g + 1], values, spill, split,
                        old, new, exists, rows, inserted, alloc, free_rows, n_free, fresh)

    # ---- scans and compaction (per-block counts, host prefix, block-wide scan) -------------
    @kernel
    def scan_blocks(a, chunk, sums):
        """In place exclusive scan of each block's chunk of ``a``; sums[b] = chunk total."""
        buf = cuda.shared.array(threads, np.int64)
        blk = cuda.blockIdx.x
        lo = blk * chunk
        hi = min(a.shape[0], lo + chunk)
        carry = 0
        for base in range(lo, lo + chunk, threads):
            j = base + cuda.threadIdx.x
            v = a[j] if j < hi else 0
            pre, tot = block_scan(buf, v)
            if j < hi:
                a[j] = carry + pre
            carry += tot
        if cuda.threadIdx.x == 0:
            sums[blk] = carry

    @kernel
    def add_offsets(a, chunk, offsets):
        for j in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
            a[j] += offsets[j // chunk]

    @kernel
    def count_full(slots, chunk, counts):
        """``counts[b]`` = the full slots in block b's chunk (a full slot's row word is >= 0,
        ``is_full``)."""
        count_block(cuda.shared.array(threads, np.int64), slots, slots.shape[0] // 2, 2, 1,
                    chunk, counts)

    @kernel
    def write_full(slots, chunk, offsets, keys, rows):
        buf = cuda.shared.array(threads, np.int64)
        blk = cuda.blockIdx.x
        lo = blk * chunk
        hi = min(slots.shape[0] // 2, lo + chunk)
        at = offsets[blk]
        for base in range(lo, lo + chunk, threads):
            s = base + cuda.threadIdx.x
            word = slots[2 * s + 1] if s < hi else -1
            flag = 1 if s < hi and full(word) else 0
            pre, tot = block_scan(buf, flag)
            if flag:
                keys[at + pre] = slots[2 * s]
                rows[at + pre] = word
            at += tot

    @kernel
    def count_nonneg(a, chunk, counts):
        """``counts[b]`` = the entries >= 0 in block b's chunk."""
        count_block(cuda.shared.array(threads, np.int64), a, a.shape[0], 1, 0, chunk, counts)

    @kernel
    def write_nonneg(a, chunk, offsets, out):
        buf = cuda.shared.array(threads, np.int64)
        blk = cuda.blockIdx.x
        lo = blk * chunk
        hi = min(a.shape[0], lo + chunk)
        at = offsets[blk]
        for base in range(lo, lo + chunk, threads):
            j = base + cuda.threadIdx.x
            v = a[j] if j < hi else -1
            flag = 1 if v >= 0 else 0
            pre, tot = block_scan(buf, flag)
            if flag:
                out[at + pre] = v
            at += tot

    # ---- optimizer steps: a batch's gradient rows summed per id and applied ----------------
    # One tile of lanes per distinct id: each lane sums its block of columns
    # of the id's positions' gradient rows, in batch order from zero (segment_sum's bits),
    # then runs the CPU's own row body (jit_kernels.optimizers) on those columns: the bodies
    # are element-wise, so a block of the row's columns is a row to them.
    sgd_row, adagrad_row = _body(_opt.sgd_row), _body(_opt.adagrad_row)
    adam_row, ftrl_row = _body(_opt.adam_row), _body(_opt.ftrl_row)
    rmsprop_row = _body(_opt.rmsprop_row)

    @jit(device=True)
    def group_sum(grads, order, lo, hi, acc, c0, c1):
        """acc[c] = the sum from zero, in order, of grads[order[lo:hi], c], added in a
        register: ``acc[c] +=`` in the loop went through memory each time (the compiler
        cannot tell ``acc`` from ``grads``), a wait per position of a hot id's group."""
        for c in range(c0, c1):
            acc[c] = 0
            s = acc[c]      # acc's zero: a sum from the first row would keep a lone -0.0
                            # that segment_sum's sum from zero makes +0.0
            for p in range(lo, hi):
                s += grads[order[p], c]
            acc[c] = s

    # uniform adapters: (weights, slots a b c, gradient, hyper-parameters h, flag)
    @jit(device=True)
    def sgd(w, a, b, c, g, h, flag):
        sgd_row(w, a, g, h[0], h[1], flag)

    @jit(device=True)
    def adagrad(w, a, b, c, g, h, flag):
        adagrad_row(w, a, g, h[0], h[1])

    @jit(device=True)
    def adam(w, a, b, c, g, h, flag):
        adam_row(w, a, b, c, g, h[0], h[1], h[2], h[3], flag)

    @jit(device=True)
    def ftrl(w, a, b, c, g, h, flag):
        ftrl_row(w, a, b, g, h[0], h[1], h[2], h[3], h[4], h[5])

    @jit(device=True)
    def rmsprop(w, a, b, c, g, h, flag):
        rmsprop_row(w, a, b, c, g, h[0], h[1], h[2], h[3], flag)

    def update_kernel(rule):
        def update(w, ws, wn, a, as_, an, b, bs, bn, c, cs, cn, rows, grads, order, starts,
                   acc, h, flag, log_t):
            """Row ``rows[i]`` updated by group ``i``'s summed rows (``starts`` empty: by
            ``grads[i]``); each column given as (head, tail, split), see SplitRows."""
            tid = cuda.grid(1)
            lanes = 1 << log_t
            lane = tid & (lanes - 1)
            # this lane's columns [c0, c1) of the row, a contiguous block
            per = (grads.shape[1] + lanes - 1) >> log_t
            c0 = min(lane * per, grads.shape[1])
            c1 = min(c0 + per, grads.shape[1])
            for i in range(tid >> log_t, rows.shape[0], cuda.gridsize(1) >> log_t):
                r = rows[i]
                if r < 0:               # an id a bounded table did not admit: dropped
                    continue
                if starts.shape[0] == 0:
                    g = grads[i, c0:c1]
                else:
                    group_sum(grads, order, starts[i], starts[i + 1], acc[i], c0, c1)
                    g = acc[i, c0:c1]
                # the views are made here: a CUDA device function may return only an
                # argument array, not a view of one
                rw = w[r, c0:c1] if r < wn else ws[r - wn, c0:c1]
                ra = a[r, c0:c1] if r < an else as_[r - an, c0:c1]
                rb = b[r, c0:c1] if r < bn else bs[r - bn, c0:c1]
                rc = c[r, c0:c1] if r < cn else cs[r - cn, c0:c1]
                rule(rw, ra, rb, rc, g, h, flag)
        return jit(update)

    for name, rule in (("sgd", sgd), ("adagrad", adagrad), ("adam", adam), ("ftrl", ftrl),
                       ("rmsprop", rmsprop)):
        kernels[name + "_groups"] = update_kernel(rule)

    @kernel
    def group_counts(ids, counts):
        for i in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
            cuda.atomic.add(counts, ids[i], 1)

    @kernel
    def group_heads(keys, order, starts, out):
        """out[g] = the key of group g (its first position's)."""
        for g in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[g] = keys[order[starts[g]]]

    from .cuda_bounded import add_kernels       # a bounded table's (bounded_*)
    add_kernels(kernels, cuda, _body, copy_row, init_cols, init_both)
    from .cuda_buckets import add_kernels as add_bucket_kernels     # bucket_*
    add_bucket_kernels(kernels, cuda, _body, lookup_with)
    from .cuda_columns import add_kernels as add_column_kernels     # column_*
    add_column_kernels(kernels, cuda, _body)
    from .cuda_exchange import add_kernels as add_exchange_kernels   # exchange_*
    add_exchange_kernels(kernels, cuda, _body, group_sum)
    return type("Kernels", (), kernels)
