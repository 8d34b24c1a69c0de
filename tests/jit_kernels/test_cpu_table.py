"""CPU drivers (``jit_kernels.cpu_table``) against NumPy / dict oracles.

Small capacities force collisions and long probe chains; keys include the
extremes and batches repeat keys, since the drivers run in parallel and the
duplicate rules (one inserter per key, last write wins, sequential accum) are
what is easiest to get wrong.
"""
import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jit_kernels import cpu_table as k
from jit_kernels.initializers import CONSTANT, NORMAL, init_row
from jit_kernels.slots import DELETED, EMPTY, empty_slots

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
EXTREMES = [INT64_MIN, INT64_MAX, -1, 0]
POOL = EXTREMES + [1, 2, 3, 17, -17, INT64_MIN + 1, INT64_MAX - 1, 1 << 40, -(1 << 40)]
key_st = st.one_of(st.sampled_from(POOL), st.integers(INT64_MIN, INT64_MAX))
INIT = (NORMAL, 0.5, 2.0, 1234, np.zeros(4))
DIM = 4


def batch(keys):
    return np.asarray(keys, dtype=np.int64)


def insert(slots, keys, free=None, fresh=0):
    """find_or_insert_rows on ``keys``; returns rows, inserted, rows handed out."""
    keys = batch(keys)
    free = np.zeros(0, np.int64) if free is None else np.asarray(free, np.int64)
    rows = np.empty(keys.shape[0], np.int64)
    inserted = np.empty(keys.shape[0], np.bool_)
    alloc = np.zeros(1, np.int64)
    k.find_or_insert_rows(slots, slots.shape[0] // 2 - 1, keys, rows, inserted, alloc,
                          free, free.shape[0], fresh)
    return rows, inserted, int(alloc[0])


def index_map(slots):
    words = slots[1::2]
    keys = slots[0::2][words >= 0]
    assert len(set(keys.tolist())) == keys.shape[0], "a key occupies two slots"
    return dict(zip(keys.tolist(), words[words >= 0].tolist()))


def expected_init(key, init=INIT, dim=DIM):
    out = np.empty(dim, np.float32)
    init_row(out, key, *init)
    return out


# ---- find_or_insert_rows / find_rows ---------------------------------------------------

@given(st.lists(key_st, max_size=40), st.lists(key_st, max_size=40))
def test_find_or_insert_rows_duplicates(first, second):
    slots = empty_slots(128)
    oracle = {}
    for part in (first, second):
        before = dict(oracle)
        rows, inserted, handed = insert(slots, part, fresh=len(oracle))
        new_keys = list(dict.fromkeys(x for x in part if x not in before))
        assert handed == len(new_keys)
        for x in set(part):
            pos = [i for i, y in enumerate(part) if y == x]
            assert len({int(rows[i]) for i in pos}) == 1, "duplicates got different rows"
            n_ins = int(inserted[pos].sum())
            assert n_ins == (0 if x in before else 1), "exactly one inserter per new key"
            if x in before:
                assert rows[pos[0]] == before[x]
            oracle[x] = int(rows[pos[0]])
        # fresh rows are exactly the next ones, distinct per key
        got = sorted(oracle[x] for x in new_keys)
        assert got == list(range(len(before), len(before) + len(new_keys)))
    assert index_map(slots) == oracle


def test_find_or_insert_rows_reuses_free_list_first():
    slots = empty_slots(64)
    free = np.array([11, 4, 8, 2, 6], np.int64)
    # fewer new keys than free rows: they take the top of the free list
    rows, inserted, handed = insert(slots, [5, -1, 5, INT64_MIN], free=free, fresh=30)
    assert handed == 3 and inserted.sum() == 3
    assert sorted({int(r) for r in rows}) == sorted([8, 2, 6])
    # more new keys than free rows: all free rows, then fresh ones from fresh_start
    slots = empty_slots(64)
    ks = [INT64_MAX, 0, 1, 2, 3, 4, 5, 6, 0, 1]
    rows, inserted, handed = insert(slots, ks, free=free, fresh=30)
    assert handed == 8 and inserted.sum() == 8
    assert sorted({int(r) for r in rows}) == sorted(free.tolist() + [30, 31, 32])


