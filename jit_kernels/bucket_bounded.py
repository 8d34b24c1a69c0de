"""Inserts into a bounded table with a bucketed index: the lowest score of a bucket goes.

The scores, the policies and the call's bookkeeping (``mscore``, ``mark``, ``hold``,
:func:`jit_kernels.bounded.find_present` before a call and ``restore_scores`` after
it) are those of :mod:`jit_kernels.bounded`; the index is :mod:`jit_kernels.buckets`'s
and a key's window is its bucket.  A call runs its positions in batch order.  A key
absent when the call started and not inserted by an earlier position of it is *new*:

* while the table holds fewer than ``limit`` keys it takes the first free slot of its
  bucket and a new row;
* when the table is full, or its bucket is (an early eviction, as in HierarchicalKV:
  a bucket holds 32 keys, the table about 16 a bucket on average when full), it takes
  the slot and the row of the lowest-scored key of its bucket that is not the call's
  (the first on ties), and that key is evicted and reported, unless the new key's own
  score is lower or no such key is there: then it is not admitted (row -1).

No key moves and nothing leaves a tombstone.  Buckets do not share slots, rows or
scores, so :func:`bucket_insert_ranges` runs stretches of buckets on all threads (the
find, the inserts and the scores put back in one kernel) into a full table, or into
one that the call cannot fill (a *fill*: a new key's row is handed out after the pass,
in batch order), with the result of ``find_present``, :func:`bucket_insert` (the
serial pass) and ``restore_scores``, whatever the threads.  100k new keys into a
full 1M-key table took 1.43x the unbounded table's time (median; 2 threads; session
40 in ``benchmarks/HISTORY.md``).

>>> import numpy as np
>>> from jit_kernels.buckets import empty_buckets
>>> from jit_kernels.bounded import MARK, MAX, LRU, find_present
>>> slots, scores = empty_buckets(32), np.zeros(4, np.int64)     # one bucket
>>> mscore, mark = np.full(32, MAX), np.zeros(32, MARK)
>>> keys = np.array([5, 6, 7]); rows, where = np.empty(3, np.int64), np.empty(3, np.int64)
>>> find_present(slots, 31, keys, rows, where, mscore, mark, 1, MAX)
>>> new, ek, er = np.empty(3, np.bool_), np.empty(3, np.int64), np.empty(3, np.int64)
>>> bucket_insert(slots, 31, keys, np.zeros(3, np.int64), scores, mscore, mark, 1, MAX,
...               rows, where, new, np.empty(0, np.int64), 0, 0, 0, 2, LRU, 0, 1, False,
...               ek, er)                       # (rows taken, keys evicted, size after)
(2, 0, 2)
>>> int(rows[2])                                # full, and 5 and 6 are the call's own
-1
"""
import numpy as np
from numba import njit, prange

from ._inner import inner
from .bounded import CUSTOM, MAX, touched
from .bounded_groups import REPORT_CHUNK, SORT_BLOCKS, block_places
from .buckets import BUCKET, digests, free_slot, home, lowest, match, set_digest
from .cpu_table import prefetch_read, prefetch_write
from .lanes import low32, vectors
from .probing import nth_row

__all__ = ["bucket_insert", "bucket_insert_ranges", "by_stretch", "homes_of", "victim",
           "STANDIN"]

STANDIN = np.int64(1) << 52     # a fill's new key's row until rows are handed out:
# STANDIN + its position (rows are below it: a bounded table holds at most 2**48 keys)
_ROW = (np.int64(1) << 56) - 1  # bucket_insert_ranges' word a position: its row + 1 ...
_EV, _WAS, _NEW = 57, 58, 59    # ... and bits: it evicted, it was present, it inserted
LEAD = 8                        # positions the pass looks ahead (see _ahead)


