"""Bounded tables (``max_capacity``) against a bounded-dict oracle.

The oracle keeps every key's row and score (the policy's rule, :mod:`jit_kernels.bounded`)
and replays each call in batch order.  With a window at least the index's size the
victim is the lowest-scored key not in the call anywhere in the table, so the oracle
checks exactly: which positions are admitted, that each reported victim has the
lowest score (ties: any of the lowest), its evicted values, and then holds the same
keys, rows and scores as the table.  A second machine uses a small window, where
only the weaker properties hold (never more than ``max_capacity`` keys, every victim
was present and leaves with its values, admission by score within the window).
Extreme keys are always in play.
"""
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import numbaemb as ne
from jit_kernels import bounded as kb
from numbaemb import bounded as nb
from numbaemb import optimizers as O
from tests.sizing import examples

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)

I64 = np.iinfo(np.int64)
EXTREME = [int(I64.min), int(I64.max), -1, 0]
keys_st = st.lists(st.sampled_from(EXTREME) | st.integers(-12, 12), min_size=1, max_size=7)
LOW = 0xFFFFFFFF


def assert_copies_current(shard):
    """The victim search's copy of the scores beside the index is current."""
    words = shard.slots[1:2 * shard.capacity:2]     # (a bucketed index: digests after)
    full = words >= 0
    np.testing.assert_array_equal(shard.mscore[full], shard._scores()[words[full]])
    assert (shard.mscore[~full] == np.iinfo(np.int64).max).all()