def test_find_rows_counts_missing():
    slots = empty_slots(16)
    insert(slots, [INT64_MIN, INT64_MAX, -1])
    m = index_map(slots)
    q = batch([0, -1, INT64_MAX, 7, 0, INT64_MIN])
    rows = np.empty(q.shape[0], np.int64)
    assert k.find_rows(slots, 15, q, rows) == 3
    assert rows.tolist() == [-1, m[-1], m[INT64_MAX], -1, -1, m[INT64_MIN]]
    assert k.find_rows(slots, 15, batch([]), np.empty(0, np.int64)) == 0


def test_collision_heavy_small_table():
    """Capacity 16 at 75% load: chains of collisions, all keys still found."""
    slots = empty_slots(16)
    ks = EXTREMES + list(range(100, 108))
    rows, inserted, handed = insert(slots, ks + ks[::-1])
    assert handed == 12 and inserted.sum() == 12
    m = index_map(slots)
    assert set(m) == set(ks) and sorted(m.values()) == list(range(12))
    out = np.empty(len(ks), np.int64)
    assert k.find_rows(slots, 15, batch(ks), out) == 0
    assert out.tolist() == [m[x] for x in ks]


# ---- lookup / init_rows / gather -----------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lookup_hit_copies_miss_initialises(dtype):
    slots = empty_slots(32)
    present = [INT64_MIN, 0, 77]
    rows, _, _ = insert(slots, present)
    values = np.full((8, DIM), np.nan, dtype)
    for x, r in zip(present, rows):
        values[r] = np.arange(DIM) + 10 * r
    q = batch([77, INT64_MAX, 0, -1, 77, INT64_MIN, 5])
    out = np.empty((q.shape[0], DIM), dtype)
    exists = np.empty(q.shape[0], np.bool_)
    k.lookup(slots, 31, q, values, out, exists, *INIT)
    m = index_map(slots)
    assert exists.tolist() == [x in m for x in q.tolist()]
    for i, x in enumerate(q.tolist()):
        if x in m:
            np.testing.assert_array_equal(out[i], values[m[x]])
        else:
            want = np.empty(DIM, dtype)
            init_row(want, x, *INIT)
            np.testing.assert_array_equal(out[i], want)
    assert len(index_map(slots)) == 3          # lookup inserted nothing


def test_lookup_constant_initializer():
    slots = empty_slots(16)
    const = np.array([1.5, -2.0, 0.0, 7.0])
    out = np.empty((3, DIM), np.float32)
    exists = np.empty(3, np.bool_)
    k.lookup(slots, 15, batch([1, INT64_MIN, INT64_MAX]), np.empty((0, DIM), np.float32),
             out, exists, CONSTANT, 0.0, 0.0, 0, const)
    assert not exists.any()
    np.testing.assert_array_equal(out, np.tile(const.astype(np.float32), (3, 1)))


def test_init_rows_only_inserted_and_gather():
    values = np.full((6, DIM), -9.0, np.float32)
    keys = batch([3, INT64_MAX, 3, -1])
    rows = np.array([0, 2, 0, 5], np.int64)
    inserted = np.array([True, True, False, False])
    k.init_rows(values, rows, keys, inserted, *INIT)
    np.testing.assert_array_equal(values[0], expected_init(3))
    np.testing.assert_array_equal(values[2], expected_init(INT64_MAX))
    assert (values[[1, 3, 4, 5]] == -9.0).all()
    out = np.empty((4, DIM), np.float32)
    k.gather(values, np.array([5, 0, 2, 0], np.int64), out)
    np.testing.assert_array_equal(out, values[[5, 0, 2, 0]])


