"""Inserts into a table of bounded size: eviction of the lowest-scored key of a window.

A bounded table never holds more than ``limit`` keys.  Each key has a *score*
(int64, in a row-aligned column) that the inserting kernel updates as it finds or
inserts the key (no extra probe):

=========  ===  ==================================================================
policy     id   score after a find or insert
=========  ===  ==================================================================
lru        0    the table's clock (one tick per inserting call)
lfu        1    occurrences so far (1 when inserted)
epoch_lru  2    ``epoch << 32 | clock`` (low 32 bits of the clock)
epoch_lfu  3    ``epoch << 32 | occurrences in this epoch``
custom     4    the caller's score for that position
=========  ===  ==================================================================

An absent key arriving when the table is full looks at the ``window`` index slots
from its home slot and takes the lowest-scored key there that is not in this call
(first on ties); if its own score is lower it is not admitted (row -1), else the
victim is evicted: its row is reused, its slot freed, and ``(key, row)`` is
reported so the caller can hand its values out first (HKV's ``insert_and_evict``).
The search reads ``mscore``, a copy of each slot's score beside the index (8 bytes
a slot, contiguous) that holds ``MAX`` for free slots and ``hold`` for the keys of
the running call (:func:`find_present` marks them, :func:`restore_scores` puts their
scores back after the call), so a window of 32 slots is four cache lines;
``mark`` (the call's number a slot, ``MARK`` = uint8: the caller clears the marks
and numbers calls from 1 again after ``MARK_CALLS`` calls) tells a call's key from one
scored ``MAX``.
``hold`` is ``MAX``, or, for LRU, the call's clock when it is above every score in
the table: then the call's keys' copies already hold their scores after the call
(LRU scores a key it finds or inserts with the clock; a fill in ranges, which keeps
the scores in ``mscore``, writes the clock there too) and :func:`restore_scores` has
nothing to do; such a call neither reads nor writes ``mark`` either (no other key
scores as high, and a mark counts only in the call that wrote it: calls are
numbered up, and ``mark`` moves with its key only in calls that hold at ``MAX``).
A victim's slot that the new key does not take is emptied by moving the later keys
of its run back (backward-shift deletion): evicting inserts leave no tombstones, so
the index is not rebuilt for them and probe sequences stay short.  The pass runs in
batch order, serially (:func:`bounded_insert`) or, into a full table or one the call
cannot fill, in ranges of the index on all threads (:func:`bounded_insert_ranges`,
the serial result of the call reordered by range, its few keys near a range's end
last, in shifted ranges and then serially): either way the result depends on the
table and the call, never on the threads.

>>> import numpy as np
>>> from jit_kernels.slots import empty_slots
>>> slots, scores = empty_slots(8), np.zeros(4, np.int64)
>>> mscore, mark = np.full(8, MAX), np.zeros(8, MARK)
>>> keys, rows, where = np.array([5, 6, 7]), np.empty(3, np.int64), np.empty(3, np.int64)
>>> find_present(slots, 7, keys, rows, where, mscore, mark, 1, MAX)
>>> new, ek, er = np.empty(3, np.bool_), np.empty(3, np.int64), np.empty(3, np.int64)
>>> out = bounded_insert(slots, 7, keys, np.zeros(3, np.int64), scores, mscore, mark, 1, MAX,
...                      rows, where, new, np.empty(0, np.int64), 0, 0, 0, 2, 8, LRU, 0, 1,
...                      False, ek, er)
>>> out[0], out[1], out[3]      # rows taken, keys evicted, size after: 7 evicted 5 or 6
(2, 0, 2)
>>> bool(rows[2] == -1)         # ... unless every candidate was touched by this call
True
>>> restore_scores(slots, 7, keys, where, scores, mscore)
>>> int((mscore < MAX).sum())   # the two keys' scores are back beside the index
2
"""
import numpy as np
from numba import njit, prange

from ._inner import inner
from .bounded_groups import REPORT_CHUNK, by_range, report, shifted
from .bounded_rows import AHEAD, init_copy, range_rows, slot_row_one
from .bounded_find import find_slot as _find, slot_ahead as _slot_ahead
from .bounded_stream import stream_lines, stream_share
from .cpu_table import prefetch_probe, prefetch_read, prefetch_write, rehash
from .lanes import WIDTH, low32, vectors
from .probing import nth_row
from .slots import DELETED, EMPTY, first_slot