class BoundedMachine(RuleBasedStateMachine):
    CAP, WINDOW, EXACT = 6, 64, True
    POLICY = "lru"

    def __init__(self):
        super().__init__()
        self.var = ne.Variable(2, max_capacity=self.CAP, evict=self.POLICY,
                               evict_window=self.WINDOW,
                               initializer=ne.initializers.RandomUniform(-1, 1, seed=3))
        self.var.shards[0].keep_evicted = True     # upserts and steps report values too
        self.fresh = ne.Variable(2, initializer=ne.initializers.RandomUniform(-1, 1, seed=3))
        self.rows, self.scores = {}, {}
        self.clock, self.epoch = 0, None
        self.last_step, self.step = 0, 0
        self.tmp = tempfile.mkdtemp(prefix="numbaemb_bounded_")

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- the oracle's rule ----------------------------------------------------------
    def touched(self, old, given, fresh):
        epoch = self.last_step if self.epoch is None else self.epoch
        p = self.POLICY
        if p == "lru":
            return self.clock
        if p == "lfu":
            return 1 if fresh else old + 1
        if p == "epoch_lru":
            return (epoch << 32) | (self.clock & LOW)
        if p == "epoch_lfu":
            return (epoch << 32) | 1 if fresh or (old >> 32) != epoch else old + 1
        return given

    def replay(self, keys, given, ev_keys, ev_vals):
        """Apply one inserting call; returns whether each position was admitted.  Checks
        the table's evictions (``ev_keys``, ``ev_vals``) against the rule as it goes;
        with a small window (not ``EXACT``) the table's keys after the call say which
        new keys got in, and each victim must have scored no higher than its evictor."""
        after = None if self.EXACT else set(self.var.export()[0].tolist())
        self.clock += 1
        in_call = {k for k in keys if k in self.rows}
        admitted, j = [], 0
        for i, k in enumerate(keys):
            if k in self.rows:
                self.scores[k] = self.touched(self.scores[k], given[i], False)
                admitted.append(True)
                continue
            score = self.touched(0, given[i], True)
            if len(self.rows) < self.CAP:
                self.rows[k], self.scores[k] = self.initial(k), score
                in_call.add(k)
                admitted.append(True)
                continue
            eligible = {q: s for q, s in self.scores.items() if q not in in_call}
            low = min(eligible.values()) if eligible else None
            took = (low is not None and score >= low) if self.EXACT else k in after
            if not took:
                admitted.append(False)
                continue
            assert j < len(ev_keys), (k, ev_keys)
            victim = int(ev_keys[j])
            assert victim in eligible, (victim, eligible)
            assert eligible[victim] <= score and (not self.EXACT or eligible[victim] == low)
            assert np.array_equal(ev_vals[j], self.rows[victim])
            del self.rows[victim], self.scores[victim]
            j += 1
            self.rows[k], self.scores[k] = self.initial(k), score
            in_call.add(k)
            admitted.append(True)
        assert j == len(ev_keys), (j, ev_keys)
        return admitted

    def initial(self, k):
        return self.fresh.lookup(np.array([k]))[0]

    def given(self, data, n):
        if self.POLICY != "custom":
            return None
        return np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), np.int64)

    # ---- rules ----------------------------------------------------------------------
    @rule(keys=keys_st, data=st.data())
    def find_or_insert(self, keys, data):
        given = self.given(data, len(keys))
        out, exists, ev_k, ev_v = self.var.find_or_insert(
            np.array(keys), return_exists=True, return_evicted=True, scores=given)
        before = set(self.rows)
        admitted = self.replay(keys, given if given is not None else [0] * len(keys),
                               ev_k.tolist(), ev_v)
        inserted = set()            # keys this call inserted (their later repeats exist)
        for i, k in enumerate(keys):
            if not admitted[i]:
                assert not exists[i] and np.array_equal(out[i], self.initial(k))
            else:
                assert np.array_equal(out[i], self.rows[k])
                assert exists[i] == (k in before or k in inserted)
                inserted.add(k)

    @rule(keys=keys_st, data=st.data())
    def upsert(self, keys, data):
        given = self.given(data, len(keys))
        vals = np.array(data.draw(st.lists(st.floats(-9, 9, width=32), min_size=2 * len(keys),
                                           max_size=2 * len(keys))), np.float32).reshape(-1, 2)
        self.var.upsert(np.array(keys), vals, scores=given)
        ev_k, ev_cols = self.var.shards[0].last_evicted
        admitted = self.replay(keys, given if given is not None else [0] * len(keys),
                               ev_k.tolist(), ev_cols["values"])
        for i, k in enumerate(keys):
            if admitted[i]:
                self.rows[k] = vals[i]

    @rule(keys=keys_st)
    def remove(self, keys):
        self.var.remove(np.array(keys))
        for k in keys:
            self.rows.pop(k, None)
            self.scores.pop(k, None)

    @precondition(lambda self: self.POLICY != "custom")
    @rule(keys=keys_st)
    def train(self, keys):
        self.step += 1
        uniq = list(dict.fromkeys(keys))
        grads = np.ones((len(keys), 2), np.float32)
        before = {k: v.copy() for k, v in self.rows.items()}
        O.apply_gradients(self.var, O.SGD(0.5), np.array(keys), grads, step=self.step)
        self.last_step = self.step
        ev_k, ev_cols = self.var.shards[0].last_evicted
        admitted = self.replay(uniq, [0] * len(uniq), ev_k.tolist(), ev_cols["values"])
        for i, k in enumerate(uniq):
            if admitted[i]:
                start = before.get(k, self.rows[k])
                self.rows[k] = start - np.float32(0.5) * keys.count(k)

    @precondition(lambda self: self.POLICY.startswith("epoch"))
    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch):
        self.var.set_epoch(epoch)
        self.epoch = epoch

    @rule()
    def save_load(self):
        path = f"{self.tmp}/b.nbe"
        self.var.save(path)
        self.var = ne.Variable.load(path)
        self.var.shards[0].keep_evicted = True

    @invariant()
    def matches(self):
        assert self.var.size() <= self.CAP
        keys, rows = self.var.export()
        got = dict(zip(keys.tolist(), rows))
        assert set(got) == set(self.rows)
        for k, row in got.items():
            assert np.array_equal(row, self.rows[k]), k
        if got:             # every key is reachable by its probe (evictions move keys back)
            found, exists = self.var.lookup(keys, return_exists=True)
            assert exists.all() and np.array_equal(found, rows)
        assert_copies_current(self.var.shards[0])
        if self.EXACT:
            sk, sv = self.var.export("score")
            assert dict(zip(sk.tolist(), sv[:, 0].tolist())) == self.scores


