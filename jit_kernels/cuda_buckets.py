"""CUDA drivers of a bucketed bounded table: :mod:`jit_kernels.bucket_bounded` and
:mod:`jit_kernels.bucket_reads` on the GPU.

Same names, arguments and results (Numba device arrays where they take numpy
arrays) and the same bodies: a thread runs ``_find_pass`` and ``_pass`` (scalar code
on a GPU: :func:`jit_kernels.lanes.vectors` is False there) over the positions of a
*stretch* of buckets in batch order, as a CPU thread does.  The CPU cuts the index into
one stretch a core; a GPU runs one a bucket (:func:`stretches_for`), so a batch of
``n`` keys into a table of ``c`` slots runs ``c / 32`` threads of about ``32 n / c``
positions each.  The result does not depend on the stretches: a CUDA bucketed table
holds the keys, rows and scores of a CPU one after the same calls
(``tests/numbaemb/test_cuda_bounded.py``).  A call around the kernels:

1. ``homes``: each key's bucket and digest; ``cuda_table.group_positions``: the
   positions grouped by stretch (a stable counting sort); ``to_stretches``: the keys
   in that order;
2. ``passes``: a thread a stretch (find, hold, insert or evict);
3. ``from_stretches``: the results in batch order; in a *fill* (the call cannot fill
   the table) the new rows are handed out in batch order (``hand_rows``, over the
   compacted positions that took one) and ``settle`` gives repeats their key's row
   and puts the score copies back; the evictions are compacted in batch order.

A lookup is one kernel, the linear index's with the bucket's find (a tile of lanes a
key: each lane finds, then copies its columns of the row or of the initial value);
removal runs on one thread (a slot's digest shares its word with 7 others); a
checkpoint's keys are placed on the host (:func:`jit_kernels.buckets.place_all`,
the CPU's serial order).  Unmeasured on a GPU so far.  Nothing here imports
``numba.cuda`` until a driver is first called.

Example (needs a GPU or the simulator, so not a doctest)::

    taken, n_ev, size = bucket_insert_ranges(
        slots, mask, keys, given, scores, mscore, mark, batch, MAX, rows, where, inserted,
        present, free_rows, n_free, fresh_start, size, stretches_for(cap), limit, LRU, 0,
        clock, True, ev_keys, ev_rows)
"""
import numpy as np

from . import bucket_bounded as bb
from . import bucket_reads as br
from . import buckets as kb
from . import cuda_table as ct
from .cuda_bounded import _pair, absent_count
from .cuda_kernels import registrar
from .probing import nth_row as nth_row_cpu

__all__ = ["bucket_insert", "bucket_insert_ranges", "stretches_for", "find_rows", "lookup",
           "erase_keys", "place_all", "empty_buckets"]

cuda = None      # numba.cuda, bound by add_kernels (a global: the simulator swaps it)


