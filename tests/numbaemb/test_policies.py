"""Restrict policies against a dict oracle of scores."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import numbaemb as ne
from numbaemb.policies import FrequencyRestrictPolicy, TimestampRestrictPolicy

EXTREMES = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]
key_lists = st.lists(st.sampled_from(EXTREMES + list(range(1, 12))), min_size=1, max_size=30)


@pytest.mark.parametrize("num_shards", [1, 3])
@given(batches=st.lists(key_lists, min_size=1, max_size=6), keep=st.integers(0, 10))
def test_frequency_matches_oracle(num_shards, batches, keep):
    v = ne.Variable(dim=2, num_shards=num_shards)
    p = FrequencyRestrictPolicy(v)
    counts = {}
    for b in batches:
        ids = np.array(b, np.int64)
        v.find_or_insert(ids)
        p.update(ids)
        for k in b:
            counts[k] = counts.get(k, 0) + 1
    keys, freq = v.export(p.column)
    assert dict(zip(keys.tolist(), freq[:, 0].tolist())) == counts
    removed = p.apply_restriction(keep)
    left = set(v.export()[0].tolist())
    assert removed == max(0, len(counts) - keep) and len(left) == min(keep, len(counts))
    # every kept key is at least as frequent as every evicted one
    evicted = set(counts) - left
    if left and evicted:
        assert min(counts[k] for k in left) >= max(counts[k] for k in evicted)


@pytest.mark.parametrize("num_shards", [1, 2])
@given(batches=st.lists(key_lists, min_size=1, max_size=6), keep=st.integers(0, 10))
def test_timestamp_keeps_most_recent(num_shards, batches, keep):
    v = ne.Variable(dim=2, num_shards=num_shards)
    p = TimestampRestrictPolicy(v)
    last = {}
    for step, b in enumerate(batches):
        v.find_or_insert(np.array(b, np.int64))
        p.update(np.array(b, np.int64))
        for k in b:
            last[k] = step
    p.apply_restriction(keep)
    left = set(v.export()[0].tolist())
    assert len(left) == min(keep, len(last))
    evicted = set(last) - left
    if left and evicted:
        assert min(last[k] for k in left) >= max(last[k] for k in evicted)


def test_restriction_removes_every_column_and_rows_are_reused():
    v = ne.Variable(dim=3, initializer=ne.initializers.Constant(1.0))
    p = FrequencyRestrictPolicy(v)
    ids = np.array([1, 1, 2, 3, 3, 3])
    v.find_or_insert(ids)
    p.update(ids)
    assert p.apply_restriction(2, trigger=2) == 1
    assert sorted(v.export(p.column)[0].tolist()) == [1, 3]
    v.upsert(np.array([9]), np.full((1, 3), 5.0, np.float32))   # reuses key 2's row
    keys, freq = v.export(p.column)
    assert dict(zip(keys.tolist(), freq[:, 0].tolist())) == {1: 2, 3: 3, 9: 0}
    assert v.lookup(np.array([9])).tolist() == [[5.0, 5.0, 5.0]]


def test_trigger_and_bad_arguments():
    v = ne.Variable(dim=1)
    p = TimestampRestrictPolicy(v)
    v.find_or_insert(np.arange(5))
    p.update(np.arange(5))
    assert p.apply_restriction(3, trigger=10) == 0 and v.size() == 5
    with pytest.raises(ValueError, match="num_reserved"):
        p.apply_restriction(-1)
    with pytest.raises(ValueError, match="trigger"):
        p.apply_restriction(3, trigger=2)
    assert v.size() == 5


def test_timestamp_resume_after_restore(tmp_path):
    """A restored timestamp column: ``resume`` puts the clock at its highest stamp, so
    ids used after the restore outlast every restored one (a fresh policy on the loaded
    table would stamp them 1, below the restored ids)."""
    v = ne.Variable(dim=2)
    p = TimestampRestrictPolicy(v)
    for b in ([1, 2], [3], [4, 5]):
        v.find_or_insert(np.array(b))
        p.update(np.array(b))
    v.save(str(tmp_path / "t.ckpt"))
    w = ne.Variable.load(str(tmp_path / "t.ckpt"))
    q = TimestampRestrictPolicy(w)
    q.resume(w.export(q.column)[1])
    assert q.clock == 3
    w.find_or_insert(np.array([9]))
    q.update(np.array([9]))
    q.apply_restriction(1)
    assert w.export()[0].tolist() == [9]
    empty = TimestampRestrictPolicy(ne.Variable(dim=2))
    empty.resume(np.empty((0, 1), np.int64))
    assert empty.clock == 0