class RangesMachine(BoundedMachine):
    """Every call on a full table takes the parallel pass, its index cut into 4 ranges
    (``jit_kernels.bounded.bounded_insert_ranges``; by default only calls of 2,048
    keys or more into an index of 8,192 slots or more do)."""

    def __init__(self):
        self.saved = kb.ranges_for, kb.RANGES_MIN
        kb.ranges_for, kb.RANGES_MIN = (lambda capacity, window: 4), 1
        super().__init__()

    def teardown(self):
        kb.ranges_for, kb.RANGES_MIN = self.saved
        super().teardown()


class BucketRangesMachine(BoundedMachine):
    """A bucketed index (``evict_window="bucket"``) whose every call with more than one
    key takes the parallel kernel (``jit_kernels.bucket_bounded.bucket_insert_ranges``)
    in 2 stretches, whatever the threads."""

    def __init__(self):
        self.saved = nb.stretches_for, kb.RANGES_MIN
        nb.stretches_for, kb.RANGES_MIN = (lambda: 2), 2
        super().__init__()

    def teardown(self):
        nb.stretches_for, kb.RANGES_MIN = self.saved
        super().teardown()


def machine(policy, exact=True, ranges=False, bucket=False):
    """A state machine's test: exact (a window as wide as the index; a bucketed index
    of ``CAP`` keys is one bucket, so its window is the index too) or a small window;
    ``ranges``: the parallel kernels on every call."""
    attrs = {"POLICY": policy, "EXACT": exact}
    if not exact:
        attrs.update(CAP=12, WINDOW=3)
    if bucket:
        attrs.update(WINDOW="bucket")
    base = (BucketRangesMachine if bucket else RangesMachine) if ranges else BoundedMachine
    name = f"Bounded_{policy}_{'exact' if exact else 'window'}{'_ranges' if ranges else ''}" \
        f"{'_bucket' if bucket else ''}"
    cls = type(name, (base,), attrs)
    test = cls.TestCase
    test.settings = settings(max_examples=examples(30), stateful_step_count=20, deadline=None)
    return test


TestLRU = machine("lru")
TestLFU = machine("lfu")
TestEpochLRU = machine("epoch_lru")
TestEpochLFU = machine("epoch_lfu")
TestCustom = machine("custom")
TestLRUSmallWindow = machine("lru", exact=False)
TestLFUSmallWindow = machine("lfu", exact=False)
TestLRUSmallWindowRanges = machine("lru", exact=False, ranges=True)
TestLFUSmallWindowRanges = machine("lfu", exact=False, ranges=True)
TestBucketLRU = machine("lru", bucket=True)
TestBucketLFU = machine("lfu", bucket=True)
TestBucketEpochLFU = machine("epoch_lfu", bucket=True)
TestBucketCustom = machine("custom", bucket=True)
TestBucketLRURanges = machine("lru", ranges=True, bucket=True)
TestBucketCustomRanges = machine("custom", ranges=True, bucket=True)


def test_an_lru_call_at_a_clock_some_key_already_has_evicts_as_the_rule_says():
    """An LRU call marks its keys with its clock in the victim search only when no key
    scores that high (``BoundedRows._hold``), else a key scored at the clock (a shard
    called twice with one clock, scores a load wrote) would wrongly escape eviction:
    ties go to the new key."""
    from numbaemb.bounded import BoundedShard
    from jit_kernels.initializers import ZEROS
    for load in (False, True):
        sh = BoundedShard(1, np.float32, (ZEROS, 0.0, 0.0, 0, np.zeros(1)), 8, "lru",
                          window=64)
        sh.find_or_insert(np.arange(8), clock=3 if load else 5)
        if load:                            # scores written as a load writes them
            sh.columns["score"].data[:, 0] = 5
            sh._loaded()
        rows, inserted = sh.find_or_insert(np.arange(100, 104), clock=5)
        assert (rows >= 0).all() and inserted.all(), load     # each evicted a 5
        assert sh.n_full == 8 and sh.last_evicted[0].shape[0] == 4
        assert_copies_current(sh)