__all__ = ["find_present", "forget", "restore_scores", "sync_meta", "bounded_insert",
           "bounded_insert_ranges", "absent_count", "init_copy", "rehash_serial", "ranges_for",
           "POLICIES", "LRU", "LFU", "EPOCH_LRU", "EPOCH_LFU", "CUSTOM", "MAX", "MARK",
           "MARK_CALLS"]

LRU, LFU, EPOCH_LRU, EPOCH_LFU, CUSTOM = 0, 1, 2, 3, 4
MARK = np.uint8      # a slot's call mark: 1 byte a slot (the index is made for the bound)
MARK_CALLS = 255     # calls numbered 1..255 between two clearings of the marks
POLICIES = {"lru": LRU, "lfu": LFU, "epoch_lru": EPOCH_LRU, "epoch_lfu": EPOCH_LFU,
            "custom": CUSTOM}
_LOW = np.int64(0xFFFFFFFF)
MAX = np.int64(np.iinfo(np.int64).max)
LEAD = 2             # positions a pass (_pass) looks ahead (see there): range passes
# of 100k new keys into a full 1M-key table took 6.6 / 6.2 / 6.0 / 6.3 ms with 8 / 4 / 2 / 1
# (a victim foreseen nearer its turn is dropped less often and checked against fewer
# positions; the windows' lines, requested 2 * LEAD on, still come in time)
SPEC = 8 * LEAD      # _pass's work space of foreseen victims and written spans (int64)


@inner
def touched(policy, old, given, epoch, clock, fresh, keep):
    """A key's score after this call finds it (``old``: its score) or inserts it;
    ``keep``: a custom-scored call without scores (an optimizer step) keeps a found
    key's score and gives a new one 0."""
    if policy == LRU:
        return clock
    if policy == LFU:
        return np.int64(1) if fresh else old + 1
    if policy == EPOCH_LRU:
        return (epoch << 32) | (clock & _LOW)
    if policy == EPOCH_LFU:
        if fresh or (old >> 32) != epoch:
            return (epoch << 32) | 1
        return old + 1 if (old & _LOW) < _LOW else old
    if keep:
        return np.int64(0) if fresh else old
    return given


@inner
def _probe(slots, mask, key, hi):
    """One pass along ``key``'s probe sequence: ``(its slot or -1, the first tombstone
    or empty slot before an empty one ends the sequence)``: where an absent key goes.
    ``hi >= 0``: the sequence stops before slot ``hi`` (the end of a range of the
    index another thread owns): ``(-1, -2)`` if it gets there (the key is not in the
    range, which in a full table is all that matters: its victim's slot comes before
    any free slot past the range)."""
    h = first_slot(key, mask)
    free = np.int64(-1)
    for t in range(mask + 1):
        if hi >= 0 and h + t >= hi:
            return np.int64(-1), np.int64(-2)
        s = (h + t) & mask
        w = slots[2 * s + 1]
        if w == EMPTY:
            return np.int64(-1), (s if free < 0 else free)
        if w == DELETED:
            if free < 0:
                free = s
        elif slots[2 * s] == key:
            return s, free
    return np.int64(-1), free


@inner
def _run_ends_before(slots, mask, v, hi):
    """Whether the run after slot ``v`` (the keys :func:`_vacate` may move) ends in an
    empty slot before slot ``hi``."""
    for t in range(1, mask + 1):
        if v + t >= hi:
            return False
        if slots[2 * ((v + t) & mask) + 1] == EMPTY:
            return True
    return False


@inner
def _lower(mscore, s, best, best_score):
    """``(s, mscore[s])`` if slot ``s`` scores below ``best_score``, else ``(best,
    best_score)`` (selects, no branch)."""
    sc = mscore[s]
    better = sc < best_score
    return (s if better else best), (sc if better else best_score)


