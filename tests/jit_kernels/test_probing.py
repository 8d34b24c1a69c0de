"""Per-element hash-index bodies (``jit_kernels.probing``, ``slots``, ``hashing``).

Small capacities force collisions, long probe chains and wrap-around; keys
include the extremes (INT64_MIN, INT64_MAX, -1, 0), since no key is reserved.
The oracle is a plain dict ``key -> row``.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jit_kernels.hashing import hash_key, mix64
from jit_kernels.probing import (erase_key, find_or_insert_key, find_row, find_row_x4,
                                 find_slot, insert_unique, take_row)
from jit_kernels.slots import (BUSY, DELETED, EMPTY, empty_slots, first_slot, is_busy,
                               is_empty, is_full, next_slot)

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
EXTREMES = [INT64_MIN, INT64_MAX, -1, 0, 1, INT64_MIN + 1, INT64_MAX - 1]
keys_st = st.one_of(st.sampled_from(EXTREMES), st.integers(INT64_MIN, INT64_MAX),
                    st.integers(-40, 40))


def keys_with_home(home, mask, n, start=0):
    """``n`` distinct keys whose home slot is ``home``."""
    out, k = [], start
    while len(out) < n:
        if first_slot(k, mask) == home:
            out.append(k)
        k += 1
    return out


def fresh_alloc():
    return np.zeros(1, np.int64), np.zeros(0, np.int64)


def full_slot_map(slots):
    """{key: row} of the full slots, asserting no key appears twice."""
    words = slots[1::2]
    keys = slots[0::2][words >= 0]
    assert len(set(keys.tolist())) == keys.shape[0], "a key occupies two slots"
    return dict(zip(keys.tolist(), words[words >= 0].tolist()))


# ---- slot words and probing order ------------------------------------------------------

def test_slot_words_are_distinct_and_not_rows():
    assert len({EMPTY, DELETED, BUSY}) == 3
    for w in (EMPTY, DELETED, BUSY):
        assert w < 0 and not is_full(w)
    assert is_empty(EMPTY) and not is_empty(DELETED) and not is_empty(BUSY) and not is_empty(0)
    assert is_busy(BUSY) and not is_busy(EMPTY) and not is_busy(DELETED)
    assert is_full(0) and is_full(12345)


@pytest.mark.parametrize("cap", [1, 2, 16, 1024])
def test_empty_slots(cap):
    s = empty_slots(cap)
    assert s.dtype == np.int64 and s.shape == (2 * cap,)
    assert (s[1::2] == EMPTY).all()


@pytest.mark.parametrize("cap", [0, -4, 3, 12, 1000])
def test_empty_slots_rejects_non_power_of_two(cap):
    with pytest.raises(ValueError, match="power of two"):
        empty_slots(cap)


def test_next_slot_wraps_and_visits_every_slot():
    mask = 15
    seen, s = [], 13
    for _ in range(16):
        seen.append(s)
        s = next_slot(s, mask)
    assert sorted(seen) == list(range(16)) and s == 13
    assert next_slot(15, 15) == 0


@given(keys_st, st.sampled_from([0, 1, 7, 15, 1023]))
def test_first_slot_in_range_and_deterministic(key, mask):
    s = first_slot(key, mask)
    assert 0 <= s <= mask
    assert s == first_slot(key, mask)
    assert s == int(hash_key(key)) & mask


def test_hash_is_a_bijection_sample_and_spreads_extremes():
    ks = np.array(EXTREMES + list(range(-500, 500)), np.int64)
    hs = {int(hash_key(int(k))) for k in ks}
    assert len(hs) == len(set(ks.tolist()))         # mix64 is a bijection: no collisions
    homes = [first_slot(int(k), 63) for k in range(4096)]
    counts = np.bincount(homes, minlength=64)
    assert counts.min() > 30 and counts.max() < 110   # roughly 64 per slot
    assert int(mix64(np.uint64(0))) == int(mix64(np.uint64(0)))


# ---- find / insert ----------------------------------------------------------------------

def test_empty_table_finds_nothing():
    s = empty_slots(8)
    for k in EXTREMES:
        assert find_slot(s, 7, k) == -1 and find_row(s, 7, k) == -1
        assert erase_key(s, 7, k) == -1
    assert (s[1::2] == EMPTY).all()


def test_extreme_keys_are_ordinary_keys():
    s = empty_slots(16)
    alloc, free = fresh_alloc()
    rows = {}
    for k in EXTREMES:
        r, ins = find_or_insert_key(s, 15, k, alloc, free, 0, 0)
        assert ins
        rows[k] = r
    assert sorted(rows.values()) == list(range(len(EXTREMES)))
    for k in EXTREMES:
        assert find_row(s, 15, k) == rows[k]
        r, ins = find_or_insert_key(s, 15, k, alloc, free, 0, 0)
        assert (r, ins) == (rows[k], False)
    assert alloc[0] == len(EXTREMES)
    assert full_slot_map(s) == rows
    # keys stored in an EMPTY slot (key word 0) must not match key 0 before insert
    s2 = empty_slots(4)
    assert find_row(s2, 3, 0) == -1


def test_long_collision_chain_with_wraparound():
    mask = 15
    chain = keys_with_home(mask, mask, 12)       # home = last slot: the chain wraps to 0..
    s = empty_slots(16)
    alloc, free = fresh_alloc()
    for i, k in enumerate(chain):
        assert find_or_insert_key(s, mask, k, alloc, free, 0, 100) == (100 + i, True)
    # they sit in consecutive slots starting at the home slot, wrapping around
    for i, k in enumerate(chain):
        assert find_slot(s, mask, k) == (mask + i) & mask
        assert find_row(s, mask, k) == 100 + i == find_row_x4(s, mask, k)
    # an absent key with the same home walks the whole chain and misses
    absent = keys_with_home(mask, mask, 1, start=chain[-1] + 1)[0]
    assert find_row(s, mask, absent) == -1 == find_row_x4(s, mask, absent)


def test_full_table_terminates():
    mask = 7
    s = empty_slots(8)
    alloc, free = fresh_alloc()
    ks = list(range(100, 108))
    for k in ks:
        assert find_or_insert_key(s, mask, k, alloc, free, 0, 0)[1]
    assert (s[1::2] >= 0).all()
    assert find_slot(s, mask, 5) == -1 and find_row(s, mask, 5) == -1
    assert find_row_x4(s, mask, 5) == -1
    assert find_or_insert_key(s, mask, 5, alloc, free, 0, 0) == (-1, False)
    assert alloc[0] == 8                          # no row taken for the failed insert
    assert insert_unique(s, mask, 5, 99) == -1
    for k in ks:
        assert find_row(s, mask, k) >= 0 and find_row_x4(s, mask, k) == find_row(s, mask, k)


def test_tombstones_keep_chains_and_are_not_reused():
    mask = 15
    a, b, c = keys_with_home(3, mask, 3)
    s = empty_slots(16)
    alloc, free = fresh_alloc()
    ra = find_or_insert_key(s, mask, a, alloc, free, 0, 0)[0]
    rb = find_or_insert_key(s, mask, b, alloc, free, 0, 0)[0]
    rc = find_or_insert_key(s, mask, c, alloc, free, 0, 0)[0]
    assert erase_key(s, mask, a) == ra
    assert s[2 * 3 + 1] == DELETED
    assert erase_key(s, mask, a) == -1           # second erase: nothing
    assert find_row(s, mask, b) == rb and find_row(s, mask, c) == rc   # probe passes the tombstone
    assert find_or_insert_key(s, mask, b, alloc, free, 0, 0) == (rb, False)
    r2, ins = find_or_insert_key(s, mask, a, alloc, free, 0, 0)
    assert ins and r2 == 3                        # fresh row 3 (no free list given)
    assert find_slot(s, mask, a) == 6             # after the chain, tombstone untouched
    assert s[2 * 3 + 1] == DELETED
    assert full_slot_map(s) == {a: 3, b: rb, c: rc}


@given(st.lists(keys_st, min_size=1, max_size=60, unique=True), st.data())
def test_four_slot_probe_is_find_row_at_high_load(keys, data):
    """find_row_x4 (four slots a probe step, the GPU lookup's variant) against
    find_row on an index of 64 slots up to load 0.94, with tombstones: present, erased
    and absent keys."""
    mask = 63
    s = empty_slots(64)
    alloc, free = fresh_alloc()
    for k in keys:
        find_or_insert_key(s, mask, k, alloc, free, 0, 0)
    for k in data.draw(st.lists(st.sampled_from(keys), max_size=len(keys) // 3)):
        erase_key(s, mask, k)
    for k in keys + data.draw(st.lists(keys_st, max_size=10)):
        assert find_row_x4(s, mask, k) == find_row(s, mask, k)


def test_take_row_free_list_top_down_then_fresh():
    alloc = np.zeros(1, np.int64)
    free = np.array([7, 3, 9], np.int64)
    got = [take_row(alloc, free, 3, 20) for _ in range(5)]
    assert got == [9, 3, 7, 20, 21]
    assert alloc[0] == 5
    alloc[0] = 0
    assert take_row(alloc, free, 1, 20) == 7     # only the first n_free entries count
    assert take_row(alloc, free, 1, 20) == 20


def test_insert_unique_and_find():
    mask = 15
    ks = keys_with_home(0, mask, 5) + [INT64_MIN, INT64_MAX]
    s = empty_slots(16)
    for i, k in enumerate(ks):
        assert insert_unique(s, mask, k, 40 + i) >= 0
    for i, k in enumerate(ks):
        assert find_row(s, mask, k) == 40 + i
    assert full_slot_map(s) == {k: 40 + i for i, k in enumerate(ks)}


@given(st.lists(st.tuples(st.sampled_from(["ins", "del"]), keys_st), max_size=60),
       st.sampled_from([64, 128]))
def test_random_insert_erase_sequences_match_dict(ops, cap):
    """Sequences of inserts and erases (tombstones pile up) against a dict oracle."""
    mask = cap - 1
    s = empty_slots(cap)
    alloc = np.zeros(1, np.int64)
    free = np.zeros(0, np.int64)
    oracle = {}
    next_row = 0
    for op, k in ops:
        if op == "ins":
            r, ins = find_or_insert_key(s, mask, k, alloc, free, 0, 0)
            if k in oracle:
                assert (r, ins) == (oracle[k], False)
            else:
                assert (r, ins) == (next_row, True)
                oracle[k] = r
                next_row += 1
        else:
            assert erase_key(s, mask, k) == oracle.pop(k, -1)
        for key, row in oracle.items():
            assert find_row(s, mask, key) == row == find_row_x4(s, mask, key)
        assert find_row_x4(s, mask, k) == oracle.get(k, -1)     # four slots a step too
    assert full_slot_map(s) == oracle
    n_deleted = int((s[1::2] == DELETED).sum())
    assert n_deleted + len(oracle) == next_row    # each insert used a new slot


def test_claim_hands_out_distinct_tickets_in_parallel():
    """``claim`` (the row counter of take_row) on the CPU: one ticket per call, no gaps,
    from many threads at once; int32 and int64 counters."""
    from numba import njit, prange

    from jit_kernels.atomics import claim

    @njit(parallel=True)
    def draw(counter, out):
        for i in prange(out.shape[0]):
            out[i] = claim(counter, 0)

    for dtype in (np.int64, np.int32):
        counter = np.array([5], dtype)
        out = np.empty(20000, np.int64)
        draw(counter, out)
        assert int(counter[0]) == 5 + out.shape[0]
        assert (np.sort(out) == np.arange(5, 5 + out.shape[0])).all()