def test_bad_bounded_arguments():
    with pytest.raises(ValueError, match="evict must be one of"):
        ne.Variable(2, max_capacity=4, evict="fifo")
    with pytest.raises(ValueError, match="one shard"):
        ne.Variable(2, max_capacity=4, num_shards=2)
    with pytest.raises(ValueError, match="max_capacity must be >= 1"):
        ne.Variable(2, max_capacity=0)
    v = ne.Variable(2, max_capacity=4, evict="lru")
    with pytest.raises(ValueError, match="evict='custom'"):
        v.upsert(np.array([1]), np.ones((1, 2)), scores=np.array([3]))
    with pytest.raises(ValueError, match="bounded tables"):
        ne.Variable(2).find_or_insert(np.array([1]), return_evicted=True)
    assert v.size() == 0
    for kw in (dict(evict="lfu"), dict(evict_window=8)):     # meaningless unbounded
        with pytest.raises(ValueError, match="need max_capacity"):
            ne.Variable(2, **kw)
    with pytest.raises(ValueError, match=r"max_capacity must be <= 2\*\*48"):
        ne.Variable(2, max_capacity=1 << 62)       # (numpy: "maximum dimension exceeded")


def test_a_window_wider_than_the_index_is_the_whole_index():
    """A wider window sees the same slots again: the same victims as a window of the
    whole index, found in one sweep (not a sweep of 10**9 slots a new key)."""
    wide = ne.Variable(3, max_capacity=3000, evict="lfu", evict_window=10 ** 9)
    whole = ne.Variable(3, max_capacity=3000, evict="lfu",
                        evict_window=wide.shards[0].capacity)
    rng = np.random.default_rng(5)
    for n in (2500, 40, 2500, 3, 2500):
        keys = rng.integers(-50_000, 50_000, n)
        a = wide.find_or_insert(keys, return_exists=True, return_evicted=True)
        b = whole.find_or_insert(keys, return_exists=True, return_evicted=True)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert wide.size() == whole.size() == 3000
    for x, y in zip(wide.export("score"), whole.export("score")):
        np.testing.assert_array_equal(x, y)


@settings(max_examples=examples(30), deadline=None)
@given(st.lists(st.tuples(st.sampled_from([INT64_MIN, INT64_MAX, -1, 0, 1, 2, 3, 7]),
                          st.booleans(), st.integers(-3, 3), st.integers(-3, 3)),
                min_size=1, max_size=12), st.integers(0, 4))
def test_accum_equals_an_unbounded_table_while_nothing_is_evicted(batch, seed):
    """TFRA accum (batch order, repeats, exists flags, extreme keys) on a bounded table
    that never fills: exactly the unbounded table's result."""
    keys = np.array([b[0] for b in batch], np.int64)
    exists = np.array([b[1] for b in batch])
    old = np.array([[b[2], -b[2]] for b in batch], np.float32)
    new = np.array([[b[3], 2 * b[3]] for b in batch], np.float32)
    start = np.array([INT64_MIN, 1, 3], np.int64)[:seed % 4]
    tables = [ne.Variable(2, max_capacity=64, evict="lfu"), ne.Variable(2)]
    for t in tables:
        t.upsert(start, np.full((start.size, 2), 5.0, np.float32))
        t.accum(keys, old, new, exists)
    (ka, va), (kb, vb) = (t.export() for t in tables)
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    np.testing.assert_array_equal(va[oa], vb[ob])


