"""Layout study for issue 17, second layout: linear probing confined to aligned buckets.

This keeps today's slot format and changes one rule. A slot is still a key with
its row beside it (row -1: free), as in ``jit_kernels.slots``, and the score
copies still sit beside the index. But a key's probe starts at its home slot and
wraps around inside its aligned bucket of 32 slots, where today it runs on into
the next slots.

* A lookup reads its home slot's line, as today: there are no digests.
* A new key in a full table evicts the lowest score of its bucket. If its probe
  reaches the victim before a free slot, it takes the victim's slot. Otherwise
  it takes that free slot, and the victim's slot is emptied by a backward shift
  inside the bucket.
* No probe, window or shift ever leaves a bucket, so no key is deferred.

Today's kernels would only need the probe's next slot to wrap inside the
bucket. ``study_buckets.py`` times this layout beside the bucketed one
(``--probing``); :func:`check` compares it with a Python oracle.

>>> t = ProbeBuckets(64)
>>> t.fill(np.arange(64, dtype=np.int64), 1)
>>> rows, ek, er = t.call(np.array([1000], np.int64), 2)
>>> bool(rows[0] == er[0] >= 0)          # the victim's row, reused
True
"""
import os
import sys

import numpy as np
from numba import get_num_threads, njit, prange

HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (HERE, os.path.dirname(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from jit_kernels.cpu_table import prefetch_read, prefetch_write   # noqa: E402
from jit_kernels.slots import EMPTY, first_slot                   # noqa: E402
from jit_kernels.lanes import low32                               # noqa: E402
from study_buckets import (AHEAD, B, MAX, buckets_for, random_calls, stretch,  # noqa: E402
                           work_space)



@njit(inline="always")
def _next(s):
    return (s & ~np.int64(B - 1)) | ((s + 1) & (B - 1))


@njit(inline="always")
def _find(pairs, mask, key):
    """(slot of ``key`` or -1, the first free slot of its probe or -1)."""
    s = first_slot(key, mask)
    for _ in range(B):
        if pairs[s, 1] == EMPTY:
            return -1, s
        if pairs[s, 0] == key:
            return s, -1
        s = _next(s)
    return -1, -1


@njit(inline="always")
def _vacate(pairs, msc, v, mask):
    """Empty slot ``v``: the later keys of its run inside the bucket move back."""
    hole = v
    pairs[hole, 1], msc[hole] = EMPTY, MAX
    j = _next(hole)
    for _ in range(B - 1):
        if pairs[j, 1] == EMPTY:
            return
        h = first_slot(pairs[j, 0], mask)
        if ((hole - h) & (B - 1)) < ((j - h) & (B - 1)):
            pairs[hole, 0], pairs[hole, 1], msc[hole] = pairs[j, 0], pairs[j, 1], msc[j]
            pairs[j, 1], msc[j] = EMPTY, MAX
            hole = j
        j = _next(j)


@njit(nogil=True)
def fill(pairs, msc, scores, keys, mask, clock, size):
    """Insert ``keys`` serially into free slots; a key whose bucket is full is dropped."""
    for i in range(keys.shape[0]):
        s, e = _find(pairs, mask, keys[i])
        if s < 0 and e >= 0:
            pairs[e, 0], pairs[e, 1] = keys[i], size
            msc[e] = scores[size] = clock
            size += 1
    return size


@njit(nogil=True, parallel=True)
def present(pairs, msc, keys, mask, clock, bk):
    """The call's present keys scored with ``clock``; ``bk[i]`` = start of keys[i]'s bucket."""
    n = keys.shape[0]
    for i in prange(n):
        if i + AHEAD < n:
            prefetch_read(pairs, first_slot(keys[i + AHEAD], mask) * pairs.strides[0])
        bk[i] = first_slot(keys[i], mask) & ~np.int64(B - 1)
        s = _find(pairs, mask, keys[i])[0]
        if s >= 0:
            msc[s] = clock


@njit(nogil=True, parallel=True)
def find_rows(pairs, mask, keys, rows):
    """rows[i] = row of keys[i], or -1."""
    n = keys.shape[0]
    for i in prange(n):
        if i + AHEAD < n:
            prefetch_read(pairs, first_slot(keys[i + AHEAD], mask) * pairs.strides[0])
        s = _find(pairs, mask, keys[i])[0]
        rows[i] = pairs[s, 1] if s >= 0 else -1


@njit(nogil=True, parallel=True)
def evict_insert(pairs, msc, scores, keys, mask, clock, bk, own, rows, ek, er, foresee):
    """:func:`study_buckets.evict_insert` in this layout (the same rows, evictions and
    refusals: a bucket's victim is its lowest score, first by slot on ties)."""
    n, nt, nb = keys.shape[0], get_num_threads(), (mask + 1) // B
    for t in prange(nt):
        mine = own[t]
        m = stretch(bk, n, nb * t // nt * B, nb * (t + 1) // nt * B, mine)
        for q in range(m):
            if q + AHEAD < m:
                i2 = mine[q + AHEAD]
                prefetch_write(pairs, first_slot(keys[i2], mask) * pairs.strides[0])
                for c in range(0, B * 8, 64):
                    prefetch_write(msc, bk[i2] * 8 + c)
            if foresee and q + AHEAD // 2 < m:
                o2 = bk[mine[q + AHEAD // 2]]
                prefetch_write(pairs, (o2 + low32(msc, o2)[1]) * pairs.strides[0])
            i = mine[q]
            key = keys[i]
            o = bk[i]
            er[i] = -1
            s, e = _find(pairs, mask, key)
            if s >= 0:
                msc[s] = clock
                rows[i] = pairs[s, 1]
                scores[rows[i]] = clock
                continue
            low, j = low32(msc, o)
            if low >= clock:
                rows[i] = -1
                continue
            v = o + j
            r = pairs[v, 1]
            ek[i], er[i] = pairs[v, 0], r
            h = first_slot(key, mask)
            if e < 0 or ((v - h) & (B - 1)) < ((e - h) & (B - 1)):
                pairs[v, 0], msc[v] = key, clock       # the victim's slot is on the way
            else:           # (placed first: the shift may run through the key's probe)
                pairs[e, 0], pairs[e, 1], msc[e] = key, r, clock
                _vacate(pairs, msc, v, mask)
            scores[r] = clock
            rows[i] = r


class ProbeBuckets:
    """This layout's table, with :class:`study_buckets.Buckets`' calls."""

    def __init__(self, capacity):
        self.nb = buckets_for(capacity)
        self.mask = self.nb * B - 1
        self.pairs = np.zeros((self.nb * B, 2), np.int64)
        self.pairs[:, 1] = EMPTY
        self.msc = np.full(self.nb * B, MAX, np.int64)
        self.scores = np.zeros(capacity, np.int64)
        self.size = 0

    def fill(self, keys, clock):
        self.size = fill(self.pairs, self.msc, self.scores, keys, self.mask, clock, self.size)

    def find(self, keys, rows):
        find_rows(self.pairs, self.mask, keys, rows)

    def slot(self, s):
        """Slot ``s``: None when free, else (key, row, score)."""
        if self.pairs[s, 1] == EMPTY:
            return None
        return int(self.pairs[s, 0]), int(self.pairs[s, 1]), int(self.msc[s])

    def call(self, keys, clock, foresee=True, work=None):
        bk, own, rows, ek, er = work or work_space(keys.shape[0])
        present(self.pairs, self.msc, keys, self.mask, clock, bk)
        evict_insert(self.pairs, self.msc, self.scores, keys, self.mask, clock, bk, own, rows,
                     ek, er, foresee)
        return rows, ek, er


def oracle_call(slots, keys, clock, mask):
    """The same call on a list of slots, each [key, row, score] or None."""
    home = [int(first_slot(np.int64(k), np.int64(mask))) for k in keys.tolist()]

    def probe(k, h):
        s = h
        for _ in range(B):
            if slots[s] is None:
                return -1, s
            if slots[s][0] == k:
                return s, -1
            s = _next(s)
        return -1, -1

    for k, h in zip(keys.tolist(), home):
        s = probe(k, h)[0]
        if s >= 0:
            slots[s][2] = clock
    rows, evicted = [], []
    for k, h in zip(keys.tolist(), home):
        s, e = probe(k, h)
        if s >= 0:
            rows.append(slots[s][1])
            evicted.append(None)
            continue
        o = h & ~(B - 1)
        score = [MAX if slots[o + j] is None else slots[o + j][2] for j in range(B)]
        j = int(np.argmin(score))
        if score[j] >= clock:
            rows.append(-1)
            evicted.append(None)
            continue
        v = o + j
        old = slots[v]
        if e < 0 or (v - h) % B < (e - h) % B:
            slots[v] = [k, old[1], clock]
        else:
            slots[e] = [k, old[1], clock]
            hole, slots[v], t = v, None, _next(v)
            while slots[t] is not None:
                ht = int(first_slot(np.int64(slots[t][0]), np.int64(mask)))
                if (hole - ht) % B < (t - ht) % B:
                    slots[hole], slots[t], hole = slots[t], None, t
                t = _next(t)
        rows.append(old[1])
        evicted.append((old[0], old[1]))
    return rows, evicted


def check(seed=0, capacity=4096, calls=30):
    """The kernels against :func:`oracle_call` (see :func:`study_buckets.random_calls`)."""
    rng = np.random.default_rng(seed)
    t = ProbeBuckets(capacity)
    t.fill(rng.integers(-2 ** 63, 2 ** 63 - 1, size=capacity, dtype=np.int64), 1)
    return random_calls(t, lambda slots, keys, clock: oracle_call(slots, keys, clock, t.mask),
                        capacity, calls, rng)
