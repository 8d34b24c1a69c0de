"""``jit_kernels.buckets`` and ``jit_kernels.bucket_bounded`` against a dict-of-buckets
oracle: random calls (every policy, custom scores, the extremes, repeats, removals),
serial and in ranges, key for key, row for row, eviction for eviction."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from jit_kernels import bounded as kb
from jit_kernels import bucket_bounded as bb
from jit_kernels import buckets as bu
from jit_kernels.bucket_reads import erase_keys, find_rows
from jit_kernels.cpu_table import export_slots
from tests.sizing import examples


def _rows(slots, mask, keys):
    out = np.empty(keys.shape[0], np.int64)
    find_rows(slots, mask, keys, out)
    return out

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
POOL = [INT64_MIN, INT64_MAX, -1, 0, 1, 2, 3, 17, -17, 1 << 40]
key_st = st.one_of(st.sampled_from(POOL), st.integers(-200, 200),
                   st.integers(INT64_MIN, INT64_MAX))
SCORES = [0, 1, 5, 9, -1, INT64_MIN, INT64_MAX]     # custom scores
_home = njit(lambda k, m: bu.home(k, m))


class Model:
    """The oracle: ``cap // 32`` buckets of 32 slots, keys placed in the first free
    slot of their bucket, rows from the free list (top down) then fresh."""

    def __init__(self, cap, limit, policy):
        self.cap, self.limit, self.policy = cap, limit, policy
        self.slot = [None] * cap            # key in each slot
        self.where, self.row, self.score = {}, {}, {}
        self.free, self.fresh = [], 0

    def remove(self, keys):
        for k in dict.fromkeys(keys):
            if k in self.where:
                self.slot[self.where.pop(k)] = None
                r = self.row.pop(k)
                self.free.append(r)

    def call(self, keys, given, epoch, clock, keep):
        touched = kb.touched
        own = {k for k in keys if k in self.where}      # the call's keys: not victims
        rows, new, evicted = [], [], []
        for k, g in zip(keys, given):
            if k in self.where:
                r = self.row[k]
                self.score[r] = int(touched(self.policy, self.score[r], g, epoch, clock,
                                            False, keep))
                rows.append(r)
                new.append(False)
                continue
            score = int(touched(self.policy, 0, g, epoch, clock, True, keep))
            o = int(_home(k, self.cap - 1)[0])
            free = [s for s in range(o, o + 32) if self.slot[s] is None]
            if len(self.where) < self.limit and free:
                s = free[0]
                r = self.free.pop() if self.free else self.fresh
                self.fresh += r == self.fresh
            else:
                cand = [(self.score[self.row[self.slot[s]]], s) for s in range(o, o + 32)
                        if self.slot[s] is not None and self.slot[s] not in own]
                if not cand or score < min(cand)[0]:
                    rows.append(-1)
                    new.append(False)
                    continue
                s = min(cand)[1]
                victim = self.slot[s]
                r = self.row.pop(victim)
                del self.where[victim]
                evicted.append((victim, r))
            self.slot[s] = k
            self.where[k], self.row[k], self.score[r] = s, r, score
            own.add(k)
            rows.append(r)
            new.append(True)
        return rows, new, evicted


class Table:
    """The kernels' arrays, run as :class:`numbaemb.bounded.BoundedShard` runs them."""

    def __init__(self, cap, limit, policy):
        self.cap, self.mask, self.limit, self.policy = cap, cap - 1, limit, policy
        self.slots, self.scores = bu.empty_buckets(cap), np.zeros(limit, np.int64)
        self.mscore, self.mark = np.full(cap, kb.MAX), np.zeros(cap, kb.MARK)
        self.free, self.fresh, self.size, self.batch = np.empty(0, np.int64), 0, 0, 0

    def copy(self):
        other = object.__new__(Table)
        other.__dict__ = {k: (v.copy() if isinstance(v, np.ndarray) else v)
                          for k, v in self.__dict__.items()}
        return other

    def state(self):
        return [self.slots, self.scores, self.mscore, self.free, self.fresh, self.size]

    def remove(self, keys):
        freed = np.empty(keys.shape[0], np.int64)
        kb.forget(self.slots, self.mask, keys, self.mscore)
        erase_keys(self.slots, self.mask, keys, freed)
        freed = freed[freed >= 0]
        self.free = np.concatenate([self.free, freed])
        self.size -= freed.shape[0]

    def call(self, keys, given, epoch, clock, keep, hold, ranges):
        n = keys.shape[0]
        self.batch = self.batch % kb.MARK_CALLS + 1
        if self.batch == 1:
            self.mark[:] = 0
        rows, where = np.empty(n, np.int64), np.empty(n, np.int64)
        new, ek, er = np.empty(n, np.bool_), np.empty(n, np.int64), np.empty(n, np.int64)
        head = (self.slots, self.mask, keys, given, self.scores, self.mscore, self.mark,
                self.batch, hold, rows, where, new)
        rest = (self.free, self.free.shape[0], self.fresh, self.size)
        tail = (self.limit, self.policy, epoch, clock, keep, ek, er)
        present = np.empty(n, np.bool_)
        if ranges:          # (finds the keys and puts their scores back itself)
            taken, m, size = bb.bucket_insert_ranges(*head, present, *rest, ranges, *tail)
        else:
            kb.find_present(self.slots, self.mask, keys, rows, where, self.mscore, self.mark,
                            self.batch, hold)
            present = rows >= 0
            taken, m, size = bb.bucket_insert(*head, *rest, *tail)
            if hold == kb.MAX:
                kb.restore_scores(self.slots, self.mask, keys, where, self.scores, self.mscore)
        self.present = present
        from_free = min(taken, self.free.shape[0])
        self.free = self.free[:self.free.shape[0] - from_free]
        self.fresh += taken - from_free
        self.size = size
        return rows, new, list(zip(ek[:m].tolist(), er[:m].tolist())), where