def test_accum_on_a_full_table_evicts_within_capacity():
    v = ne.Variable(1, max_capacity=4, evict="lru", initializer=0.0)
    v.upsert(np.array([1, 2, 3, 4]), np.ones((4, 1), np.float32))
    v.upsert(np.array([3, 4]), np.full((2, 1), 2.0, np.float32))      # 1, 2 are the oldest
    old, new = np.zeros((3, 1), np.float32), np.full((3, 1), 7.0, np.float32)
    v.accum(np.array([10, 3, 11]), old, new, np.array([False, True, False]))
    keys, vals = v.export()
    got = dict(zip(keys.tolist(), vals[:, 0].tolist()))
    assert got == {3: 9.0, 4: 2.0, 10: 7.0, 11: 7.0}       # 1 and 2 evicted, 3 += 7
    assert sorted(v.shards[0].last_evicted[0].tolist()) == [1, 2]


def test_bp_v2_steps_on_a_bounded_table_stay_within_capacity():
    v = ne.Variable(2, max_capacity=6, evict="lru", initializer=0.0)
    opt = ne.optimizers.Adam(0.1)
    for step in range(1, 6):
        ids = np.arange(step * 3, step * 3 + 4)
        ne.optimizers.apply_gradients(v, opt, ids, np.ones((4, 2), np.float32), step=step,
                                      delta=True)
        assert v.size() <= 6
    keys, vals = v.export()
    assert set(keys.tolist()) <= set(range(3, 19)) and (vals < 0).all()   # trained down


def test_stream_hit_rate_is_near_an_exact_lru_cache():
    """A drifting Zipf stream into a bounded LRU table: hits within 10% of an exact LRU
    cache of the same size (``benchmarks/bench_bounded.py`` runs the long stream)."""
    from collections import OrderedDict
    rng = np.random.default_rng(1)
    cap, batch = 2000, 2000
    stream = [(rng.zipf(1.1, batch) + 200 * i) % (1 << 40) for i in range(40)]
    v = ne.Variable(1, max_capacity=cap, evict="lru")
    cache, hits, exact = OrderedDict(), 0, 0
    for ids in stream:
        hits += int(v.lookup(ids, return_exists=True)[1].sum())
        v.find_or_insert(ids)
        exact += sum(x in cache for x in ids.tolist())     # in the cache as the batch comes
        for x in ids.tolist():
            cache[x] = None
            cache.move_to_end(x)
            if len(cache) > cap:
                cache.popitem(last=False)
        assert v.size() <= cap
    assert hits >= 0.9 * exact > 0


@pytest.mark.parametrize("ranges", [False, True])
def test_evictions_do_not_depend_on_threads(monkeypatch, ranges):
    """Tables fed the same calls evict the same keys, whatever the thread count: the
    index is rebuilt serially (its layout decides each key's window), also with every
    other kernel in parallel (PARALLEL_MIN = 0), and the parallel evicting pass cuts
    the index into ranges by its size, not by the threads."""
    import numba
    from jit_kernels import segment
    monkeypatch.setattr(segment, "PARALLEL_MIN", 0)
    if ranges:
        monkeypatch.setattr(kb, "RANGE_SLOTS", 64)
    rng = np.random.default_rng(4)
    calls = [rng.zipf(1.2, 3000) % 20_000 for _ in range(30)]   # rehashes on the way
    tables = [ne.Variable(2, max_capacity=500, evict="lru", evict_window=1 if ranges else 8)
              for _ in range(2)]
    assert (kb.ranges_for(tables[0].shards[0].capacity, 1) > 1) == ranges
    threads = numba.get_num_threads()
    try:
        for ids in calls:
            for n_threads, t in zip((1, threads), tables):
                numba.set_num_threads(n_threads)
                t.find_or_insert(ids)
    finally:
        numba.set_num_threads(threads)
    (k1, v1), (k2, v2) = (t.export() for t in tables)
    assert k1.shape[0] == 500
    np.testing.assert_array_equal(np.sort(k1), np.sort(k2))
    np.testing.assert_array_equal(tables[0].shards[0].slots, tables[1].shards[0].slots)