@inner
def _victim(slots, mask, key, window, mscore, mark, batch, hold):
    """``(slot, score)`` of the lowest-scored key of ``key``'s window not in this call,
    or -1 (reads ``mscore`` only, contiguous; the minimum is kept with selects, so the
    loop has no unpredictable branch; the call's keys read ``hold`` there, above every
    other key's score).  A slot freed since its copy was written may come back: the
    caller checks the slot and calls again.

    A window of a multiple of 32 slots that does not wrap (all but a few windows at
    the index's end) is searched 32 slots at a time in vector instructions
    (:func:`jit_kernels.lanes.low32`; about 3% of an evicting call; CPU only); other
    windows, and every window on a GPU, in two
    chains of selects side by side, the first half's minimum winning a tie (the
    same slot as one chain over the window, 25% faster: each select waits on the
    one before)."""
    h = first_slot(key, mask)
    if vectors() and window % WIDTH == 0 and h + window <= mask + 1:
        best, best_score = np.int64(-1), hold
        for o in range(h, h + window, WIDTH):
            low, t = low32(mscore, o)
            below = low < best_score        # (an earlier block wins a tie)
            best = o + t if below else best
            best_score = low if below else best_score
    else:
        q = window // 2
        b0, s0 = np.int64(-1), hold     # the first half: [h, h + q)
        b1, s1 = np.int64(-1), hold     # the rest: [h + q, h + window)
        for t in range(q):
            b0, s0 = _lower(mscore, (h + t) & mask, b0, s0)
            b1, s1 = _lower(mscore, (h + q + t) & mask, b1, s1)
        for t in range(2 * q, window):  # (an odd window's last slot)
            b1, s1 = _lower(mscore, (h + t) & mask, b1, s1)
        first = s0 <= s1
        best = b0 if first else b1
        best_score = s0 if first else s1
    if best < 0 and hold == MAX:     # none below the largest score: is there one at it?
        for t in range(window):
            s = (h + t) & mask
            if slots[2 * s + 1] >= 0 and mark[s] != batch:
                return s, MAX
    return best, best_score