def test_init_gather_repeats_never_read_an_unwritten_row():
    """A repeat of a key inserted in the same batch may run before its inserter:
    it must still get the initial value, never what the row held before."""
    n = 1 << 16
    keys = batch(np.arange(n) * 7919 - (n // 2))
    rows = np.concatenate([np.arange(n), np.arange(n)]).astype(np.int64)
    both = np.concatenate([keys, keys])
    want = np.empty((n, DIM), np.float32)
    k.init_rows(want, np.arange(n, dtype=np.int64), keys, np.ones(n, np.bool_), *INIT)
    for fresh_start in (0, n // 2):
        # the second copy of each key inserts it, unless its row existed before the batch
        # (the kernel's contract: every inserted row is >= fresh_start)
        inserted = np.concatenate([np.zeros(n, np.bool_), np.arange(n) >= fresh_start])
        values = np.full((n, DIM), -9.0, np.float32)
        values[:fresh_start] = want[:fresh_start]      # rows that existed before the batch
        out = np.empty((2 * n, DIM), np.float32)
        k.init_gather(values, rows, both, inserted, fresh_start, out, *INIT)
        np.testing.assert_array_equal(out, np.concatenate([want, want]))
        np.testing.assert_array_equal(values[fresh_start:], want[fresh_start:])


# ---- assign_rows -----------------------------------------------------------------------

@given(st.lists(st.integers(0, 9), max_size=50), st.sampled_from([1, 2, 3, 7, 16]))
def test_assign_rows_last_wins(rows, owners):
    rows = np.asarray(rows, np.int64)
    src = (np.arange(rows.shape[0] * 3, dtype=np.float32).reshape(-1, 3) + 1)
    values = np.zeros((10, 3), np.float32)
    k.assign_rows(values, rows, src, owners)
    want = np.zeros((10, 3), np.float32)
    for i, r in enumerate(rows):               # the sequential loop
        want[r] = src[i]
    np.testing.assert_array_equal(values, want)


def test_assign_rows_default_owner_count():
    rows = np.array([4, 1, 4, 4, 0, 1], np.int64)
    src = np.arange(6, dtype=np.float64)[:, None] * np.ones((1, 2))
    values = np.full((5, 2), -1.0)
    k.assign_rows(values, rows, src, numba.get_num_threads())
    assert values[:, 0].tolist() == [4.0, 5.0, -1.0, -1.0, 3.0]


# ---- group_starts / accum_groups --------------------------------------------------------

@given(st.lists(st.integers(-3, 3), max_size=40))
def test_group_starts(vals):
    a = np.sort(np.asarray(vals, np.int64))
    got = k.group_starts(a).tolist()
    want = [i for i in range(len(a)) if i == 0 or a[i] != a[i - 1]] + [len(a)]
    if len(a) == 0:
        want = [0]
    assert got == want


def test_group_starts_extremes():
    a = batch(sorted([INT64_MIN, INT64_MIN, -1, 0, 0, 0, INT64_MAX]))
    assert k.group_starts(a).tolist() == [0, 2, 3, 6, 7]


def run_accum(slots, values, keys, old, new, exists, free, fresh):
    keys = batch(keys)
    order = np.argsort(keys, kind="stable")
    starts = k.group_starts(keys[order])
    n = keys.shape[0]
    rows = np.empty(n, np.int64)
    inserted = np.empty(n, np.bool_)
    alloc = np.zeros(1, np.int64)
    k.accum_groups(slots, slots.shape[0] // 2 - 1, keys, order, starts, values, old, new,
                   exists, rows, inserted, alloc, free, free.shape[0], fresh)
    return rows, inserted, int(alloc[0])


@given(st.lists(st.tuples(st.sampled_from(POOL[:8]), st.integers(-5, 5), st.integers(-5, 5),
                          st.booleans()), max_size=40),
       st.lists(st.sampled_from(POOL[:8]), unique=True, max_size=8))
def test_accum_groups_sequential_semantics(ops, present):
    dim = 2
    slots = empty_slots(32)
    values = np.zeros((20, dim), np.float32)
    rows0, _, _ = insert(slots, present)
    oracle = {}
    for x, r in zip(present, rows0):
        values[r] = [x % 7, -(x % 5)]
        oracle[x] = values[r].copy()
    keys = [o[0] for o in ops]
    old = np.array([[o[1], 2 * o[1]] for o in ops], np.float32).reshape(-1, dim)
    new = np.array([[o[2], o[2] - 1] for o in ops], np.float32).reshape(-1, dim)
    exists = np.array([o[3] for o in ops], np.bool_)
    free = np.array([19, 18], np.int64)           # free rows are taken first (top down)
    rows, inserted, handed = run_accum(slots, values, keys, old, new, exists, free, len(present))
    want_rows, want_ins, n_new = [], [], 0
    for p, x in enumerate(keys):                   # the sequential loop
        if exists[p] and x in oracle:
            oracle[x] = oracle[x] + (new[p] - old[p])
            want_rows.append("row")
            want_ins.append(False)
        elif not exists[p] and x not in oracle:
            oracle[x] = new[p].copy()
            want_rows.append("row")
            want_ins.append(True)
            n_new += 1
        else:
            want_rows.append(-1)
            want_ins.append(False)
    assert handed == n_new
    assert inserted.tolist() == want_ins
    m = index_map(slots)
    assert set(m) == set(oracle)
    for p, x in enumerate(keys):
        assert rows[p] == (m[x] if want_rows[p] == "row" else -1)
    for x, v in oracle.items():
        np.testing.assert_array_equal(values[m[x]], v)
    new_rows = sorted(m[x] for x in oracle if x not in present)
    handout_order = [18, 19] + list(range(len(present), len(present) + n_new))
    assert new_rows == sorted(handout_order[:n_new])       # free list first, then fresh


def test_accum_groups_insert_then_add_in_one_batch():
    slots = empty_slots(16)
    values = np.zeros((4, 1), np.float32)
    keys = [INT64_MIN, INT64_MIN, INT64_MIN, -1, -1]
    old = np.array([[0], [1], [0], [0], [0]], np.float32)
    new = np.array([[5], [4], [9], [2], [3]], np.float32)
    exists = np.array([False, True, False, True, False])
    rows, inserted, handed = run_accum(slots, values, keys, old, new, exists,
                                       np.zeros(0, np.int64), 0)
    m = index_map(slots)
    # INT64_MIN: insert 5, add 4-1, ignore (present, exists False) -> 8; -1: ignore, insert 3
    assert values[m[INT64_MIN], 0] == 8 and values[m[-1], 0] == 3
    assert inserted.tolist() == [True, False, False, False, True]
    assert rows.tolist() == [m[INT64_MIN], m[INT64_MIN], -1, -1, m[-1]]
    assert handed == 2


# ---- erase_keys / rehash / export_slots -----------------------------------------------

@given(st.lists(key_st, unique=True, max_size=40), st.lists(key_st, max_size=60))
def test_erase_keys_frees_each_row_once(present, to_erase):
    slots = empty_slots(64)
    insert(slots, present)
    before = index_map(slots)
    to_erase = to_erase + [x for x in present[::2]] * 2        # duplicates of present keys
    freed = np.empty(len(to_erase), np.int64)
    k.erase_keys(slots, 63, batch(to_erase), freed)
    for x in set(to_erase):
        pos = [i for i, y in enumerate(to_erase) if y == x]
        got = [int(freed[i]) for i in pos if freed[i] >= 0]
        assert got == ([before[x]] if x in before else []), "row freed more or less than once"
    assert (freed >= -1).all()
    after = index_map(slots)
    assert after == {x: r for x, r in before.items() if x not in set(to_erase)}
    assert int((slots[1::2] == DELETED).sum()) == len(before) - len(after)


@given(st.lists(key_st, unique=True, min_size=1, max_size=45), st.data())
def test_rehash_keeps_keys_and_drops_tombstones(present, data):
    slots = empty_slots(64)
    insert(slots, present)
    gone = data.draw(st.lists(st.sampled_from(present), max_size=len(present)))
    k.erase_keys(slots, 63, batch(gone), np.empty(len(gone), np.int64))
    live = index_map(slots)
    new_cap = data.draw(st.sampled_from([64, 128, 1024]))
    new = empty_slots(new_cap)
    k.rehash(slots, new, new_cap - 1)
    assert index_map(new) == live
    words = new[1::2]
    assert not (words == DELETED).any()
    assert int((words >= 0).sum()) == len(live)
    assert int((words == EMPTY).sum()) == new_cap - len(live)
    rows = np.empty(len(present), np.int64)
    missing = k.find_rows(new, new_cap - 1, batch(present), rows)
    assert missing == len(present) - len(live)
    assert rows.tolist() == [live.get(x, -1) for x in present]


def test_rehash_to_tight_capacity():
    slots = empty_slots(256)
    ks = EXTREMES + list(range(1000, 1012))
    insert(slots, ks)
    live = index_map(slots)
    new = empty_slots(16)                      # exactly full: 16 keys in 16 slots
    k.rehash(slots, new, 15)
    assert index_map(new) == live and (new[1::2] >= 0).all()


@pytest.mark.parametrize("n_chunks", [1, 3, 7, 64, 1000])
def test_export_slots(n_chunks):
    slots = empty_slots(64)
    ks = EXTREMES + list(range(-20, 20, 3))
    insert(slots, ks)
    k.erase_keys(slots, 63, batch(ks[::4]), np.empty(len(ks[::4]), np.int64))
    keys, rows = k.export_slots(slots, n_chunks)
    full = np.nonzero(slots[1::2] >= 0)[0]
    assert keys.tolist() == slots[0::2][full].tolist()        # slot order
    assert rows.tolist() == slots[1::2][full].tolist()
    assert dict(zip(keys.tolist(), rows.tolist())) == index_map(slots)
    assert set(keys.tolist()) == set(ks) - set(ks[::4])


@pytest.mark.parametrize("n_chunks", [1, 7, 64])
def test_export_by_row_builds_agree(n_chunks):
    """Small indexes run the serial build of export_by_row, large ones the parallel one:
    each gives every live (key, row) once, rows ascending; erased keys' rows are gone."""
    slots = empty_slots(1 << 14)
    ks = EXTREMES + list(range(-5000, 5000, 7))
    rows = insert(slots, ks)[0]
    k.erase_keys(slots, (1 << 14) - 1, batch(ks[::5]), np.empty(len(ks[::5]), np.int64))
    live = index_map(slots)
    got = [build(slots, int(rows.max()) + 1, n_chunks)
           for build in (k.export_by_row.serial, k.export_by_row.parallel)]
    for keys, r in got:
        assert r.tolist() == sorted(live.values())
        assert dict(zip(keys.tolist(), r.tolist())) == live
    assert k.export_by_row.serial is not k.export_by_row.parallel


@pytest.mark.parametrize("owners", [1, 2, 3])
def test_assign_rows_builds_last_write_wins(owners):
    """Both builds of assign_rows (the serial one for small batches) give each repeated
    row the batch's last value for it, as a Python loop does."""
    rng = np.random.default_rng(owners)
    rows = rng.integers(0, 50, 3000)
    src = rng.standard_normal((rows.size, 5)).astype(np.float32)
    want = _last(rows, src)
    for build in (k.assign_rows.serial, k.assign_rows.parallel):
        got = np.zeros((50, 5), np.float32)
        build(got, rows, src, owners)
        np.testing.assert_array_equal(got, want)
    for n in (20, rows.size):       # the driver: the serial build (one owner) below its cut
        got = np.zeros((50, 5), np.float32)
        k.assign_rows(got, rows[:n], src[:n], owners)
        np.testing.assert_array_equal(got, _last(rows[:n], src[:n]))


def _last(rows, src):
    out = np.zeros((50, src.shape[1]), src.dtype)
    for i, r in enumerate(rows):
        out[r] = src[i]
    return out


def test_export_empty():
    keys, rows = k.export_slots(empty_slots(16), 64)
    assert keys.shape == (0,) and rows.shape == (0,)


def test_large_batches_match_dict():
    """Batches far longer than the prefetch distance, on a table near its load limit."""
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(INT64_MIN, INT64_MAX, size=3000, dtype=np.int64))
    keys = np.concatenate([keys, batch(EXTREMES)])
    slots = empty_slots(4096)                                  # load ~0.73
    rows, inserted, handed = insert(slots, keys)
    assert handed == len(set(keys.tolist())) == inserted.sum()
    m = index_map(slots)
    values = np.arange(handed * DIM, dtype=np.float32).reshape(handed, DIM)
    q = np.concatenate([keys[::-1], rng.integers(INT64_MIN, INT64_MAX, 2000, dtype=np.int64)])
    q = rng.permutation(q)
    out = np.empty((q.size, DIM), np.float32)
    exists = np.empty(q.size, np.bool_)
    k.lookup(slots, 4095, q, values, out, exists, *INIT)
    found = np.array([x in m for x in q.tolist()])
    np.testing.assert_array_equal(exists, found)
    np.testing.assert_array_equal(out[found], values[[m[x] for x in q[found].tolist()]])
    r = np.empty(q.size, np.int64)
    assert k.find_rows(slots, 4095, q, r) == int((~found).sum())
    g = np.empty((int(found.sum()), DIM), np.float32)
    k.gather(values, r[found], g)
    np.testing.assert_array_equal(g, out[found])
    freed = np.empty(q.size, np.int64)
    k.erase_keys(slots, 4095, q, freed)
    assert sorted(freed[freed >= 0].tolist()) == sorted(m.values())
    assert index_map(slots) == {}


@pytest.mark.skipif(not hasattr(k, "copy_rows"), reason="no copy_rows kernel")
def test_copy_rows():
    src = np.arange(40, dtype=np.float32).reshape(10, 4)
    dst = np.full((16, 4), -1.0, np.float32)
    k.copy_rows(src, dst, 7)
    np.testing.assert_array_equal(dst[:7], src[:7])
    assert (dst[7:] == -1).all()