@pytest.mark.parametrize("policy", ["lru", "lfu", "custom"])
def test_a_fill_in_ranges_holds_what_the_serial_pass_holds(monkeypatch, policy):
    """Large calls into a table they cannot fill run in ranges of the index
    (``bounded_insert_ranges``): the same keys, values and scores as the serial pass
    (rows and layout may differ: a range's deferred keys come last); the call that
    fills the table runs serially."""
    monkeypatch.setattr(kb, "RANGE_SLOTS", 64)
    wide = []
    monkeypatch.setattr(kb, "bounded_insert_ranges",
                        lambda *a, f=kb.bounded_insert_ranges: wide.append(a[14]) or f(*a))
    rng = np.random.default_rng(6)
    extremes = np.array([INT64_MIN, INT64_MAX, -1, 0], np.int64)
    calls = [np.concatenate([extremes, rng.integers(-2**40, 2**40, 300),
                             rng.integers(0, 50, 100)]) for _ in range(3)]
    tables = [ne.Variable(2, max_capacity=1000, evict=policy, evict_window=2)
              for _ in range(2)]
    assert kb.ranges_for(tables[0].shards[0].capacity, 2) > 1
    for j, ids in enumerate(calls):
        sc = {"scores": rng.integers(0, 9, ids.shape[0])} if policy == "custom" else {}
        if j == 1:
            tables[0].remove(calls[0][:50])                   # free rows, tombstones
            tables[1].remove(calls[0][:50])
        out = []
        for t, least in zip(tables, (10**9, 64)):             # serial, then in ranges
            monkeypatch.setattr(kb, "RANGES_MIN", least)
            out.append(t.find_or_insert(ids, return_exists=True, **sc))
        for a, b in zip(*out):
            np.testing.assert_array_equal(a, b)
        (k1, s1), (k2, s2) = (t.export("score") for t in tables)
        assert dict(zip(k1.tolist(), s1[:, 0].tolist())) == \
            dict(zip(k2.tolist(), s2[:, 0].tolist()))
        (k1, v1), (k2, v2) = (t.export() for t in tables)
        np.testing.assert_array_equal(v1[np.argsort(k1)], v2[np.argsort(k2)])
        for t in tables:
            assert_copies_current(t.shards[0])
    assert len(wide) == 3 and 0 == wide[0] < wide[1] < wide[2] < 1000   # sizes: fills
    last = rng.integers(-2**40, 2**40, 500)                  # fills it: the serial pass
    tables[1].find_or_insert(last)
    assert len(wide) == 3 and tables[1].size() == 1000


def test_call_marks_wrap_without_changing_a_result(monkeypatch):
    """Marks are one byte: every ``MARK_CALLS`` calls they are cleared and calls are
    numbered from 1 again.  A table that wraps every 3 calls holds and evicts exactly
    what one that never wraps does.  Marks tell a call's own keys from keys scored
    ``MAX`` (custom scores here), which a stale mark would shield from eviction."""
    from jit_kernels import bounded as kb

    def run(wrap):
        monkeypatch.setattr(kb, "MARK_CALLS", wrap)
        v = ne.Variable(2, max_capacity=24, evict="custom", evict_window=4)
        rng = np.random.default_rng(11)
        got = []
        for _ in range(40):
            keys = np.concatenate([rng.integers(0, 50, 10), [INT64_MIN, INT64_MAX, -1, 0]])
            scores = np.where(rng.random(keys.size) < 0.95, INT64_MAX, rng.integers(0, 9, 14))
            out, exists, ev_keys, _ = v.find_or_insert(keys, return_exists=True,
                                                       return_evicted=True, scores=scores)
            got += [out, exists, np.sort(ev_keys)]
        return got, v.export("score")

    default = kb.MARK_CALLS
    calls, scores = run(3)
    want_calls, want_scores = run(default)
    assert sum(c.size for c in want_calls[2::3]) > 10          # evictions happened
    for a, b in zip(calls + list(scores), want_calls + list(want_scores)):
        np.testing.assert_array_equal(a, b)