@njit(nogil=True, cache=True, parallel=True)
def find_present(slots, mask, keys, rows, where, mscore, mark, batch, hold):
    """``rows[i]`` / ``where[i]`` = the row / slot of ``keys[i]``, or -2 / -1 when
    absent; every present key is marked as this call's (``mark[slot] = batch``,
    ``mscore[slot] = hold``), so no key of the call is a victim (parallel; before
    :func:`bounded_insert`)."""
    n = keys.shape[0]
    for i in prange(n):
        # requested ahead: the home slot of the key AHEAD on and, AHEAD / 2 on, the
        # slot's score copy and mark if the key sits there
        if i + AHEAD < n:
            prefetch_probe(slots, mask, keys[i + AHEAD], False)
        if i + AHEAD // 2 < n:
            h = _slot_ahead(slots, mask, keys[i + AHEAD // 2])
            if h >= 0:
                if hold == MAX:
                    prefetch_write(mark, h * mark.itemsize)
                prefetch_write(mscore, 8 * h)
        present_one(slots, mask, keys, rows, where, mscore, mark, batch, hold, i)


@inner
def present_one(slots, mask, keys, rows, where, mscore, mark, batch, hold, i):
    """:func:`find_present` for position ``i`` (the body the CUDA kernel runs too)."""
    s = _find(slots, mask, keys[i])
    where[i] = s
    rows[i] = -2 if s < 0 else slots[2 * s + 1]
    if s >= 0:
        if hold == MAX:
            mark[s] = batch
        mscore[s] = hold


@njit(nogil=True, cache=True)
def forget(slots, mask, keys, mscore):
    """``mscore`` of the slots of ``keys`` (those present) = ``MAX``: before they are
    removed (a stale copy would only cost the victim search a second look)."""
    for i in range(keys.shape[0]):
        forget_one(slots, mask, keys, mscore, i)


@inner
def forget_one(slots, mask, keys, mscore, i):
    s = _find(slots, mask, keys[i])
    if s >= 0:
        mscore[s] = MAX


@njit(nogil=True, cache=True, parallel=True)
def restore_scores(slots, mask, keys, where, scores, mscore):
    """After a call: the slot of each admitted key of ``keys`` gets its score in
    ``mscore`` again (``where``: each position's slot when placed, -1 if not admitted;
    a key that an eviction moved back is found again)."""
    n = where.shape[0]
    for i in prange(n):
        # requested ahead: the slot of the key AHEAD on and, AHEAD / 2 on, its score
        if i + AHEAD < n and where[i + AHEAD] >= 0:
            prefetch_read(slots, 16 * where[i + AHEAD])
            prefetch_write(mscore, 8 * where[i + AHEAD])
        if i + AHEAD // 2 < n and where[i + AHEAD // 2] >= 0:
            r = slots[2 * where[i + AHEAD // 2] + 1]
            if r >= 0:
                prefetch_read(scores, 8 * r)
        restore_one(slots, mask, keys, where, scores, mscore, i)


@inner
def restore_one(slots, mask, keys, where, scores, mscore, i):
    s = where[i]
    if s >= 0:
        if slots[2 * s] != keys[i] or slots[2 * s + 1] < 0:
            s = _find(slots, mask, keys[i])
        if s >= 0:
            mscore[s] = scores[slots[2 * s + 1]]


@njit(nogil=True, cache=True, parallel=True)
def sync_meta(slots, scores, mscore, mark):
    """``mscore[s]`` = the score of the key in slot s (``MAX`` if free), no call marks:
    rebuilt after the index is (a rehash, a load)."""
    for s in prange(mscore.shape[0]):
        sync_one(slots, scores, mscore, mark, s)


@inner
def sync_one(slots, scores, mscore, mark, s):
    r = slots[2 * s + 1]
    mscore[s] = scores[r] if r >= 0 else MAX
    mark[s] = 0


@inner
def _vacate(slots, mask, v, mscore, mark, marks):
    """Empty slot ``v`` without a tombstone: each later key of its run whose probe
    sequence passes the hole moves back into it (with its ``mscore``, and its ``mark``
    if ``marks``), leaving a hole where it was, until an empty slot ends the run.
    Returns the last slot written (the hole left empty)."""
    hole = v
    j = (v + 1) & mask
    w = slots[2 * j + 1]
    n = 0
    # (a loop with one exit: with a break Numba counted references to the arrays at
    # every call, 4% of an evicting call)
    while w != EMPTY and n < mask:
        if w >= 0 and ((j - first_slot(slots[2 * j], mask)) & mask) >= ((j - hole) & mask):
            slots[2 * hole] = slots[2 * j]
            slots[2 * hole + 1] = w
            mscore[hole] = mscore[j]
            if marks:
                mark[hole] = mark[j]
            hole = j
        j = (j + 1) & mask
        w = slots[2 * j + 1]
        n += 1
    slots[2 * hole + 1] = EMPTY
    mscore[hole] = MAX
    return hole


def rehash_serial(old_slots, new_slots, new_mask):
    """Every key of ``old_slots`` into ``new_slots``, placed serially in slot order."""
    rehash.serial(old_slots, new_slots, new_mask)


def absent_count(rows):
    """How many of ``rows`` (from :func:`find_present`) are negative: the call's
    positions whose key was absent when it started."""
    return int(np.count_nonzero(rows < 0))


DEFER_KEYS = 64      # keys a range defers before it defers every new key left
RANGE_SLOTS = 4096   # the fewest index slots a range of bounded_insert_ranges has
RANGES_MIN = 2048    # the fewest positions a call cuts into ranges


def ranges_for(capacity, window):
    """How many ranges :func:`bounded_insert_ranges` cuts an index of ``capacity``
    slots into (a power of two, each at least ``RANGE_SLOTS`` and 64 windows long, at
    most 1024 ranges; < 2: the serial pass only).  A function of the table alone."""
    n = capacity // max(RANGE_SLOTS, 64 * window)
    return min(1 << (n.bit_length() - 1), 1024) if n >= 2 else 1


@inner
def _pass(idx, a, b, slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
          inserted, free_rows, n_free, fresh_start, size, limit, window, policy, epoch, clock,
          keep, hi, stream, ev_keys, ev_rows, ev_pos, e0, deferred, held, spec):
    """Positions ``idx[a:b]`` of a call in that order (see :func:`bounded_insert`);
    evictions go to ``ev_keys`` / ``ev_rows`` / ``ev_pos`` (the evicting position) from
    ``e0`` on.  ``hi >= 0``: a range of the index ``[lo, hi)`` holding the home slots
    of the absent keys and the slots of the present ones of ``idx[a:b]``
    (:func:`bounded_insert_ranges`; the table is full): a new key whose window or
    vacated run would reach ``hi`` is deferred (``deferred[i]``, rows and
    where left -2 / -1), and so are its later repeats.  ``stream > 0``: the next range,
    ``[hi, hi + stream)``, which the same thread runs next (Numba hands each thread a
    stretch of consecutive ranges; the last range of a stretch streams another thread's
    first, a hint wasted, never a wrong result): its index lines are requested as the
    pass goes (:func:`jit_kernels.bounded_stream.stream_lines`).  ``held`` (``DEFER_KEYS``,) and
    ``spec`` (``SPEC``,) int64 are work space (the keys deferred so far; the victims
    foreseen for the next keys, taken when no key since wrote their window, see
    :func:`_foreseen`).  ``n_free < 0``: a fill in ranges (the table
    cannot fill in this call, see :func:`bounded_insert_ranges`): a new key's row is
    its slot for now, and a new key whose probe sequence reaches ``hi`` is deferred.
    Returns ``(rows taken, keys evicted, tombstones made minus consumed, size after,
    positions deferred)``.  One body for the CPU and the GPU
    (:mod:`jit_kernels.cuda_bounded`; its prefetches are no-ops there)."""
    taken = 0
    n_ev = 0
    d_deleted = 0
    n_def = 0
    F = 2 * LEAD
    marks = hold == MAX             # the call marks its keys (else its scores hold them)
    for q in range(F):
        spec[q] = -1                # no victim foreseen
        spec[3 * F + q] = 0         # no slots written
    per = stream_share(stream, b - a)
    for t in range(a, b):
        if per > 0:
            stream_lines(slots, mscore, hi, stream, (t - a) * per, per)
        # a serial pass: overlap the next keys' cache misses.  2 * LEAD keys ahead:
        # their probes and victim windows; LEAD ahead: the victim each would take now
        # (the keys between rarely change it), its slot; LEAD / 2 ahead: its score row
        if t + 2 * LEAD < idx.shape[0]:      # (in range mode: on into the next range)
            j = idx[t + 2 * LEAD]
            if rows[j] >= 0:
                prefetch_write(scores, rows[j] * 8)
            else:
                h = first_slot(keys[j], mask)
                prefetch_write(slots, 16 * h)
                if marks:
                    prefetch_write(mark, h * mark.itemsize)
                if size >= limit:
                    for off in range(8 * h, min(8 * (h + window), 8 * (mask + 1)), 64):
                        prefetch_write(mscore, off)
        if t + LEAD < b:
            j = idx[t + LEAD]
            spec[(t + LEAD) % F] = -1
            if size >= limit and rows[j] < 0:
                v, v_score = _victim(slots, mask, keys[j], window, mscore, mark, batch, hold)
                spec[(t + LEAD) % F] = v
                spec[F + (t + LEAD) % F] = v_score
                if v >= 0:
                    prefetch_write(slots, 16 * v)        # (and the run after it, which
                    prefetch_write(slots, 16 * v + 64)   # moves back when it is vacated)
                    if marks:
                        prefetch_write(mark, v * mark.itemsize)
        if t + LEAD // 2 < b and size >= limit:
            j = idx[t + LEAD // 2]
            v = spec[(t + LEAD // 2) % F]
            if rows[j] < 0 and v >= 0 and slots[2 * v + 1] >= 0:
                prefetch_write(scores, slots[2 * v + 1] * 8)
        i = idx[t]
        key = keys[i]
        inserted[i] = False
        spec[3 * F + t % F] = 0     # the slots of the index this position writes: none yet
        if rows[i] >= 0:            # present when the call started
            r = rows[i]
            scores[r] = touched(policy, scores[r], given[i], epoch, clock, False, keep)
            continue
        h = first_slot(key, mask)
        spec[2 * F + t % F] = h
        defer = False
        if hi >= 0:                 # a range: stay inside it, keep a key's repeats in order
            defer = n_def >= DEFER_KEYS or h + window > hi
            for q in range(min(n_def, DEFER_KEYS)):
                defer = defer or held[q] == key
        s = np.int64(-1)
        free = np.int64(-1)
        if not defer:               # (in a range: no free slot before its end, -2, means
            s, free = _probe(slots, mask, key, hi)     # the victim's slot comes first)
        if s >= 0:                  # a repeat of a key this call inserted
            r = slots[2 * s + 1]
            rows[i] = r
            where[i] = s
            scores[r] = touched(policy, scores[r], given[i], epoch, clock, False, keep)
            continue
        score = touched(policy, np.int64(0), given[i], epoch, clock, True, keep)
        v = np.int64(-1)
        evict = False
        if defer:
            pass
        elif size < limit:
            if free == -2:          # a fill in ranges: the free slot is past the range's end
                defer = True
            else:                   # (n_free < 0: a fill in ranges, the slot is the row)
                r = free if n_free < 0 else nth_row(free_rows, n_free, fresh_start, taken)
                taken += 1
                size += 1
        else:
            v, v_score = _foreseen(spec, t, h, mask, window)
            if v < 0:
                v, v_score = _victim(slots, mask, key, window, mscore, mark, batch, hold)
            while v >= 0 and slots[2 * v + 1] < 0:    # a stale copy: that slot is free
                mscore[v] = MAX
                _wrote(spec, t, h, v, mask)
                v, v_score = _victim(slots, mask, key, window, mscore, mark, batch, hold)
            if v < 0 or score < v_score:
                rows[i] = -1
                continue
            evict = True
            if free == -2 or ((v - h) & mask) < ((free - h) & mask):
                free = v                # the victim's slot comes first: the key goes there
                v = -1
            elif hi >= 0 and not _run_ends_before(slots, mask, v, hi):
                defer = True            # vacating it would move keys of the next range
        if defer:
            deferred[i] = True
            if n_def < DEFER_KEYS:
                held[n_def] = key
            n_def += 1
            continue
        if evict:                   # the victim's row is the new key's
            vs = free if v < 0 else v
            r = slots[2 * vs + 1]
            ev_keys[e0 + n_ev] = slots[2 * vs]
            ev_rows[e0 + n_ev] = r
            ev_pos[e0 + n_ev] = i
            n_ev += 1
        p = free
        if slots[2 * p + 1] == DELETED:
            d_deleted -= 1
        slots[2 * p] = key
        slots[2 * p + 1] = r
        mscore[p] = hold
        if marks:
            mark[p] = batch
        _wrote(spec, t, h, p, mask)
        if v >= 0:                  # placed before the victim: empty the victim's slot
            _wrote(spec, t, h, _vacate(slots, mask, v, mscore, mark, marks), mask)
        scores[r] = score
        rows[i] = r
        where[i] = p
        inserted[i] = True
    return taken, n_ev, d_deleted, size, n_def


@inner
def _wrote(spec, t, h, s, mask):
    """:func:`_pass`'s record that position ``t`` (home slot ``h``) wrote index slot
    ``s`` (at or after ``h`` along the probe sequence): its span ``[h, s]``."""
    F = 2 * LEAD
    spec[3 * F + t % F] = max(spec[3 * F + t % F], ((s - h) & mask) + 1)


@inner
def _foreseen(spec, t, h, mask, window):
    """The victim :func:`_pass` foresaw for position ``t`` (home slot ``h``) ``LEAD``
    positions before, ``(slot, score)``, if none of the positions since wrote a slot
    of its window (then :func:`_victim` would give it again: it reads the window
    only), else ``(-1, MAX)``.  A position's writes lie in the span ``[its home, the
    last slot it wrote]`` (:func:`_wrote`): its probe sequence and vacated run.  (The
    scores a present key's position writes are ``mscore`` itself only in a fill in
    ranges, which foresees no victims.)"""
    F = 2 * LEAD
    v = spec[t % F]
    if v < 0:
        return np.int64(-1), MAX
    for q in range(t - LEAD, t):
        n = spec[3 * F + q % F]
        if n > 0:
            s = spec[2 * F + q % F]
            if ((s - h) & mask) < window or ((h - s) & mask) < n:
                return np.int64(-1), MAX
    return v, spec[F + t % F]


@inner
def _works(n):
    """:func:`_pass`'s work space on the CPU for ``n`` passes, one allocation: row g,
    ``(held, spec)`` = ``_row_work(work, g)``."""
    return np.empty((n, DEFER_KEYS + SPEC), np.int64)


@inner
def _row_work(work, g):
    return work[g, :DEFER_KEYS], work[g, DEFER_KEYS:]


@njit(nogil=True, cache=True)
def bounded_insert(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
                   inserted, free_rows, n_free, fresh_start, size, limit, window, policy,
                   epoch, clock, keep, ev_keys, ev_rows):
    """Find or insert every key of ``keys`` (n,) in batch order, evicting when full.

    ``rows`` / ``where`` (n,) come filled by :func:`find_present` (with the same
    ``hold``, see the module doc); ``rows[i]`` gets the key's row or -1 (not
    admitted), ``where[i]`` its slot (-1: not admitted), ``inserted[i]`` marks the
    position that inserted it.  Scores go to ``scores``
    (rows,); ``mscore`` / ``mark`` see the module doc (:func:`restore_scores` after
    the call; ``given`` (n,) the custom scores, ``keep`` see :func:`touched`).  New
    rows come from ``free_rows[:n_free]`` (top down), then ``fresh_start,
    fresh_start + 1, ...``; ``ev_keys`` / ``ev_rows`` (n,) receive the evicted keys
    and their rows.  Returns ``(rows taken, keys evicted, tombstones made minus
    consumed, size after)``.
    """
    n = keys.shape[0]
    held, spec = _row_work(_works(1), 0)
    taken, n_ev, d_deleted, size, _ = _pass(
        np.arange(n), 0, n, slots, mask, keys, given, scores, mscore, mark, batch, hold, rows,
        where, inserted, free_rows, n_free, fresh_start, size, limit, window, policy, epoch,
        clock, keep, -1, 0, ev_keys, ev_rows, np.empty(n, np.int64), 0, np.empty(0, np.bool_),
        held, spec)
    return taken, n_ev, d_deleted, size


@njit(nogil=True, cache=True, parallel=True)
def bounded_insert_ranges(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows,
                          where, inserted, free_rows, n_free, fresh_start, size, n_ranges, limit,
                          window, policy, epoch, clock, keep, ev_keys, ev_rows, deferred):
    """:func:`bounded_insert` on several threads, into a *full* table or one the call
    cannot fill (``size`` + the call's absent positions <= ``limit``: a *fill*).

    The index is cut into ``n_ranges`` ranges of consecutive slots (a number fixed by
    the table, not by the threads).  Each range runs, in batch order, the positions
    whose key lives in it (present keys: their slot; absent: their home slot) and
    that it can finish alone (:func:`_pass`); the positions it defers (a new key near
    its end, under 1% of them) then run, into a full table, in the ranges shifted by
    half a range (round two, where they lie mid-range; :func:`shifted`), and the
    ones left (deferred again, or in the half ranges at the index's ends; in a fill,
    every deferred one) serially in batch order.  In a fill the
    ranges give each new key its slot as a stand-in row (scores beside the slots, in
    ``mscore``) and the rows are handed out after them, range by range
    (:func:`range_rows`).  The result is that of :func:`bounded_insert` on the call's
    positions reordered by range (ranges in index order, a range's positions in batch
    order), then round two's (by shifted range, batch order in one), then the serial
    ones (ranges touch disjoint slots, rows and scores): it depends on the table and
    the call only.  ``deferred`` (n,) int64 receives each position's round: 0 the
    ranges, 1 + g the g-th shifted range, ``n_ranges`` the serial pass; the
    evictions are reported in the order of the positions that made them.  Returns
    ``(rows taken, keys evicted, tombstones made minus consumed, size after)``.
    """
    n = keys.shape[0]
    fill = size < limit
    # the ranges work on copies in range order (contiguous, not scattered, accesses)
    starts, rank, k2, g2, r2, w2 = by_range(mask, keys, given, rows, where, n_ranges,
                                             policy == CUSTOM and not keep)
    new2, late2, ev2 = np.empty(n, np.bool_), np.zeros(n, np.bool_), np.full(n, -1, np.int64)
    if fill:
        for t in prange(n):
            slot_row_one(r2, w2, scores, mscore, t)
    # evictions: range g's from starts[g] on, the deferred positions' from n on
    ek, er, ep = np.empty(3 * n, np.int64), np.empty(3 * n, np.int64), np.empty(3 * n, np.int64)
    n_evs, made = np.zeros(n_ranges, np.int64), np.zeros(n_ranges, np.int64)
    no_rows = np.empty(0, np.int64)
    same = np.arange(n)
    span = (mask + 1) // n_ranges
    # a fill: scores beside the slots, slots for rows, never full in a range
    sc = mscore if fill else scores
    nf, s0, top = (-1, 0, n + 1) if fill else (0, limit, limit)
    took = np.zeros(n_ranges, np.int64)
    work = _works(n_ranges)
    for g in prange(n_ranges):
        if starts[g + 1] > starts[g]:
            held, spec = _row_work(work, g)
            nxt = span if g + 1 < n_ranges else 0     # the next range: streamed in
            out = _pass(same, starts[g], starts[g + 1], slots, mask, k2, g2, sc, mscore, mark,
                        batch, hold, r2, w2, new2, no_rows, nf, 0, s0, top, window, policy,
                        epoch, clock, keep, (g + 1) * span, nxt, ek, er, ep, starts[g], late2,
                        held, spec)
            took[g], n_evs[g], made[g] = out[0], out[1], out[2]
            for e in range(starts[g], starts[g] + n_evs[g]):
                ev2[ep[e]] = e      # (the range's own positions)
    taken = 0
    if fill:                        # the new rows, range by range (see range_rows)
        base = np.empty(n_ranges, np.int64)
        for g in range(n_ranges):
            base[g] = taken
            taken += took[g]
        for g in prange(n_ranges):
            range_rows(starts, g, base, slots, r2, w2, new2, late2, scores, mscore,
                       free_rows, n_free, fresh_start)
    at = np.empty(n, np.int64)      # each position's eviction in ek / er, -1: none
    m_c = (n + REPORT_CHUNK - 1) // REPORT_CHUNK
    per = np.zeros(m_c + 1, np.int64)   # evictions a chunk of positions (see report)
    for c in prange(m_c):           # (in batch order: no two threads write one line)
        for i in range(c * REPORT_CHUNK, min((c + 1) * REPORT_CHUNK, n)):
            t = rank[i]
            rows[i], where[i], inserted[i], at[i] = r2[t], w2[t], new2[t], ev2[t]
            deferred[i] = n_ranges if late2[t] else 0
            per[c + 1] += ev2[t] >= 0
    late = np.flatnonzero(deferred)
    m = late.shape[0]
    e3 = n                          # the serial pass's evictions from e3 on
    starts2, n_evs2 = np.zeros(1, np.int64), np.zeros(0, np.int64)
    if not fill and m and n_ranges > 1:     # round two: the ranges shifted by half a range
        for t in prange(m):                 # (the keys round one inserted are present now)
            present_one(slots, mask, keys, rows, where, mscore, mark, batch, hold, late[t])
        order2, starts2 = shifted(mask, keys, rows, where, late, n_ranges, deferred)
        again = np.zeros(n, np.bool_)
        n_evs2, made2 = np.zeros(n_ranges - 1, np.int64), np.zeros(n_ranges - 1, np.int64)
        for g in prange(n_ranges - 1):
            if starts2[g + 1] > starts2[g]:
                held, spec = _row_work(work, g)
                out = _pass(order2, starts2[g], starts2[g + 1], slots, mask, keys, given,
                            scores, mscore, mark, batch, hold, rows, where, inserted, no_rows, 0,
                            0, limit, limit, window, policy, epoch, clock, keep,
                            (g + 1) * span + span // 2, 0, ek, er, ep, n + starts2[g], again,
                            held, spec)
                n_evs2[g], made2[g] = out[1], out[2]
        made[0] += made2.sum()
        late = late[(deferred[late] == n_ranges) | again[late]]
        deferred[late] = n_ranges
        e3 = n + m
    held, spec = _row_work(work, 0)       # (the ranges are done with it)
    nf, f0 = max(n_free - taken, 0), fresh_start + max(taken - n_free, 0)
    out = _pass(late, 0, late.shape[0], slots, mask, keys, given, scores, mscore, mark, batch,
                hold, rows, where, inserted, free_rows, nf, f0, size + taken, limit, window, policy,
                epoch, clock, keep, -1, 0, ek, er, ep, e3, np.zeros(n, np.bool_), held, spec)
    for g in range(n_evs2.shape[0]):    # report them in the order of their positions
        for e in range(n + starts2[g], n + starts2[g] + n_evs2[g]):
            at[ep[e]] = e
            per[ep[e] // REPORT_CHUNK + 1] += 1
    for e in range(e3, e3 + out[1]):
        at[ep[e]] = e
        per[ep[e] // REPORT_CHUNK + 1] += 1
    return taken + out[0], report(at, per, ek, er, ev_keys, ev_rows), made.sum() + out[2], \
        out[3]
