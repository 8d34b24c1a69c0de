"""The parallel pass (``jit_kernels.bounded.bounded_insert_ranges``) against the
serial one, into full tables (every new key evicts or is refused) and into tables the
call cannot fill.

Its documented result: that of the serial :func:`bounded_insert` on the call's
positions reordered by range (ranges in index order, a range's positions in batch
order), the positions it deferred last (in batch order).  Small indexes cut into ranges of 16-64 slots make many keys cross a range's
end (deferred by the window, the probe sequence or the vacated run); keys include the
extremes, repeats and keys present when the call starts; every policy, custom scores.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jit_kernels import bounded as kb
from jit_kernels.bounded_stream import STREAM_PER, line_at, range_lines, stream_share
from jit_kernels.cpu_table import erase_keys
from jit_kernels.slots import empty_slots, first_slot
from tests.sizing import examples

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
POOL = [INT64_MIN, INT64_MAX, -1, 0, 1, 2, 3, 17, -17, 1 << 40]
key_st = st.one_of(st.sampled_from(POOL), st.integers(-300, 300),
                   st.integers(INT64_MIN, INT64_MAX))
CAP = 256                      # index slots; a full table holds LIMIT keys (load 0.39)
LIMIT = 100                    # or Table(limit=160) (load 0.63, longer probe sequences)


class Table:
    """A bounded table's arrays (the kernels' arguments): full, or with ``size`` keys
    of which ``removed`` were removed since (tombstones in the index, free rows)."""

    def __init__(self, window, policy, seed, limit=LIMIT, size=None, removed=0, cap=CAP):
        self.limit, self.size, self.fresh, self.cap = limit, 0, 0, cap
        self.slots, self.scores = empty_slots(cap), np.zeros(limit, np.int64)
        self.mscore, self.mark = np.full(cap, kb.MAX, np.int64), np.zeros(cap, kb.MARK)
        self.free = np.empty(0, np.int64)
        self.window, self.policy, self.batch = window, policy, 0
        self.hold = kb.MAX
        rng = np.random.default_rng(seed)
        far = max(5000, 4 * limit)
        first = rng.choice(np.arange(-far, far), size or limit, replace=False)
        self.serial(first, np.zeros(first.shape[0], np.int64), clock=1)
        if size is None:
            for clock in (2, 3):    # evictions and repeats: varied scores and layout
                m = 60 if cap == CAP else limit // 2
                self.serial(rng.integers(-far - 1000, far + 1000, m), rng.integers(0, 9, m),
                            clock)
        gone = first[:removed].astype(np.int64)
        freed = np.empty(removed, np.int64)
        kb.forget(self.slots, cap - 1, gone, self.mscore)
        erase_keys(self.slots, cap - 1, gone, freed)
        self.free = np.concatenate([self.free, freed])
        self.size -= removed

    def take(self, out):
        """The rows a call took (``out[0]``: free rows from the top, then fresh ones) and
        its size after (``out[3]``)."""
        from_free = min(out[0], self.free.shape[0])
        self.free = self.free[:self.free.shape[0] - from_free]
        self.fresh += out[0] - from_free
        self.size = out[3]

    def copy(self):
        other = object.__new__(Table)
        other.__dict__ = {k: (v.copy() if isinstance(v, np.ndarray) else v)
                          for k, v in self.__dict__.items()}
        return other

    def start(self, keys):
        n = keys.shape[0]
        if self.batch == kb.MARK_CALLS:     # as BoundedRows: byte marks cleared, counted anew
            self.mark[:] = 0
            self.batch = 0
        self.batch += 1
        rows, where = np.empty(n, np.int64), np.empty(n, np.int64)
        kb.find_present(self.slots, self.cap - 1, keys, rows, where, self.mscore, self.mark,
                        self.batch, self.hold)
        return (self.slots, self.cap - 1, keys), rows, where, np.empty(n, np.bool_)

    def common(self):
        return self.scores, self.mscore, self.mark, self.batch, self.hold

    def restore(self, keys, where):
        """The copies of the call's scores back beside the index (not needed, and not
        done, when the call held them at its clock)."""
        if self.hold == kb.MAX:
            kb.restore_scores(self.slots, self.cap - 1, keys, where, self.scores, self.mscore)

    def rows_then(self):
        return self.free, self.free.shape[0], self.fresh, self.size

    def serial(self, keys, scores, clock):
        keys = np.asarray(keys, np.int64)
        (slots, mask, keys), rows, where, new = self.start(keys)
        n = keys.shape[0]
        ev_k, ev_r = np.empty(n, np.int64), np.empty(n, np.int64)
        out = kb.bounded_insert(slots, mask, keys, scores, *self.common(), rows, where, new,
                                *self.rows_then(), self.limit, self.window, self.policy, 0,
                                clock, False, ev_k, ev_r)
        self.restore(keys, where)
        self.take(out)
        return rows, where, new, ev_k[:out[1]], ev_r[:out[1]], out

    def ranges(self, keys, scores, clock, n_ranges):
        (slots, mask, keys), rows, where, new = self.start(keys)
        n = keys.shape[0]
        ev_k, ev_r, late = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        out = kb.bounded_insert_ranges(
            slots, mask, keys, scores, *self.common(), rows, where, new, *self.rows_then(),
            n_ranges, self.limit, self.window, self.policy, 0, clock, False, ev_k, ev_r, late)
        self.restore(keys, where)
        self.take(out)
        return rows, where, new, ev_k[:out[1]], ev_r[:out[1]], out, late


def check_same_as_serial(table, keys, scores, n_ranges):
    a, b = table, table.copy()
    full = a.size == a.limit
    mask = a.cap - 1
    span = a.cap // n_ranges        # each position's range: its key's slot, or home slot
    at = [kb._find(a.slots, mask, key) for key in keys.tolist()]
    home = np.array([(s if s >= 0 else first_slot(key, mask)) // span
                     for s, key in zip(at, keys.tolist())], np.int64)
    rows, where, new, ev_k, ev_r, out_a, late = a.ranges(keys, scores, 5, n_ranges)
    by_range = np.argsort(home, kind="stable")
    by_round = np.argsort(late, kind="stable")      # round two by shifted range, then
    perm = np.concatenate([by_range[late[by_range] == 0], by_round[late[by_round] > 0]])
    assert ((late >= 0) & (late <= n_ranges)).all()  # the serial pass, in batch order
    if not full:
        assert ((late == 0) | (late == n_ranges)).all()     # a fill has no round two
    two = np.flatnonzero((late > 0) & (late < n_ranges) & new)   # inserted in round two:
    for i in two.tolist():          # absent when it began, so in its home's shifted range
        assert late[i] == (first_slot(keys[i], mask) + span // 2) // span
    rows_b, _, new_b, ev_kb, ev_rb, out = b.serial(keys[perm], scores[perm], 5)
    for name in ("slots", "scores", "mscore", "mark", "free"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(rows[perm], rows_b)
    np.testing.assert_array_equal(new[perm], new_b)
    assert tuple(out_a) == tuple(out[:4]) and a.fresh == b.fresh
    if not full:                     # a fill evicts nothing and admits every key
        assert out[1] == 0 and (rows >= 0).all() and ev_k.shape[0] == 0
    else:
        assert out[0] == 0 and out[3] == a.limit
    sorted_perm = perm[np.argsort(keys[perm], kind="stable")]     # a key's positions keep
    same_key = keys[sorted_perm][1:] == keys[sorted_perm][:-1]     # their batch order (its
    assert (np.diff(sorted_perm)[same_key] > 0).all()   # first admitted one inserts)
    # the serial pass evicts once for each insert into the full table, in its order:
    # the ranges report the same evictions in the order of the evicting positions
    if full:                        # (in a full table the order of the ranges does not
        by_position = np.argsort(perm[new_b], kind="stable")    # matter: no row is new)
        np.testing.assert_array_equal(ev_k, ev_kb[by_position])
        np.testing.assert_array_equal(ev_r, ev_rb[by_position])
    keys_now = a.slots[0::2][a.slots[1::2] >= 0]
    assert keys_now.shape[0] == a.size
    ok = rows >= 0                   # every admitted key is in the table, found by its probe
    assert set(keys[ok].tolist()) <= set(keys_now.tolist())
    for key, row in zip(keys[ok].tolist(), rows[ok].tolist()):
        assert kb._find(a.slots, mask, np.int64(key)) >= 0
        assert a.slots[2 * kb._find(a.slots, mask, np.int64(key)) + 1] == row
    return late, new


FILL = dict(limit=200, size=60, removed=15)     # 45 keys: a call of <= 155 new keys


@pytest.mark.parametrize("fill", [False, True])
@settings(max_examples=examples(60), deadline=None)
@given(st.lists(key_st, min_size=1, max_size=120), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([2, 4, 8, 16]), st.sampled_from(sorted(kb.POLICIES.values())),
       st.integers(0, 3), st.data())
def test_ranges_equal_the_serial_pass_on_the_reordered_call(fill, keys, window, n_ranges,
                                                           policy, seed, data):
    """Into a full table, and into one the call cannot fill (its size plus the call's
    absent positions at most the limit: the new keys take the free rows, top down, and
    then fresh ones, range by range, a range's in batch order, the deferred last)."""
    table = Table(window, policy, seed, **(FILL if fill else {}))
    present = table.slots[0::2][table.slots[1::2] >= 0]
    extra = data.draw(st.lists(st.sampled_from(present.tolist()), max_size=40))
    keys = np.array(keys + extra, np.int64)
    keys = keys[np.random.default_rng(seed).permutation(keys.shape[0])]
    scores = np.array(data.draw(st.lists(st.integers(0, 9), min_size=keys.shape[0],
                                         max_size=keys.shape[0])), np.int64)
    size = table.size
    check_same_as_serial(table, keys, scores, n_ranges)
    new = len(set(keys.tolist()) - set(present.tolist()))
    assert table.size == (size + new if fill else size)


@pytest.mark.parametrize("fill", [False, True])
def test_ranges_equal_the_serial_pass_on_large_random_calls(fill):
    """Ranges interact only when a kernel lets one reach past its end, and that takes a
    particular layout: many calls of 100-200 keys (into a full table most of them
    evict), every policy."""
    rng = np.random.default_rng(7 + fill)
    deferred = second = again = 0
    for ex in range(200 if fill else 400):
        window, n_ranges = [1, 2, 4, 8][ex % 4], [2, 4, 8, 16][ex // 4 % 4]
        policy = sorted(kb.POLICIES.values())[ex // 16 % 5]
        table = Table(window, policy, ex, **(FILL if fill else {"limit": (LIMIT, 160)[ex % 2]}))
        n = int(rng.integers(100, 155) if fill else rng.integers(120, 200))
        keys = np.where(rng.random(n) < 0.05, rng.choice(POOL, n), rng.integers(-300, 300, n))
        scores = rng.integers(0, 9, n)
        late, new = check_same_as_serial(table, keys.astype(np.int64), scores, n_ranges)
        deferred += (late > 0).sum()
        second += ((late > 0) & (late < n_ranges)).sum()
        span = CAP // n_ranges      # inserted serially though homed in a shifted range:
        again += sum(1 <= (first_slot(k, CAP - 1) + span // 2) // span < n_ranges   # deferred
                     for k in keys[(late == n_ranges) & new].tolist())         # in round two
    assert deferred > (500 if fill else 1000)       # the ranges' ends were in play
    assert (second == 0) if fill else second > 300  # and round two, into a full table
    assert fill or again > 100, again   # and its own deferrals


def test_a_range_that_defers_many_keys_defers_every_new_key_after():
    """Past ``DEFER_KEYS`` deferred keys a range defers every new key left (so a key's
    repeats stay in batch order without a long list to search)."""
    table = Table(2, kb.LRU, 0)
    span = CAP // 2
    pool = np.arange(-200000, 200000, dtype=np.int64)
    homes = np.array([first_slot(k, CAP - 1) for k in pool])
    near_end = pool[(homes >= span - 1) & (homes < span)][:kb.DEFER_KEYS + 5]
    early = pool[homes < 8][:20]
    assert near_end.shape[0] == kb.DEFER_KEYS + 5 and early.shape[0] == 20
    keys = np.concatenate([near_end, early])
    late, _ = check_same_as_serial(table, keys, np.zeros(keys.shape[0], np.int64), 2)
    assert late[:near_end.shape[0]].all()       # windows over the range's end
    present = set(table.slots[0::2][table.slots[1::2] >= 0].tolist())
    absent = np.array([k not in present for k in early.tolist()])
    assert absent.any() and late[near_end.shape[0]:][absent].all()


def test_ranges_for_depends_on_the_table_alone():
    assert kb.ranges_for(1 << 21, 32) == 512
    assert kb.ranges_for(1 << 12, 32) == 1            # too small: the serial pass
    assert kb.ranges_for(1 << 30, 1) == 1024


@pytest.mark.parametrize("n", [1, 95, 96, 195, 4096])
def test_a_pass_streams_the_whole_next_range_or_none_of_it(n):
    """A range's positions between them request every line of the next range's
    index (4,096 slots: 1,024 lines of ``slots``, 512 of ``mscore``), at most
    ``STREAM_PER`` a position; a pass with too few positions to use them streams none,
    and so does a pass with no next range."""
    per = stream_share(4096, n)
    if 1536 > STREAM_PER * n:
        assert per == 0
    else:
        assert 0 < per <= STREAM_PER and per * n >= 1536 > (per - 1) * n
    assert stream_share(0, n) == 0


@pytest.mark.parametrize("lo, n", [(0, 4096), (4096, 4096), (12288, 64), (8, 16)])
def test_a_streamed_range_is_every_line_of_its_slots_and_score_copies_once(lo, n):
    """The lines :func:`stream_lines` requests, in order: each 64-byte line of
    ``slots[2 * lo:2 * (lo + n)]``, then of ``mscore[lo:lo + n]``, once."""
    got = [tuple(line_at(lo, n, q)) for q in range(range_lines(n))]
    want = [(0, off) for off in range(16 * lo, 16 * (lo + n), 64)] + \
        [(1, off) for off in range(8 * lo, 8 * (lo + n), 64)]
    assert got == want


@pytest.mark.parametrize("mode", ["serial", "ranges", "fill"])
@settings(max_examples=examples(40), deadline=None)
@given(st.lists(key_st, min_size=1, max_size=120), st.sampled_from([1, 2, 4, 8, 32]),
       st.integers(0, 3), st.data())
def test_an_lru_call_that_holds_its_clock_needs_no_restore(mode, keys, window, seed, data):
    """An LRU call whose clock is above every score may mark its keys with the clock
    (``hold``) instead of ``MAX``: the same victims, rows and index, and the score
    copies already right after the call, with no :func:`restore_scores` (a fill in
    ranges too: it keeps the scores in ``mscore``, the clock for the call's keys);
    such a call leaves ``mark`` alone."""
    a = Table(window, kb.LRU, seed, **(FILL if mode == "fill" else {}))
    present = a.slots[0::2][a.slots[1::2] >= 0]
    extra = data.draw(st.lists(st.sampled_from(present.tolist()), max_size=40))
    keys = np.array(keys + extra, np.int64)
    b = a.copy()
    b.hold = np.int64(5)            # above the Table's clocks (1-3)
    marks = b.mark.copy()
    scores = np.zeros(keys.shape[0], np.int64)
    if mode == "serial":
        outs = a.serial(keys, scores, 5), b.serial(keys, scores, 5)
    else:
        outs = a.ranges(keys, scores, 5, 4), b.ranges(keys, scores, 5, 4)
    for x, y in zip(*outs):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for name in ("slots", "scores", "mscore", "free"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(b.mark, marks)        # neither read nor written
    live = a.slots[1::2] >= 0
    np.testing.assert_array_equal(a.mscore[live], a.scores[a.slots[1::2][live]])


def test_a_foreseen_victim_is_taken_only_while_it_is_the_window_s(monkeypatch):
    """The pass looks for each new key's victim ``LEAD`` positions early and takes that
    one at the key's turn unless a position since wrote a slot of its window: run in
    Python, every victim taken so is checked against a fresh search of the window at
    that moment (small tables, small and large windows: both outcomes occur often)."""
    import inspect
    real, seen = kb._foreseen, {"taken": 0, "dropped": 0}

    def checked(spec, t, h, mask, window):
        v, score = real(spec, t, h, mask, window)
        f = inspect.currentframe().f_back.f_locals
        fresh = kb._victim(f["slots"], mask, f["key"], window, f["mscore"], f["mark"],
                           f["batch"], f["hold"])
        if v >= 0:
            assert (v, score) == tuple(fresh), (t, v, score, fresh)
            seen["taken"] += 1
        elif spec[t % (2 * kb.LEAD)] >= 0:
            seen["dropped"] += 1
        return v, score

    Table(8, kb.LRU, 0).start(np.arange(4, dtype=np.int64))    # (compiles find_present
    monkeypatch.setattr(kb, "_foreseen", checked)           # before its globals change)
    for name in ("prefetch_read", "prefetch_write"):        # (intrinsics: compiled only)
        monkeypatch.setattr(kb, name, lambda a, offset: None)
    rng = np.random.default_rng(5)
    for ex in range(40):
        t = Table([2, 8, 32, 64][ex % 4], sorted(kb.POLICIES.values())[ex % 5], ex,
                  limit=(LIMIT, 160)[ex % 2])
        n = int(rng.integers(100, 200))
        keys = np.where(rng.random(n) < 0.05, rng.choice(POOL, n), rng.integers(-3000, 3000, n))
        keys = keys.astype(np.int64)
        (slots, mask, keys), rows, where, new = t.start(keys)
        held, spec = kb._row_work(kb._works(1), 0)
        kb._pass.py_func(np.arange(n), 0, n, slots, mask, keys, rng.integers(0, 9, n),
                         t.scores, t.mscore, t.mark, t.batch, t.hold, rows, where, new,
                         t.free, t.free.shape[0], t.fresh, t.size, t.limit, t.window,
                         t.policy, 0, 9, False, -1, 0, np.empty(n, np.int64),
                         np.empty(n, np.int64), np.empty(n, np.int64), 0,
                         np.empty(0, np.bool_), held, spec)
    assert seen["taken"] > 1000 and seen["dropped"] > 100, seen


def victim_oracle(slots, mask, key, window, mscore, mark, batch, hold):
    """The rule of ``_victim``, written plainly: the first slot of the window with the
    lowest score below ``hold``; with none and ``hold`` the largest score, the first
    slot holding a key not marked by this call."""
    h = int(first_slot(key, mask))
    window_slots = [(h + t) & mask for t in range(window)]
    low = min(mscore[s] for s in window_slots)
    if low < hold:
        s = next(s for s in window_slots if mscore[s] == low)
        return s, low
    if hold == kb.MAX:
        for s in window_slots:
            if slots[2 * s + 1] >= 0 and mark[s] != batch:
                return s, kb.MAX
    return -1, hold


@given(st.data())
@settings(max_examples=examples(60), deadline=None)
def test_victim_is_the_first_lowest_scored_slot_of_the_window(data):
    """``_victim`` (blocks of 32 slots in vector instructions, else two halves side by
    side) against the plain rule: scores from a few values, so ties across halves and
    blocks are common; windows odd and even, of one block and several, wrapping the
    index's end; ``hold`` below, among and above the scores."""
    cap = data.draw(st.sampled_from([8, 16, 64, 256]))
    mask = cap - 1
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    n_values = data.draw(st.integers(1, 4))
    mscore = rng.integers(0, n_values, cap).astype(np.int64)
    mscore[rng.random(cap) < 0.2] = kb.MAX
    slots = empty_slots(cap)
    full = rng.random(cap) < 0.7
    slots[1::2][full] = np.flatnonzero(full)
    mark = rng.integers(0, 3, cap).astype(kb.MARK)
    hold = data.draw(st.sampled_from([0, 1, 2, n_values, kb.MAX]))
    for key in list(rng.integers(-2 ** 63, 2 ** 63 - 1, 20)) + [-2 ** 63, 2 ** 63 - 1, -1, 0]:
        for window in [w for w in (1, 2, 3, 7, 8, 16, 31, 32, 33, 64, 96) if w <= cap] + [cap]:
            got = kb._victim(slots, mask, np.int64(key), window, mscore, mark, 2, np.int64(hold))
            want = victim_oracle(slots, mask, np.int64(key), window, mscore, mark, 2, hold)
            assert tuple(int(x) for x in got) == tuple(int(x) for x in want), (key, window)


@pytest.mark.parametrize("n", [0, 1, 1023, 5000, 20_011])
def test_by_range_is_a_stable_sort_by_range(n):
    """``by_range`` (blocks of positions counted and placed on all threads) against
    NumPy's stable argsort of each position's range (present keys by their slot,
    absent ones by their home slot): each position's place and the copies in that
    order."""
    from jit_kernels.bounded_groups import by_range
    rng = np.random.default_rng(n)
    mask, n_ranges = (1 << 16) - 1, 64
    keys = rng.integers(INT64_MIN, INT64_MAX, n, dtype=np.int64, endpoint=True)
    keys[:min(n, 4)] = [INT64_MIN, INT64_MAX, -1, 0][:min(n, 4)]
    present = rng.random(n) < 0.3
    rows = np.where(present, rng.integers(0, 1000, n), -2).astype(np.int64)
    where = np.where(present, rng.integers(0, mask + 1, n), -1).astype(np.int64)
    home = np.array([first_slot(k, mask) for k in keys], np.int64)
    ids = np.where(present, where, home) // ((mask + 1) // n_ranges)
    given = rng.integers(-9, 9, n, dtype=np.int64)
    starts, rank, k2, g2, r2, w2 = by_range(mask, keys, given, rows, where, n_ranges)
    order = np.argsort(ids, kind="stable")
    assert rank[order].tolist() == list(range(n))
    assert starts.tolist() == np.searchsorted(np.sort(ids), np.arange(n_ranges + 1)).tolist()
    for copy, a in ((k2, keys), (g2, given), (r2, rows), (w2, where)):
        assert copy.tolist() == a[order].tolist()
    # scores nobody reads (a policy other than custom) are not copied
    out = by_range(mask, keys, given, rows, where, n_ranges, False)
    assert out[3] is given
    for a, b in zip(out[:3] + out[4:], (starts, rank, k2, r2, w2)):
        assert a.tolist() == b.tolist()


@pytest.mark.parametrize("fill", [False, True])
def test_a_large_call_equals_the_serial_pass(fill):
    """A call of 9,000 positions (the grouping by range in 8 blocks, the evictions
    reported from 3 chunks of positions) into a full table of 12,000 keys and into one
    it cannot fill, against the serial pass on the reordered call."""
    rng = np.random.default_rng(7)
    kw = dict(limit=30_000, size=12_000, removed=500) if fill else dict(limit=12_000)
    table = Table(8, kb.LRU, 3, cap=1 << 15, **kw)
    present = table.slots[0::2][table.slots[1::2] >= 0]
    n = 9_000
    keys = np.where(rng.random(n) < 0.2, rng.choice(present, n),
                    rng.integers(-10 ** 6, 10 ** 6, n)).astype(np.int64)
    keys[:4] = [INT64_MIN, INT64_MAX, -1, 0]
    late, new = check_same_as_serial(table, keys, rng.integers(0, 9, n), 16)
    assert new.sum() > 5_000 and (late > 0).sum() > 20      # (ranges' ends in play)