# ---- a bucketed index (evict_window="bucket") ---------------------------------------
def _same_bucket_keys(v, n):
    """``n`` keys of ``v``'s first bucket (the bucket of key 0)."""
    from jit_kernels.bucket_bounded import homes_of
    mask = v.shards[0].mask
    want = homes_of.python_twin()(0, mask) >> 8
    keys = [k for k in range(200_000) if homes_of.python_twin()(k, mask) >> 8 == want]
    assert len(keys) >= n
    return np.array(keys[:n], np.int64)


def test_bucket_arguments():
    v = ne.Variable(2, max_capacity=40)                 # (the default layout)
    assert v.shards[0].bucketed and v.shards[0].capacity == 128     # (4 buckets)
    assert v.evict_window == "bucket" and "evict_window" not in repr(v)
    w = ne.Variable(2, max_capacity=40, evict_window=32)
    assert not w.shards[0].bucketed and "evict_window=32" in repr(w)
    with pytest.raises(ValueError, match="need max_capacity"):
        ne.Variable(2, evict_window=32)
    with pytest.raises(ValueError, match="evict_window must be a positive int or 'bucket'"):
        ne.Variable(2, max_capacity=40, evict_window="buckets")


def test_bucket_full_evicts_before_the_table_is():
    """A new key whose bucket holds 32 keys evicts its bucket's least recent one while
    the table holds fewer than max_capacity keys (HierarchicalKV's rule), and reports it."""
    v = ne.Variable(2, max_capacity=40, evict_window="bucket", initializer=0.0)
    keys = _same_bucket_keys(v, 34)
    for k in keys[:32]:
        v.find_or_insert(np.array([k]))
    assert v.size() == 32
    v.find_or_insert(keys[1:32])                      # keys[0] is now the least recent
    _, ev_keys, ev_values = v.find_or_insert(keys[32:33], return_evicted=True)
    assert ev_keys.tolist() == [keys[0]] and ev_values.shape == (1, 2)
    assert v.size() == 32 and set(v.export()[0].tolist()) == set(keys[1:33].tolist())
    v.upsert(np.array([10 ** 9 + 7]), np.ones((1, 2), np.float32))   # other buckets: room
    assert v.size() in (32, 33)


def test_bucket_load_places_a_full_buckets_keys_by_score():
    """Placing loaded keys (a checkpoint saved from another layout): a key whose bucket
    is full waits for the scores, then displaces the bucket's lowest-scored key if it
    scores higher; the keys left out are dropped with a warning, their rows freed."""
    v = ne.Variable(2, max_capacity=60, evict="lfu", evict_window="bucket")
    keys = _same_bucket_keys(v, 40)
    scores = np.random.default_rng(3).permutation(40) + 10
    shard = v.shards[0]
    shard._reserve_rows(40)
    pairs = np.empty(2 * 40, np.int64)
    pairs[0::2], pairs[1::2] = keys, np.arange(40)
    shard._place(pairs, shard.slots)
    shard._take_rows(40)
    assert shard.n_overflow == 8 and v.size() == 40
    shard.columns["score"].data[:40, 0] = scores
    shard.values[:40] = np.arange(40)[:, None]
    with pytest.warns(UserWarning, match="8 loaded keys did not fit"):
        shard._loaded()
    kept = keys[np.argsort(-scores, kind="stable")[:32]]     # (distinct scores)
    assert v.size() == 32 and shard.n_overflow == 0
    assert sorted(v.export()[0].tolist()) == sorted(kept.tolist())
    rows = shard.find_rows(keys)
    np.testing.assert_array_equal(rows >= 0, np.isin(keys, kept))
    np.testing.assert_array_equal(shard.values[rows[rows >= 0], 0], np.flatnonzero(rows >= 0))
    assert sorted(shard.free_rows.tolist()) == sorted(set(range(40)) - set(rows.tolist()))
    assert (shard.mscore[shard.mscore < kb.MAX] >= 10).all()
    v.find_or_insert(np.arange(10 ** 6, 10 ** 6 + 8))      # the freed rows are reused
    assert shard.fresh == 40 and v.size() <= 40


