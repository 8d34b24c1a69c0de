"""A bounded table loaded at another ``max_capacity`` or index layout
(``Variable.load(path, max_capacity=..., evict_window=...)``): every key when it fits,
else the highest-scored, with their values, optimizer slots and scores."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numbaemb as ne
from numbaemb import checkpoint
from numbaemb.bounded import SCORE
from tests.sizing import examples

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
EXTREMES = [INT64_MIN, INT64_MAX, -1, 0]
LAYOUTS = ["bucket", 32, 4]


def _saved(tmp_path, keys, scores, window, capacity=None):
    """A custom-scored bounded table holding ``keys`` (values: their positions), saved."""
    v = ne.Variable(dim=3, max_capacity=capacity or max(1, len(keys)), evict="custom",
                    evict_window=window, name="resized")
    keys = np.asarray(keys, np.int64)
    v.upsert(keys, np.arange(3 * len(keys), dtype=np.float32).reshape(-1, 3),
             scores=np.asarray(scores, np.int64))
    path = str(tmp_path / f"t-{window}.nbe")
    v.save(path)
    return v, path


def _scores(v, keys):
    shard = v.shards[0]
    return shard.columns[SCORE].data[shard.find_rows(np.asarray(keys, np.int64)), 0]


@settings(max_examples=examples(30), deadline=None)
@given(st.data())
def test_a_smaller_or_larger_table_keeps_the_highest_scored_keys(tmp_path_factory, data):
    extra = data.draw(st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=120, unique=True))
    keys = list(dict.fromkeys(EXTREMES + extra))
    # few distinct scores: ties at the cut are likely
    scores = data.draw(st.lists(st.sampled_from([INT64_MIN, -5, -1, 0, 1, 7, INT64_MAX - 1]),
                                min_size=len(keys), max_size=len(keys)))
    saved_as = data.draw(st.sampled_from(LAYOUTS))
    window = data.draw(st.sampled_from([None] + LAYOUTS))
    capacity = data.draw(st.integers(1, len(keys) + 40))
    v, path = _saved(tmp_path_factory.mktemp("ck"), keys, scores, saved_as)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        u = ne.Variable.load(path, max_capacity=capacity, evict_window=window)
    assert u.max_capacity == capacity and u.evict == "custom"
    assert u.evict_window == (saved_as if window is None else window)
    held, _ = u.export()
    assert np.unique(held).shape[0] == held.shape[0] <= capacity
    left = np.setdiff1d(np.asarray(keys, np.int64), held)
    if capacity >= len(keys) and not caught:
        assert left.shape[0] == 0
    if capacity < len(keys):
        assert any(f"{len(keys) - capacity} keys of checkpoint" in str(w.message)
                   for w in caught)
    # no kept key scores below a left-out one, except where the new index itself
    # dropped a key (a full bucket: its own warning)
    if left.shape[0] and held.shape[0] and not any("did not fit" in str(w.message)
                                                     for w in caught):
        assert _scores(u, held).min() >= _scores(v, left).max()
    # what is kept is what was saved: values, scores
    np.testing.assert_array_equal(u.lookup(held), v.lookup(held))
    np.testing.assert_array_equal(_scores(u, held), _scores(v, held))


def test_distinct_scores_keep_exactly_the_top_ones(tmp_path):
    rng = np.random.default_rng(3)
    keys = rng.choice(np.arange(-10**6, 10**6), 400, replace=False)
    scores = rng.permutation(400) * 11 - 2000
    v, path = _saved(tmp_path, keys, scores, 32)
    with pytest.warns(UserWarning, match="300 keys of checkpoint .* max_capacity=100"):
        u = ne.Variable.load(path, max_capacity=100)
    top = keys[np.argsort(-scores)[:100]]
    assert sorted(u.export()[0].tolist()) == sorted(top.tolist())


def test_a_larger_table_takes_new_keys_without_evicting_the_loaded_ones(tmp_path):
    """(Into a window index: a bucketed one evicts from a full bucket before the
    table is full.)"""
    keys = np.arange(50, dtype=np.int64) * 131
    v, path = _saved(tmp_path, keys, np.arange(50), "bucket")
    u = ne.Variable.load(path, max_capacity=500, evict_window=32)
    u.upsert(np.arange(10**6, 10**6 + 400), np.zeros((400, 3)), scores=np.zeros(400, np.int64))
    assert u.size() == 450 and u.lookup(keys, return_exists=True)[1].all()
    np.testing.assert_array_equal(u.lookup(keys), v.lookup(keys))


def test_optimizer_slots_and_the_clock_come_along(tmp_path):
    v = ne.Variable(dim=2, max_capacity=64, evict="lru", name="lru_slots")
    opt = ne.optimizers.Adam(0.1)
    for step in range(4):
        keys = np.arange(16 * step, 16 * step + 20, dtype=np.int64)
        ne.optimizers.apply_gradients(v, opt, keys, np.ones((20, 2), np.float32),
                                      step=step + 1)
    path = str(tmp_path / "lru.nbe")
    v.save(path)
    with pytest.warns(UserWarning, match="keys of checkpoint"):
        u = ne.Variable.load(path, max_capacity=30, evict_window=8)
    held, _ = u.export()
    assert held.shape[0] == 30
    # the 20 keys of the last step, and 10 of the 16 last seen a step before
    assert set(range(48, 68)) <= set(held.tolist()) <= set(range(32, 68))
    for name in v.shards[0].columns:
        a, b = v.shards[0].columns[name].data, u.shards[0].columns[name].data
        np.testing.assert_array_equal(a[v.shards[0].find_rows(held)],
                                      b[u.shards[0].find_rows(held)])
    assert u._clock == v._clock


def test_bytes_and_errors(tmp_path):
    v, _ = _saved(tmp_path, [1, 2, 3], [3, 2, 1], "bucket")
    with pytest.warns(UserWarning, match="1 keys of checkpoint <bytes> left out"):
        u = checkpoint.from_bytes(checkpoint.to_bytes(v), max_capacity=2, evict_window=16)
    assert sorted(u.export()[0].tolist()) == [1, 2] and u.evict_window == 16
    plain = ne.Variable(dim=3, name="plain")
    plain.upsert(np.array([5]), np.ones((1, 3)))
    path = str(tmp_path / "plain.nbe")
    plain.save(path)
    for kw, error, match in [
            (dict(evict_window=8), ValueError, "evict_window given, but checkpoint .* "
                                               "without max_capacity: give max_capacity"),
            (dict(max_capacity=0), ValueError, "max_capacity must be >= 1"),
            (dict(evict_window="buckets"), ValueError, "evict_window must be a positive "
                                                       "int or 'bucket'"),
            (dict(max_capacity=2.0), TypeError, "max_capacity must be an int")]:
        with pytest.raises(error, match=match):
            ne.Variable.load(path, **kw)


def test_a_table_without_bounds_loads_bounded_when_its_keys_fit(tmp_path):
    """Its keys all come, scored 0 (older than any later insert: evicted first), in one
    shard; more keys than ``max_capacity`` and no scores to choose by are refused."""
    plain = ne.Variable(dim=3, num_shards=3, name="grown")
    keys = np.array(EXTREMES + list(range(1, 21)), np.int64)
    plain.upsert(keys, np.arange(3 * keys.size, dtype=np.float32).reshape(-1, 3))
    path = str(tmp_path / "grown.nbe")
    plain.save(path)
    u = ne.Variable.load(path, max_capacity=30, evict_window=8)
    assert (u.max_capacity, u.evict, u.evict_window, u.num_shards) == (30, "lru", 8, 1)
    np.testing.assert_array_equal(u.lookup(keys), plain.lookup(keys))
    np.testing.assert_array_equal(_scores(u, keys), np.zeros(keys.size, np.int64))
    u.find_or_insert(np.arange(100, 110))            # 10 new keys: 4 loaded ones evicted
    assert u.size() == 30 and u.lookup(np.arange(100, 110), return_exists=True)[1].all()
    with pytest.raises(ValueError, match="more keys than max_capacity=10 and no scores"):
        ne.Variable.load(path, max_capacity=10)