@inner(inline="always")
def victim(slots, o, mscore, mark, batch, hold):
    """``(slot, score)`` of the lowest-scored key of the bucket at ``o`` that is not the
    call's (first on ties), or ``(-1, hold)``: reads the score copies (``mscore``; the
    call's keys and the free slots read ``hold`` / ``MAX`` there), 32 at a time in
    vectors on the CPU; a key scored ``MAX`` is looked for by its mark when ``hold``
    is ``MAX``."""
    if vectors():
        low, j = low32(mscore, o)
        below = low < hold
        best = o + j if below else np.int64(-1)
        best_score = low if below else hold
    else:
        best, best_score = np.int64(-1), hold
        for j in range(BUCKET):
            sc = mscore[o + j]
            better = sc < best_score
            best = o + j if better else best
            best_score = sc if better else best_score
    if best < 0 and hold == MAX:
        for j in range(BUCKET):
            s = o + j
            if slots[2 * s + 1] >= 0 and mark[s] != batch:
                return s, MAX
    return best, best_score


@inner
def homes_of(key, mask):
    """``key``'s bucket and digest in one int64: ``o << 8 | d`` (see
    :func:`jit_kernels.buckets.home`)."""
    o, d = home(key, mask)
    return (o << 8) | d


@inner(inline="always")
def _ahead(t, b, slots, mask, homes, rows, scores, mscore, mark, marks, full, ring):
    """Requests of :func:`_pass` for later positions (``homes`` / ``rows`` as there):
    ``2 * LEAD`` on, a present key's score or a new key's digests and score copies (and
    marks); ``LEAD`` on, the slot the new key would take (the victim, when ``full``) is
    kept in ``ring`` and its line requested; ``LEAD / 2`` on, that slot's score."""
    if t + 2 * LEAD < b:
        if rows[t + 2 * LEAD] >= 0:
            prefetch_write(scores, 8 * rows[t + 2 * LEAD])
        else:
            o = homes[t + 2 * LEAD] >> 8
            prefetch_write(slots, 8 * (2 * (mask + 1) + (o >> 2)))
            for c in range(0, 8 * BUCKET, 64):
                prefetch_write(mscore, 8 * o + c)
            if marks:
                prefetch_write(mark, o)
    if t + LEAD < b:
        v = np.int64(-1)
        if rows[t + LEAD] < 0:
            o = homes[t + LEAD] >> 8
            v = low32(mscore, o)[1] + o if full and vectors() else free_slot(slots, mask, o)
            prefetch_write(slots, 16 * v)
        ring[(t + LEAD) % (2 * LEAD)] = v
    if full and t + LEAD // 2 < b:
        v = ring[(t + LEAD // 2) % (2 * LEAD)]
        if v >= 0 and slots[2 * v + 1] >= 0:
            prefetch_write(scores, 8 * slots[2 * v + 1])


@inner
def _pass(a, b, slots, mask, keys, homes, given, scores, mscore, mark, batch, hold, rows,
          where, inserted, fs, free_rows, n_free, fresh_start, size, limit, policy, epoch,
          clock, keep, ek, er, standin, ring):
    """Positions t in ``[a, b)`` in that order (see the module doc and
    :func:`bucket_insert`): ``keys[t]``, ``homes[t]`` (:func:`homes_of`), the custom
    score ``given[t]``.  ``rows`` / ``where`` / ``inserted`` / ``ek`` / ``er`` / ``fs``
    are indexed by t too (``rows`` / ``where`` come from a find:
    -2 / -1 absent; they get the results; ``er[t]`` / ``ek[t]``: the row and key it
    evicted, -1: none).  ``standin``: a fill in stretches, a new key's row is
    ``STANDIN + t`` and its score waits in ``fs[t]`` (repeats touch it there);
    ``ring``: ``2 * LEAD`` int64 of work space.  Returns ``(rows taken, size after)``.
    One body for the CPU and the GPU (:mod:`jit_kernels.cuda_buckets`)."""
    taken = 0
    marks = hold == MAX             # the call marks its keys (else its scores hold them)
    for j in range(2 * LEAD):
        ring[j] = -1                # (no slot foreseen yet)
    for t in range(a, b):
        _ahead(t, b, slots, mask, homes, rows, scores, mscore, mark, marks, size >= limit,
               ring)
        key = keys[t]
        inserted[t] = False
        er[t] = -1
        if rows[t] >= 0:            # present when the call started
            r = rows[t]
            scores[r] = touched(policy, scores[r], given[t], epoch, clock, False, keep)
            continue
        o, d = homes[t] >> 8, homes[t] & 255
        s = match(slots, mask, o, d, key)
        if s >= 0:                  # a repeat of a key this call inserted
            r = slots[2 * s + 1]
            rows[t] = r
            where[t] = s
            if r >= STANDIN:
                p = r - STANDIN
                fs[p] = touched(policy, fs[p], given[t], epoch, clock, False, keep)
            else:
                scores[r] = touched(policy, scores[r], given[t], epoch, clock, False, keep)
            continue
        score = touched(policy, np.int64(0), given[t], epoch, clock, True, keep)
        s = free_slot(slots, mask, o) if size < limit else np.int64(-1)
        if s >= 0:                  # room: a new row
            if standin:
                r = STANDIN + t
                fs[t] = score
            else:
                r = nth_row(free_rows, n_free, fresh_start, taken)
                scores[r] = score
            taken += 1
            size += 1
        else:                       # the victim's slot and row
            s, s_score = victim(slots, o, mscore, mark, batch, hold)
            while s >= 0 and slots[2 * s + 1] < 0:      # a stale copy: that slot is free
                mscore[s] = MAX
                s, s_score = victim(slots, o, mscore, mark, batch, hold)
            if s < 0 or score < s_score:
                rows[t] = -1
                where[t] = -1
                continue
            r = slots[2 * s + 1]
            ek[t] = slots[2 * s]
            er[t] = r
            scores[r] = score
            set_digest(slots, mask, s, 0)   # (the victim's key unpublished first)
        slots[2 * s] = key
        slots[2 * s + 1] = r
        set_digest(slots, mask, s, d)
        mscore[s] = hold
        if marks:
            mark[s] = batch
        rows[t] = r
        where[t] = s
        inserted[t] = True
    return taken, size


@inner(inline="always")
def settle(slots, rows, where, scores, mscore, hold, i):
    """Position ``i`` after a fill's rows are handed out: a stand-in row becomes its
    key's row; its slot's score copy goes back (``hold`` MAX: the call marked its
    keys).  One body for the CPU and the GPU."""
    s = where[i]
    if s >= 0:
        if rows[i] >= STANDIN:
            rows[i] = slots[2 * s + 1]
        if hold == MAX:
            mscore[s] = scores[slots[2 * s + 1]]


@inner
def _find_pass(a, b, slots, mask, keys, homes, rows, where, found, mscore, mark, batch, hold):
    """The find before :func:`_pass` on positions ``a ... b - 1`` (as ``find_present``;
    ``keys`` / ``homes`` / results indexed as there): ``rows[t]`` / ``where[t]`` = the
    row / slot of the key or -2 / -1, ``found[t]`` whether it is present; a present key
    is held (``mscore`` = ``hold``, marked when ``hold`` is ``MAX``), so no position of
    the call evicts it."""
    for t in range(a, b):
        if t + 2 * LEAD < b:
            o = homes[t + 2 * LEAD] >> 8
            prefetch_read(slots, 8 * (2 * (mask + 1) + (o >> 2)))
        if t + LEAD < b:
            o, d = homes[t + LEAD] >> 8, homes[t + LEAD] & 255
            m = digests(slots, mask, o, d)
            if m != 0:
                prefetch_read(slots, 16 * (o + lowest(m)))
                prefetch_write(mscore, 8 * (o + lowest(m)))
        s = match(slots, mask, homes[t] >> 8, homes[t] & 255, keys[t])
        where[t] = s
        rows[t] = -2 if s < 0 else slots[2 * s + 1]
        found[t] = s >= 0
        if s >= 0:
            if hold == MAX:
                mark[s] = batch
            mscore[s] = hold


@njit(nogil=True, cache=True)
def bucket_insert(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
                  inserted, free_rows, n_free, fresh_start, size, limit, policy, epoch, clock,
                  keep, ev_keys, ev_rows):
    """Find or insert every key of ``keys`` (n,) in batch order, evicting when full (the
    arguments as :func:`jit_kernels.bounded.bounded_insert`'s, without a window).

    ``rows`` / ``where`` come filled by ``find_present``; ``rows[i]`` gets the key's
    row or -1 (not admitted), ``where[i]`` its slot (-1: not admitted), ``inserted[i]``
    marks the position that inserted it; new rows come from ``free_rows[:n_free]`` (top
    down), then ``fresh_start`` on; ``ev_keys`` / ``ev_rows`` (n,) get the evicted keys
    and their rows in batch order.  Returns ``(rows taken, keys evicted, size after)``.
    """
    n = keys.shape[0]
    ek, er, hs = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    for i in range(n):
        hs[i] = homes_of(keys[i], mask)
    taken, size = _pass(0, n, slots, mask, keys, hs, given, scores, mscore,
                        mark, batch, hold, rows, where, inserted, ek[:0], free_rows, n_free,
                        fresh_start, size, limit, policy, epoch, clock, keep, ek, er, False,
                        np.empty(2 * LEAD, np.int64))
    m = 0
    for i in range(n):
        if er[i] >= 0:
            ev_keys[m] = ek[i]
            ev_rows[m] = er[i]
            m += 1
    return taken, m, size


@njit(nogil=True, cache=True, parallel=True)
def by_stretch(mask, keys, given, n_stretches, with_given):
    """``(rank, starts, keys2, homes2, given2)``: the positions grouped by the stretch of
    the index their key's bucket lies in (stretch g: buckets ``[g * nb / n_stretches,
    (g + 1) * nb / n_stretches)`` of the ``nb``), batch order in a stretch: position i
    goes to place ``rank[i]``, stretch g's places are ``starts[g]:starts[g + 1]``, and
    ``keys2`` / ``homes2`` / ``given2`` hold their keys, :func:`homes_of` and ``given``
    in that order (the passes read them in order and hash no key; ``given2`` is
    ``given`` unless ``with_given``: scores nobody reads).  A stable counting sort on
    all threads (blocks of positions counted per stretch, then placed)."""
    n = keys.shape[0]
    nb = (mask + 1) // BUCKET
    n_blocks = max(1, min(SORT_BLOCKS, n // 1024))
    step = (n + n_blocks - 1) // n_blocks
    ids, hs = np.empty(n, np.int64), np.empty(n, np.int64)
    place = np.zeros((n_blocks, n_stretches), np.int64)    # counts, then next places
    for c in prange(n_blocks):
        for i in range(c * step, min((c + 1) * step, n)):
            hs[i] = homes_of(keys[i], mask)
            g = ((hs[i] >> 8) // BUCKET) * n_stretches // nb
            ids[i] = g
            place[c, g] += 1
    starts = block_places(place)
    rank, k2, h2 = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    g2 = np.empty_like(given) if with_given else given
    for c in prange(n_blocks):
        for i in range(c * step, min((c + 1) * step, n)):
            t = place[c, ids[i]]
            rank[i], k2[t], h2[t] = t, keys[i], hs[i]
            if with_given:
                g2[t] = given[i]
            place[c, ids[i]] = t + 1
    return rank, starts, k2, h2, g2


@njit(nogil=True, cache=True, parallel=True)
def bucket_insert_ranges(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows,
                         where, inserted, present, free_rows, n_free, fresh_start, size,
                         n_stretches, limit, policy, epoch, clock, keep, ev_keys, ev_rows):
    """Find and insert on all threads, into a *full* table or one the call cannot fill
    (``size`` + the call's absent positions <= ``limit``), with the result of
    ``find_present``, :func:`bucket_insert` and ``restore_scores`` in a row.

    The index is cut into ``n_stretches`` stretches of whole buckets (one a thread or
    more); each finds and holds, then inserts, in batch order, the positions whose
    key's bucket lies in it (:func:`by_stretch`), into arrays in stretch order (a
    thread's own lines), and puts its keys' scores back beside the index.  Then the
    results go to batch order: ``rows`` / ``inserted`` as :func:`bucket_insert`'s (any
    contents before; ``where`` too, in a fill only), ``present[i]`` whether the key was
    in the table when the call started; in a fill the new rows are handed out then, in
    batch order, and a key's repeats get its row after.  Returns ``(rows taken, keys
    evicted, size after)``."""
    n = keys.shape[0]
    fill = size < limit
    rank, starts, k2, h2, g2 = by_stretch(mask, keys, given, n_stretches,
                                          policy == CUSTOM and not keep)
    r2, w2, new2 = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.bool_)
    p2, fs = np.empty(n, np.bool_), np.empty(n if fill else 0, np.int64)
    ek, er = np.empty(n, np.int64), np.empty(n, np.int64)
    top = limit if not fill else np.int64(1) << 62      # (a fill: never full in a stretch)
    s0 = limit if not fill else 0
    for g in prange(n_stretches):
        a, b = starts[g], starts[g + 1]
        if b > a:
            _find_pass(a, b, slots, mask, k2, h2, r2, w2, p2, mscore, mark, batch, hold)
            _pass(a, b, slots, mask, k2, h2, g2, scores, mscore, mark, batch, hold,
                  r2, w2, new2, fs, free_rows, 0, 0, s0, top, policy, epoch, clock, keep, ek,
                  er, fill, np.empty(2 * LEAD, np.int64))
            for t in range(a, b):       # one word a position for the way back
                r, v = r2[t], w2[t]
                if hold == MAX and not fill and v >= 0:     # (a fill: after its rows)
                    mscore[v] = scores[slots[2 * v + 1]]
                r2[t] = (r + 1) | (np.int64(new2[t]) << _NEW) | (np.int64(p2[t]) << _WAS) \
                    | (np.int64(er[t] >= 0) << _EV)
    m_c = (n + REPORT_CHUNK - 1) // REPORT_CHUNK
    made, evs = np.zeros(m_c + 1, np.int64), np.zeros(m_c + 1, np.int64)
    for c in prange(m_c):               # a chunk's new rows (a fill) and evictions
        for i in range(c * REPORT_CHUNK, min((c + 1) * REPORT_CHUNK, n)):
            w = r2[rank[i]]
            made[c + 1] += (w & _ROW) > STANDIN and (w >> _NEW) & 1
            evs[c + 1] += (w >> _EV) & 1
    for c in range(m_c):
        made[c + 1] += made[c]
        evs[c + 1] += evs[c]
    for c in prange(m_c):               # in batch order: new rows, results, evictions
        k, e = made[c], evs[c]
        for i in range(c * REPORT_CHUNK, min((c + 1) * REPORT_CHUNK, n)):
            t = rank[i]
            w = r2[t]
            r = (w & _ROW) - 1
            if fill:
                where[i] = w2[t]
                if r >= STANDIN and (w >> _NEW) & 1:
                    r = nth_row(free_rows, n_free, fresh_start, k)
                    slots[2 * w2[t] + 1] = r
                    scores[r] = fs[t]
                    k += 1
            rows[i], inserted[i], present[i] = r, (w >> _NEW) & 1, (w >> _WAS) & 1
            if (w >> _EV) & 1:          # (the victim's row is the new key's)
                ev_keys[e], ev_rows[e] = ek[t], r
                e += 1
    if fill:
        for i in prange(n):             # (after: a repeat's row is its key's new one)
            settle(slots, rows, where, scores, mscore, hold, i)
    taken = made[m_c]
    return taken, evs[m_c], size + taken