@pytest.mark.parametrize("evict", ["lru", "lfu", "custom"])
def test_bucket_results_do_not_depend_on_the_stretches(monkeypatch, evict):
    """The same calls (fills, evicting calls, repeats, removals) with the serial pass and
    with 2, 3 and 8 stretches of buckets: the same evictions, keys, rows and scores."""
    rng = np.random.default_rng(5)
    calls = [rng.integers(-4000, 4000, int(rng.integers(2500, 4000))) for _ in range(6)]
    given = [rng.integers(0, 20, c.shape[0]) for c in calls]
    runs = []
    monkeypatch.setattr(kb, "RANGES_MIN", 2)
    for stretches in (1, 2, 3, 8):
        monkeypatch.setattr(nb, "stretches_for", lambda s=stretches: s)
        v = ne.Variable(2, max_capacity=3000, evict=evict, evict_window="bucket")
        got = []
        for c, g in zip(calls, given):
            kw = {"scores": g} if evict == "custom" else {}
            got.append(v.find_or_insert(c, return_evicted=True, **kw)[1].tolist())
            v.remove(c[:50])
        shard = v.shards[0]
        runs.append((got, shard.slots.copy(), shard._scores().copy(), v.size()))
    for other in runs[1:]:
        assert other[0] == runs[0][0] and other[3] == runs[0][3]
        np.testing.assert_array_equal(other[1], runs[0][1])
        np.testing.assert_array_equal(other[2], runs[0][2])


def test_bucket_lookup_paths_and_expiry():
    """Every reader of the index takes a bucketed one: lookups, export, removal,
    steps-to-live expiry and a native checkpoint; the kernel of several tables refuses
    it (callers then look it up on its own)."""
    from numbaemb import multi
    from numbaemb.expiry import expire
    rng = np.random.default_rng(2)
    v = ne.Variable(3, max_capacity=500, evict_window="bucket", steps_to_live=2,
                    initializer=ne.initializers.RandomUniform(-1, 1, seed=1))
    plain = ne.Variable(3, initializer=ne.initializers.RandomUniform(-1, 1, seed=1))
    keys = np.unique(np.concatenate([rng.integers(-10 ** 6, 10 ** 6, 400), EXTREME]))
    vals = rng.normal(size=(keys.size, 3)).astype(np.float32)
    v.upsert(keys, vals)
    plain.upsert(keys, vals)
    probe = np.concatenate([keys, rng.integers(-10 ** 6, 10 ** 6, 100)])
    want, want_exists = plain.lookup(probe, return_exists=True)
    got, exists = v.lookup(probe, return_exists=True)
    np.testing.assert_array_equal(exists, want_exists)
    np.testing.assert_array_equal(got, want)
    assert multi.fits(v)                # (the kernel of several tables: its layout's twin)
    both = multi.lookup_many([v, plain], [probe, probe])
    np.testing.assert_array_equal(both[0].rows, want)
    np.testing.assert_array_equal(both[0].exists, want_exists)
    ek, ev = v.export()
    assert sorted(ek.tolist()) == sorted(keys.tolist())
    v.remove(keys[:50])
    assert v.size() == keys.size - 50 and not v.lookup(keys[:50], return_exists=True)[1].any()
    opt = ne.optimizers.SGD(0.1)
    for step in range(1, 4):
        ne.optimizers.apply_gradients(v, opt, keys[50:60], np.ones((10, 3), np.float32),
                                      step=step)
    expire(v)
    assert sorted(v.export()[0].tolist()) == sorted(keys[50:60].tolist())
    path = tempfile.mkdtemp(prefix="numbaemb_bucket_")
    try:
        v.save(f"{path}/t")
        back = ne.Variable.load(f"{path}/t")
        assert back.shards[0].bucketed and back.evict_window == "bucket"
        np.testing.assert_array_equal(back.lookup(keys[50:60]), v.lookup(keys[50:60]))
    finally:
        shutil.rmtree(path, ignore_errors=True)