def stretches_for(capacity):
    """Stretches a GPU call is cut into: one a bucket of an index of ``capacity`` slots."""
    return max(1, capacity // kb.BUCKET)


def add_kernels(kernels, cuda_module, body, lookup_with):
    """Add the bucketed table's kernels (``bucket_*``) to ``kernels`` (called by
    :func:`jit_kernels.cuda_kernels.build`, which passes its lookup kernel's maker)."""
    global cuda
    cuda = cuda_module
    find_pass, run_pass = body(bb._find_pass), body(bb._pass)
    homes_of, find_row = body(bb.homes_of), body(br.find_row)
    settle_one, nth_row = body(bb.settle), body(nth_row_cpu)
    erase = body(kb.erase)
    ring_n, nb_bits, standin = 2 * bb.LEAD, kb.BUCKET.bit_length() - 1, bb.STANDIN

    kernel = registrar(kernels, "bucket_")

    @kernel
    def homes(keys, mask, hs, group):
        """``hs[i]``: ``homes_of(keys[i])``; ``group[i]``: its bucket's number."""
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            h = homes_of(keys[i], mask)
            hs[i] = h
            group[i] = (h >> 8) >> nb_bits

    @kernel
    def to_stretches(order, keys, given, hs, k2, g2, h2):
        for t in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
            i = order[t]
            k2[t], g2[t], h2[t] = keys[i], given[i], hs[i]

    @kernel
    def passes(starts, find_first, slots, mask, keys, homes, given, scores, mscore, mark,
               batch, hold, rows, where, inserted, found, fs, free_rows, n_free, fresh_start,
               size, limit, policy, epoch, clock, keep, ek, er, fill, out):
        """Thread g: positions ``starts[g]:starts[g + 1]`` (``find_first``: found and
        held first); ``out[g]`` = (rows taken, size after)."""
        ring = cuda.local.array(ring_n, np.int64)
        for g in range(cuda.grid(1), starts.shape[0] - 1, cuda.gridsize(1)):
            a, b = starts[g], starts[g + 1]
            if b > a:
                if find_first:
                    find_pass(a, b, slots, mask, keys, homes, rows, where, found, mscore, mark,
                              batch, hold)
                r = run_pass(a, b, slots, mask, keys, homes, given, scores, mscore, mark, batch,
                             hold, rows, where, inserted, fs, free_rows, n_free, fresh_start,
                             size, limit, policy, epoch, clock, keep, ek, er, fill, ring)
                out[g, 0], out[g, 1] = r

    @kernel
    def from_stretches(order, r2, w2, new2, p2, ek, er, fs, fill, rows, where, inserted,
                       present, made_at, ev_at, ekb, fsb):
        """Stretch order to batch order; ``made_at[i]`` / ``ev_at[i]``: i where position
        i took a new row (a fill) / evicted, else -1."""
        for t in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
            i = order[t]
            rows[i], where[i], inserted[i], present[i] = r2[t], w2[t], new2[t], p2[t]
            made_at[i] = i if fill and new2[t] and r2[t] >= standin else -1
            ev_at[i] = i if er[t] >= 0 else -1
            ekb[i] = ek[t]
            if fill:
                fsb[i] = fs[t]

    @kernel
    def hand_rows(made, slots, rows, where, scores, fsb, free_rows, n_free, fresh_start):
        """The j-th position of ``made`` (batch order) takes the j-th new row."""
        for j in range(cuda.grid(1), made.shape[0], cuda.gridsize(1)):
            i = made[j]
            r = nth_row(free_rows, n_free, fresh_start, j)
            slots[2 * where[i] + 1] = r
            scores[r] = fsb[i]
            rows[i] = r

    @kernel
    def settle(slots, rows, where, scores, mscore, hold):
        """A repeat of a fill's new key takes its row; the held slots' score copies go
        back (``hold`` MAX: the call marked its keys)."""
        for i in range(cuda.grid(1), rows.shape[0], cuda.gridsize(1)):
            settle_one(slots, rows, where, scores, mscore, hold, i)

    @kernel
    def evicted_at(er, at):
        for i in range(cuda.grid(1), er.shape[0], cuda.gridsize(1)):
            at[i] = i if er[i] >= 0 else -1

    @kernel
    def take_evicted(sel, ek, rows, ev_keys, ev_rows):
        """The victim's row is the evicting key's."""
        for j in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
            ev_keys[j], ev_rows[j] = ek[sel[j]], rows[sel[j]]

    @kernel
    def find_rows(slots, mask, keys, rows):
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            rows[i] = find_row(slots, mask, keys[i])

    kernels["bucket_lookup"] = cuda.jit(lookup_with(find_row))  # (cuda_table's, the bucket's find)

    @kernel
    def erase_serial(slots, mask, keys, freed):
        if cuda.grid(1) == 0:
            for i in range(keys.shape[0]):
                freed[i] = erase(slots, mask, keys[i])


# ---- drivers (the names and arguments of bucket_bounded / bucket_reads) ------------------
def _k():
    return ct._kernels()


def _scratch(scratch):
    return scratch[0] if scratch is not None else ct.Scratch()


def _passes(starts, call, sc, results=True):
    """Launch ``passes`` a thread a stretch of ``starts``; with ``results`` its (g, 2)
    results on the host (a wait for the GPU; a call in stretches needs none)."""
    g = starts.shape[0] - 1
    out = sc.array("k_res", 2 * max(g, 1), np.int64).reshape((max(g, 1), 2))
    ct._go(_k().bucket_passes, g, starts, *call, out)
    return out.copy_to_host()[:g] if results else None


def _evictions(at, ek, rows, ev_keys, ev_rows, sc):
    """Compact the evicting positions ``at`` (batch order) into ``ev_keys`` / ``ev_rows``;
    returns how many."""
    sel = sc.array("k_sel", at.shape[0], np.int64)
    c = ct.compact_nonneg(at, sel, scratch=sc)
    ct._go(_k().bucket_take_evicted, c, sel[:c], ek, rows, ev_keys, ev_rows)
    return c


def bucket_insert(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
                  inserted, free_rows, n_free, fresh_start, size, limit, policy, epoch, clock,
                  keep, ev_keys, ev_rows, scratch=None):
    """See :func:`jit_kernels.bucket_bounded.bucket_insert` (one GPU thread, batch order;
    ``scratch``: a shard's sequence of scratches, the first used)."""
    K, sc, n = _k(), _scratch(scratch), keys.shape[0]
    if not n:
        return 0, 0, size
    hs, group = sc.array("k_hs", n, np.int64), sc.array("k_group", n, np.int64)
    ct._go(K.bucket_homes, n, keys, mask, hs, group)
    ek, er = sc.array("k_ek", n, np.int64), sc.array("k_er", n, np.int64)
    no = sc.array("k_none", 1, np.int64)
    call = (False, slots, mask, keys, hs, given, scores, mscore, mark, batch, hold, rows,
            where, inserted, inserted, no, free_rows, n_free, fresh_start, size, limit, policy,
            epoch, clock, keep, ek, er, False)
    taken, size = (int(x) for x in _passes(_pair(0, n, sc, "k_starts"), call, sc)[0])
    at = sc.array("k_at", n, np.int64)
    ct._go(K.bucket_evicted_at, n, er, at)
    return taken, _evictions(at, ek, rows, ev_keys, ev_rows, sc), size


def bucket_insert_ranges(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows,
                         where, inserted, present, free_rows, n_free, fresh_start, size,
                         n_stretches, limit, policy, epoch, clock, keep, ev_keys, ev_rows,
                         scratch=None):
    """See :func:`jit_kernels.bucket_bounded.bucket_insert_ranges` (``n_stretches``: the
    CPU's cut; a GPU runs :func:`stretches_for` instead, the same result)."""
    K, sc, n = _k(), _scratch(scratch), keys.shape[0]
    fill = size < limit
    hs, group = sc.array("k_hs", n, np.int64), sc.array("k_group", n, np.int64)
    ct._go(K.bucket_homes, n, keys, mask, hs, group)
    order, starts = ct.group_positions(group, stretches_for(mask + 1), sc)
    k2, g2, h2, r2, w2, ek, er, fs = (sc.array("k_" + name, n, np.int64) for name in
                                      ("k2", "g2", "h2", "r2", "w2", "ek", "er", "fs"))
    new2, p2 = sc.array("k_new2", n, np.bool_), sc.array("k_p2", n, np.bool_)
    ct._go(K.bucket_to_stretches, n, order, keys, given, hs, k2, g2, h2)
    top = limit if not fill else 1 << 62            # (a fill: never full in a stretch)
    call = (True, slots, mask, k2, h2, g2, scores, mscore, mark, batch, hold, r2, w2, new2,
            p2, fs, free_rows, 0, 0, 0 if fill else limit, top, policy, epoch, clock, keep,
            ek, er, fill)
    _passes(starts, call, sc, results=False)
    made_at, at = sc.array("k_made_at", n, np.int64), sc.array("k_at", n, np.int64)
    ekb, fsb = sc.array("k_ekb", n, np.int64), sc.array("k_fsb", n, np.int64)
    ct._go(K.bucket_from_stretches, n, order, r2, w2, new2, p2, ek, er, fs, fill, rows,
           where, inserted, present, made_at, at, ekb, fsb)
    taken = 0
    if fill:
        made = sc.array("k_made", n, np.int64)
        taken = ct.compact_nonneg(made_at, made, scratch=sc)
        ct._go(K.bucket_hand_rows, taken, made[:taken], slots, rows, where, scores, fsb,
               free_rows, n_free, fresh_start)
    ct._go(K.bucket_settle, n, slots, rows, where, scores, mscore, hold)
    return taken, _evictions(at, ekb, rows, ev_keys, ev_rows, sc), size + taken


def find_rows(slots, mask, keys, rows):
    """``rows[i]`` = the row of ``keys[i]`` or -1; returns how many are -1."""
    ct._go(_k().bucket_find_rows, keys.shape[0], slots, mask, keys, rows)
    return absent_count(rows)


def lookup(slots, mask, keys, values, out, exists, kind, a, b, seed, const):
    """See :func:`jit_kernels.bucket_reads.lookup`: ``out[i]`` = the row of ``keys[i]``
    or its initial value, ``exists[i]`` which."""
    ct._rows(_k().bucket_lookup, keys.shape[0], out.shape[1], slots, mask, keys,
             *ct._split(values), out, exists, kind, a, b, seed, const,
             cols_per_lane=ct.COLS_PER_LANE_PROBING)


def erase_keys(slots, mask, keys, freed):
    """See :func:`jit_kernels.bucket_reads.erase_keys` (one GPU thread)."""
    if keys.shape[0]:
        _k().bucket_erase_serial[1, 1](slots, mask, keys, freed)


def empty_buckets(capacity):
    """A fresh bucketed index of ``capacity`` slots in device memory."""
    return ct.cuda_api().to_device(kb.empty_buckets(capacity))


def place_all(pairs, slots, mask, over):
    """See :func:`jit_kernels.buckets.place_all` (``pairs`` / ``slots`` device arrays,
    ``over`` a host one; placed on the host, in the CPU's order, and copied back)."""
    host = slots.copy_to_host()
    full = kb.place_all(pairs.copy_to_host(), host, mask, over)
    slots.copy_to_device(host)
    return full
