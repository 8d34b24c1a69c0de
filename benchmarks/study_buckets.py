"""Layout study for issue 17: evicting inserts into a bucketed index (HierarchicalKV's).

This script studies a layout. It is not the table. Today a bounded table keeps
its keys in the linear-probing index that every kernel of a shard shares
(``jit_kernels.slots``). A full table's new key searches a 32-slot window from
its home slot, evicts the lowest score there and moves the victim's run back.
This script measures, in one process, what the same evicting inserts cost when
the index is cut into aligned buckets of 32 slots:

* a key lives only in its home bucket;
* a bucket keeps one byte of digest a slot (0: free), the slots' keys and rows
  (side by side, so one line holds both; ``--separate``: in two arrays), and their
  scores;
* a new key in a full table takes the lowest-scored slot of its bucket, so no
  key ever moves.

Both layouts have the index memory of today's bounded table: a power of two of
at least 3 * capacity / 2 slots (load 0.5 when full at 2**20 keys). Only LRU calls into a full table are modelled: the call's clock is above
every score, so holding a key is scoring it with the clock.

A call is two kernels:

* :func:`present`: the call's present keys, scored with the clock so that no
  earlier position of the call evicts them;
* :func:`evict_insert`: each thread owns a stretch of buckets and walks the
  batch in order. It requests each key's digest and score lines ``AHEAD``
  positions on, and, with ``foresee``, the victim's key and row lines ``AHEAD
  // 2`` positions on.

The estimated bounded call is these kernels plus the floor (initial values into
the victims' rows and the rows copied out, measured as in ``bench_bounded.py``).
It leaves out Python's share of a call and the eviction report. A second table
compares the index work of a lookup of present keys, every kernel on all threads
(the table's ``find_rows`` runs serially below ``PARALLEL_MIN`` keys: its parallel
build is called). ``--check`` first compares
the kernels with a dict-of-buckets oracle, key for key. Last, the drifting Zipf
stream of ``bench_bounded.py`` gives the hit rates of today's LRU and of a
bucketed LRU (:func:`stream_hits`) beside an exact LRU cache.

    python benchmarks/study_buckets.py              # 1M keys, batches of 100k
    python benchmarks/study_buckets.py --stream 0   # no hit rates (the slow part)
    python benchmarks/study_buckets.py --check      # the oracle check only
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
from numba import get_num_threads, njit, prange

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from jit_kernels.cpu_table import find_rows, prefetch_read, prefetch_write  # noqa: E402
from jit_kernels.hashing import hash_key                          # noqa: E402
from jit_kernels.lanes import eq32, low32                         # noqa: E402

B = 32                    # slots a bucket (low32 reads 32 scores)
AHEAD = 8
MAX = np.int64(np.iinfo(np.int64).max)


@njit(inline="always")
def _split(key, nbm):
    """(bucket, digest in 1..255) of ``key``."""
    h = hash_key(key)
    return np.int64(h & np.uint64(nbm)), np.uint8((h >> np.uint64(56)) | np.uint64(1))


@njit(inline="always")
def _lowest_bit(m):
    """Place of the lowest set bit of the non-zero uint32 ``m``."""
    j = 0
    while (m >> np.uint32(j)) & np.uint32(1) == 0:
        j += 1
    return j


@njit(inline="always")
def _key_ahead(dig, bkey, key, nbm):
    """Request the line of ``key``'s slot, found by its digest alone (the digest line
    was requested earlier; a second stage of the look-ahead)."""
    b, d = _split(key, nbm)
    m = eq32(dig, b * B, d)
    if m != 0:
        prefetch_read(bkey, (b * B + _lowest_bit(m)) * bkey.strides[0])


@njit(inline="always")
def _match(dig, bkey, o, d, key):
    """Slot of ``key`` in the bucket at ``o``, or -1: a mask of the digests equal to
    ``d`` (no branch), then the keys of those slots."""
    m = eq32(dig, o, d)
    while m != 0:
        j = _lowest_bit(m)
        if bkey[o + j] == key:
            return j
        m &= m - np.uint32(1)
    return -1


@njit(nogil=True)
def fill(dig, bkey, brow, bscore, scores, keys, nbm, clock, size):
    """Insert ``keys`` serially into free slots (a table that is not full); a key
    whose bucket is full is dropped.  Returns the size after."""
    for i in range(keys.shape[0]):
        b, d = _split(keys[i], nbm)
        o = b * B
        if _match(dig, bkey, o, d, keys[i]) >= 0:
            continue
        for j in range(B):
            if dig[o + j] == 0:
                dig[o + j], bkey[o + j], brow[o + j] = d, keys[i], size
                bscore[o + j] = scores[size] = clock
                size += 1
                break
    return size


@njit(nogil=True, parallel=True)
def present(dig, bkey, bscore, keys, nbm, clock, bk):
    """The call's present keys scored with ``clock``; ``bk[i]`` = bucket of keys[i]."""
    n = keys.shape[0]
    for i in prange(n):
        if i + AHEAD < n:
            prefetch_read(dig, _split(keys[i + AHEAD], nbm)[0] * B)
        b, d = _split(keys[i], nbm)
        bk[i] = b
        j = _match(dig, bkey, b * B, d, keys[i])
        if j >= 0:
            bscore[b * B + j] = clock