def _check(t, model):
    keys, rows = export_slots(t.slots, 4)
    assert dict(zip(keys.tolist(), rows.tolist())) == model.row
    assert t.size == len(model.row) <= t.limit
    found = _rows(t.slots, t.mask, keys)
    assert np.array_equal(found, rows)
    for k, r in model.row.items():
        assert t.scores[r] == model.score[r]
        assert t.mscore[model.where[k]] == model.score[r]
        assert t.slots[2 * model.where[k]] == k
    full = t.slots[1:2 * t.cap:2] >= 0
    assert (t.mscore[~full] == kb.MAX).all()


calls_st = st.lists(st.tuples(st.lists(key_st, min_size=1, max_size=120),
                              st.lists(key_st, max_size=6), st.integers(0, 3)),
                    min_size=1, max_size=8)


@given(st.sampled_from(sorted(kb.POLICIES.values())), st.sampled_from([(64, 20), (128, 80)]),
       st.booleans(), calls_st, st.randoms(use_true_random=False))
@settings(max_examples=examples(60), deadline=None)
def test_calls_match_the_oracle(policy, shape, keep, calls, rnd):
    """Every call, serial or (where it may run) in ranges of 32 or 64 slots, gives the
    oracle's rows, new keys, evictions (in batch order), scores and table."""
    cap, limit = shape
    t, model = Table(cap, limit, policy), Model(cap, limit, policy)
    clock = 0
    for keys, gone, epoch in calls:
        clock += 1
        keys = np.array(keys, np.int64)
        given_ = np.array([rnd.choice(SCORES) for _ in keys], np.int64)
        known = set(model.row)
        want = model.call(keys.tolist(), given_.tolist(), epoch, clock, keep)
        absent = int(np.count_nonzero(_rows(t.slots, t.mask, keys) < 0))
        can_range = t.size >= limit or t.size + absent <= limit
        ranges = rnd.choice([2, cap // 32]) if can_range and rnd.random() < 0.7 else 0
        rows, new, ev, _ = t.call(keys, given_, epoch, clock, keep, kb.MAX, ranges)
        assert t.present.tolist() == [k in known for k in keys.tolist()]
        assert rows.tolist() == want[0]
        assert new.tolist() == want[1]
        assert ev == want[2]
        _check(t, model)
        gone = np.array(gone, np.int64)
        t.remove(gone)
        model.remove(gone.tolist())
        _check(t, model)


@pytest.mark.parametrize("hold_clock", [False, True])
def test_ranges_equal_serial_on_a_large_table(hold_clock):
    """A table of 2**14 slots: fills and evicting calls in 8 ranges give the serial
    pass's arrays exactly (LRU; with the clock as the hold where it may be)."""
    rng = np.random.default_rng(3)
    t = Table(1 << 14, 6000, kb.LRU)
    for clock in range(1, 9):
        keys = rng.integers(-20000, 20000, 3000)
        hold = np.int64(clock) if hold_clock else kb.MAX
        absent = int(np.count_nonzero(_rows(t.slots, t.mask, keys) < 0))
        given_ = np.zeros(3000, np.int64)
        other = t.copy()
        a = t.call(keys, given_, 0, clock, False, hold, 0)
        if other.size >= 6000 or other.size + absent <= 6000:
            b = other.call(keys, given_, 0, clock, False, hold, 8)
            for x, y in zip(a[:2], b[:2]):
                assert np.array_equal(x, y)
            assert a[2] == b[2]
            for x, y in zip(t.state(), other.state()):
                assert np.array_equal(x, y)
    assert t.size == 6000 and len(a[2]) > 0


def test_bucketed_lookups_erase_and_place_all():
    """The find and erase kernels of a bucketed index; place_all moves an index's keys
    in slot order and counts those whose bucket is full."""
    cap = 64
    slots = bu.empty_buckets(cap)
    keys = np.array(POOL + list(range(100, 130)), np.int64)
    for r, k in enumerate(keys):
        bu.place.python_twin()(slots, cap - 1, k, r)
    found = _rows(slots, cap - 1, keys)
    placed = found >= 0
    assert (found[placed] == np.flatnonzero(placed)).all()
    freed = np.empty(3, np.int64)
    erase_keys(slots, cap - 1, keys[:3], freed)
    assert freed.tolist() == [0, 1, 2] and (_rows(slots, cap - 1, keys[:3]) == -1).all()
    small = bu.empty_buckets(32)                       # one bucket: 37 keys, 32 slots
    over = np.empty(2 * keys.shape[0], np.int64)
    m = bu.place_all(slots, small, 31, over)
    assert m == keys.shape[0] - 3 - 32
    k2, r2 = export_slots(small, 2)
    old_k, old_r = export_slots(slots, 2)                # (in slot order: the first 32 fit)
    assert k2.tolist() == old_k[:32].tolist() and r2.tolist() == old_r[:32].tolist()
    assert (_rows(small, 31, old_k[:32]) == old_r[:32]).all()
    assert over[0:2 * m:2].tolist() == old_k[32:].tolist()      # the rest, in order
    assert over[1:2 * m:2].tolist() == old_r[32:].tolist()
    # placed by score: a key scoring above the bucket's lowest takes its slot
    scores = np.arange(keys.shape[0], dtype=np.int64)    # (by row: later rows score more)
    freed, dropped = np.empty(m, np.int64), np.empty(m, np.int64)
    bu.place_by_score(over[:2 * m], small, 31, scores, freed, dropped)
    k3, r3 = export_slots(small, 2)
    best = np.sort(np.concatenate([old_r]))[-32:]        # the 32 highest-scored rows stay
    assert sorted(r3.tolist()) == best.tolist() and len(set(k3.tolist())) == 32
    assert sorted(freed.tolist() + r3.tolist()) == sorted(old_r.tolist())
    assert (_rows(small, 31, k3) == r3).all() and (_rows(small, 31, dropped) == -1).all()