@njit(nogil=True, parallel=True)
def find(dig, bkey, brow, keys, nbm, rows):
    """rows[i] = row of keys[i], or -1 (a lookup's index work)."""
    n = keys.shape[0]
    for i in prange(n):
        if i + AHEAD < n:
            prefetch_read(dig, _split(keys[i + AHEAD], nbm)[0] * B)
        if i + AHEAD // 2 < n:
            _key_ahead(dig, bkey, keys[i + AHEAD // 2], nbm)
        b, d = _split(keys[i], nbm)
        j = _match(dig, bkey, b * B, d, keys[i])
        rows[i] = brow[b * B + j] if j >= 0 else -1


@njit(inline="always")
def stretch(bk, n, lo, hi, mine):
    """Positions ``i < n`` whose ``bk[i]`` lies in ``[lo, hi)`` into ``mine``, in batch
    order: a thread's share of the call (its stretch of buckets).  Returns how many."""
    m = 0
    for i in range(n):
        if bk[i] >= lo and bk[i] < hi:
            mine[m] = i
            m += 1
    return m


@njit(nogil=True, parallel=True)
def evict_insert(dig, bkey, brow, bscore, scores, keys, nbm, clock, bk, own, rows, ek, er,
                 foresee):
    """Full table, LRU at ``clock``: rows[i] = row of keys[i] (-1: not admitted, its
    bucket holds only this call's keys); a new key takes its bucket's lowest-scored slot
    (first on ties) and ``(ek[i], er[i])`` is the key and row it evicted (er[i] -1:
    none).  ``bk`` from :func:`present`; ``own`` (threads, n) work space."""
    n, nt, nb = keys.shape[0], get_num_threads(), nbm + 1
    for t in prange(nt):
        mine = own[t]
        m = stretch(bk, n, nb * t // nt, nb * (t + 1) // nt, mine)
        for q in range(m):
            if q + AHEAD < m:
                o2 = bk[mine[q + AHEAD]] * B
                prefetch_read(dig, o2)
                for c in range(0, B * 8, 64):
                    prefetch_write(bscore, o2 * 8 + c)
            if foresee and q + AHEAD // 2 < m:
                o2 = bk[mine[q + AHEAD // 2]] * B
                j2 = low32(bscore, o2)[1]
                prefetch_write(bkey, (o2 + j2) * bkey.strides[0])
                prefetch_read(brow, (o2 + j2) * brow.strides[0])
            i = mine[q]
            key = keys[i]
            o = bk[i] * B
            d = _split(key, nbm)[1]
            er[i] = -1
            j = _match(dig, bkey, o, d, key)
            if j >= 0:
                bscore[o + j] = clock
                rows[i] = brow[o + j]
                scores[rows[i]] = clock
                continue
            low, j = low32(bscore, o)
            if low >= clock:
                rows[i] = -1
                continue
            r = brow[o + j]
            ek[i], er[i] = bkey[o + j], r
            dig[o + j], bkey[o + j], bscore[o + j], scores[r] = d, key, clock, clock
            rows[i] = r


@njit(nogil=True)
def stream_hits(stream, nb, capacity, batch):
    """Share of ``stream``'s ids already in a bucketed LRU table of ``capacity`` keys
    (``nb`` buckets) when their batch arrives, run serially: a new id takes a free slot
    of its bucket while the table has room, else its bucket's least recent key that is
    not of its batch (none: not admitted)."""
    dig, bkey = np.zeros(nb * B, np.uint8), np.zeros(nb * B, np.int64)
    bscore = np.full(nb * B, MAX, np.int64)
    size, hits, clock = 0, 0, 0
    for lo in range(0, stream.shape[0], batch):
        hi, clock = min(lo + batch, stream.shape[0]), clock + 1
        for i in range(lo, hi):             # hits, and the batch's present ids held
            b, d = _split(stream[i], nb - 1)
            j = _match(dig, bkey, b * B, d, stream[i])
            if j >= 0:
                hits += 1
                bscore[b * B + j] = clock
        for i in range(lo, hi):
            b, d = _split(stream[i], nb - 1)
            o = b * B
            if _match(dig, bkey, o, d, stream[i]) >= 0:
                continue
            j = -1
            if size < capacity:
                for f in range(B):
                    if dig[o + f] == 0:
                        j = f
                        size += 1
                        break
            if j < 0:
                low, j = low32(bscore, o)
                if low >= clock:
                    continue
            dig[o + j], bkey[o + j], bscore[o + j] = d, stream[i], clock
    return hits / stream.shape[0]


def buckets_for(capacity):
    """Buckets of the index today's bounded table makes for ``capacity`` keys."""
    from numbaemb.shard import _index_capacity
    return max(_index_capacity(1.5 * capacity) // B, 1)


def work_space(n):
    """A call's work arrays: (buckets, threads' positions, rows, evicted keys and rows)."""
    return (np.empty(n, np.int64), np.empty((get_num_threads(), n), np.int64),
            np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64))


class Buckets:
    """The study's table: ``capacity`` keys in the index memory of today's bounded
    table (2 * capacity slots at a power of two)."""

    def __init__(self, capacity, interleave=True):
        self.nb = buckets_for(capacity)
        s = self.nb * B
        self.dig, self.bscore = np.zeros(s, np.uint8), np.full(s, MAX, np.int64)
        if interleave:          # a slot's key and row side by side: one line for both
            pairs = np.zeros((s, 2), np.int64)
            pairs[:, 1] = -1
            self.bkey, self.brow = pairs[:, 0], pairs[:, 1]
        else:
            self.bkey, self.brow = np.zeros(s, np.int64), np.full(s, -1, np.int64)
        self.scores = np.zeros(capacity, np.int64)
        self.size = 0

    def fill(self, keys, clock):
        self.size = fill(self.dig, self.bkey, self.brow, self.bscore, self.scores, keys,
                         self.nb - 1, clock, self.size)

    def find(self, keys, rows):
        find(self.dig, self.bkey, self.brow, keys, self.nb - 1, rows)

    def slot(self, s):
        """Slot ``s``: None when free, else (key, row, score)."""
        if self.dig[s] == 0:
            return None
        return int(self.bkey[s]), int(self.brow[s]), int(self.bscore[s])

    def call(self, keys, clock, foresee=True, work=None):
        bk, own, rows, ek, er = work or work_space(keys.shape[0])
        present(self.dig, self.bkey, self.bscore, keys, self.nb - 1, clock, bk)
        evict_insert(self.dig, self.bkey, self.brow, self.bscore, self.scores, keys,
                     self.nb - 1, clock, bk, own, rows, ek, er, foresee)
        return rows, ek, er


def oracle_call(slots, keys, clock, nb):
    """The same call on a list of slots, each [key, row, score] or None (bucket b:
    ``slots[b * B:(b + 1) * B]``)."""
    where = {e[0]: e for e in slots if e is not None}
    for k in keys.tolist():
        if k in where:
            where[k][2] = clock
    rows, evicted = [], []
    for k in keys.tolist():
        if k in where:
            rows.append(where[k][1])
            evicted.append(None)
            continue
        o = B * int(_split(np.int64(k), np.int64(nb - 1))[0])
        score = [MAX if e is None else e[2] for e in slots[o:o + B]]
        j = int(np.argmin(score))
        if score[j] >= clock:
            rows.append(-1)
            evicted.append(None)
            continue
        old = slots[o + j]
        del where[old[0]]
        slots[o + j] = where[k] = [k, old[1], clock]
        rows.append(old[1])
        evicted.append((old[0], old[1]))
    return rows, evicted


def random_calls(t, oracle, capacity, calls, rng):
    """``calls`` random calls (new keys, held keys, the int64 extremes, repeats) into
    the study table ``t`` (``call``, ``find``, ``slot``, ``scores``) and into
    ``oracle(slots, keys, clock)`` on a list of its slots: the same rows and
    evictions, slot for slot the same keys, rows and scores, every held key found."""
    slots = [None if e is None else list(e) for e in map(t.slot, range(t.nb * B))]
    extreme = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0], np.int64)
    for c in range(calls):
        known = np.array([e[0] for e in slots if e is not None], np.int64)
        n = int(rng.integers(1, 3 * capacity // 4))
        keys = np.concatenate([rng.integers(-2 ** 63, 2 ** 63 - 1, size=n, dtype=np.int64),
                               rng.choice(known, n // 2), extreme])
        keys = rng.permutation(np.concatenate([keys, keys[: n // 8]]))    # repeats
        rows, ek, er = t.call(keys, 2 + c)
        want_rows, want_ev = oracle(slots, keys, 2 + c)
        assert rows.tolist() == want_rows, f"rows differ at call {c}"
        got_ev = [None if r < 0 else (int(k), int(r)) for k, r in zip(ek, er)]
        assert got_ev == want_ev, f"evictions differ at call {c}"
        held = [e for e in slots if e is not None]
        found = np.empty(len(held), np.int64)
        t.find(np.array([e[0] for e in held], np.int64), found)
        assert found.tolist() == [e[1] for e in held], f"a key is lost at call {c}"
        for s, e in enumerate(slots):
            assert t.slot(s) == (None if e is None else tuple(e)), (c, s)
            assert e is None or t.scores[e[1]] == e[2], (c, s)
    return calls


def check(seed=0, capacity=4096, calls=30, interleave=True):
    """The kernels against :func:`oracle_call` (see :func:`random_calls`)."""
    rng = np.random.default_rng(seed)
    t = Buckets(capacity, interleave)
    t.fill(rng.integers(-2 ** 63, 2 ** 63 - 1, size=capacity, dtype=np.int64), 1)
    return random_calls(t, lambda slots, keys, clock: oracle_call(slots, keys, clock, t.nb),
                        capacity, calls, rng)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1 << 20, help="capacity (full tables)")
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--check", action="store_true", help="the oracle check only")
    ap.add_argument("--separate", action="store_true",
                    help="keys and rows in two arrays (default: side by side, a line for both)")
    ap.add_argument("--stream", type=int, default=2_000_000, help="ids in the hit-rate test "
                    "(bench_bounded.py's drifting Zipf stream; 0: none)")
    ap.add_argument("--capacity", type=int, default=50_000, help="table size, hit-rate test")
    args = ap.parse_args()
    import study_bucket_probing as probing
    print(f"oracle checks: {check(interleave=not args.separate)} calls of the bucketed layout "
          f"and {probing.check()} of bucket-local probing equal, key for key and slot for slot")
    if args.check:
        return
    import numbaemb as ne
    from bench_bounded import rows_floor
    n, b = args.keys, args.batch
    rng = np.random.default_rng(1)
    keys = rng.permutation(np.arange(n + b * (4 * args.repeats + 6), dtype=np.int64) * 7919 + 13)
    base, extra = keys[:n], keys[n:]
    batches = iter(range(10 ** 6))

    def new_batch():
        i = next(batches)
        return extra[i * b:(i + 1) * b]

    plain = ne.Variable(args.dim)
    bounded = ne.Variable(args.dim, max_capacity=n, evict="lru")
    study = Buckets(n, not args.separate)
    local = probing.ProbeBuckets(n)
    for lo in range(0, n, b):
        plain.find_or_insert(base[lo:lo + b])
        bounded.find_or_insert(base[lo:lo + b])
    study.fill(base, 1)
    local.fill(base, 1)
    dropped = n - study.size
    work = work_space(b)
    study.call(new_batch(), 2, True, work)
    study.call(new_batch(), 3, False, work)
    local.call(new_batch(), 2, True, work)
    t = {k: [] for k in ("plain", "floor", "bounded", "foresee", "blind", "local", "find",
                         "bfind", "lfind", "lookup")}
    clock, refused = 4, 0
    for _ in range(args.repeats + 1):
        k = new_batch()
        t0 = time.perf_counter()
        plain.find_or_insert(k)
        t["plain"].append(time.perf_counter() - t0)
        t["floor"].append(rows_floor(plain, k))
        plain.remove(k)
        k = base[rng.integers(0, n, b)]         # present keys: the index work of a lookup
        rows = np.empty(b, np.int64)
        t0 = time.perf_counter()
        find_rows.parallel(plain.shards[0].slots, plain.shards[0].mask, k, rows)
        t["find"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        plain.lookup(k)
        t["lookup"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        study.find(k, rows)
        t["bfind"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        local.find(k, rows)
        t["lfind"].append(time.perf_counter() - t0)
        k = new_batch()
        t0 = time.perf_counter()
        bounded.find_or_insert(k)
        t["bounded"].append(time.perf_counter() - t0)
        for name in ("foresee", "blind", "local"):
            k = new_batch()
            t0 = time.perf_counter()
            table = local if name == "local" else study
            rows, ek, er = table.call(k, clock, name != "blind", work)
            t[name].append(time.perf_counter() - t0)
            clock += 1
            refused += int((rows < 0).sum())
            assert ((rows < 0) == (er < 0)).all()
    ms = {k: 1e3 * statistics.median(v[1:]) for k, v in t.items()}
    tp = ms["plain"]
    print(f"keys {n:,} (bucketed: {dropped} dropped by full buckets at the fill); batch {b:,} "
          f"new keys; dim {args.dim}; evict lru; numba threads {get_num_threads()}; "
          f"load average {os.getloadavg()[0]:.1f}; median of {args.repeats}; bucketed keys not "
          f"admitted (buckets of this call's keys only): {refused}")
    print("| find_or_insert of new keys into a full table | ms | ratio to unbounded |")
    print("|---|---:|---:|")
    print(f"| unbounded table (load 0.5, no eviction) | {tp:.2f} | 1.00x |")
    print(f"| bounded table today (linear probing, 32-slot window) | {ms['bounded']:.2f} | "
          f"{ms['bounded'] / tp:.2f}x |")
    for name, what in (("foresee", "bucketed study, victim's lines requested ahead"),
                       ("blind", "bucketed study, no victim requested ahead"),
                       ("local", "bucket-local probing, victim's line requested ahead")):
        est = ms[name] + ms["floor"]
        print(f"| {what}: index {ms[name]:.2f} + floor (estimate) | {est:.2f} | "
              f"{est / tp:.2f}x |")
    print(f"| floor: initial values into the rows and the rows copied out | {ms['floor']:.2f} | |")
    print()
    print("| index work of a lookup of present keys (rows only) | ms | ratio |")
    print("|---|---:|---:|")
    print(f"| linear probing (the unbounded table's `find_rows`, its parallel build) | "
          f"{ms['find']:.2f} | 1.00x |")
    lines = "then key line, then row line" if args.separate else "then the key's line, its row in it"
    print(f"| bucketed study (digest line, {lines}) | {ms['bfind']:.2f} | "
          f"{ms['bfind'] / ms['find']:.2f}x |")
    print(f"| bucket-local probing (from the home slot, as today) | {ms['lfind']:.2f} | "
          f"{ms['lfind'] / ms['find']:.2f}x |")
    print(f"| for scale: today's whole `lookup` of those keys (rows of dim {args.dim} copied "
          f"out) | {ms['lookup']:.2f} | |")
    if args.stream:
        hit_rates(args.stream, args.capacity)


def hit_rates(n, capacity, batch=10_000, zipf=1.1, drift=500):
    """bench_bounded.py's stream test with the bucketed LRU beside today's LRU."""
    from bench_bounded import drifting_zipf, exact_lru_hits, table_hits
    stream = drifting_zipf(n, batch, zipf, drift)
    exact = exact_lru_hits(stream, capacity, batch)
    today = table_hits(stream, capacity, batch, "lru", 32)
    ours = stream_hits(stream, buckets_for(capacity), capacity, batch)
    print()
    print(f"stream: {n:,} ids, zipf({zipf}) drifting {drift} ids a batch of {batch:,}; "
          f"capacity {capacity:,}")
    print("| cache | hit rate | vs exact LRU |")
    print("|---|---|---|")
    for name, h in (("exact LRU (OrderedDict)", exact), ("today's lru, window 32", today),
                    (f"bucketed study lru, {buckets_for(capacity)} buckets of {B}", ours)):
        print(f"| {name} | {h:.4f} | {h / exact:.3f} |")


if __name__ == "__main__":
    main()
