"""Admission filters against a counting oracle: an absent id gets a row once it has
been seen in ``min_count`` inserting calls while absent (once per call, this one
included); ids in the table are never filtered; a filtered id reads initial
values, keeps no upserted value and takes no gradient."""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb import optimizers as O
from numbaemb.admission import BloomFilter, CounterFilter

I64 = np.iinfo(np.int64)
EXTREME = [int(I64.min), int(I64.max), -1, 0]


@pytest.mark.parametrize("op", ["find_or_insert", "upsert", "train"])
def test_counter_filter_admits_at_min_count(op):
    init = ne.initializers.Constant(0.5)
    v = ne.Variable(2, admit=CounterFilter(min_count=3), initializer=init)
    counts, table = {}, {}
    rng = np.random.default_rng(2)
    for step in range(1, 30):
        keys = np.concatenate([rng.choice(EXTREME, 2), rng.integers(-15, 15, 6)])
        batch = {}
        for k in keys.tolist():
            batch[k] = batch.get(k, 0) + 1
        ok = {k: k in table or counts.get(k, 0) + 1 >= 3 for k in batch}
        vals = rng.standard_normal((keys.size, 2)).astype(np.float32)
        if op == "find_or_insert":
            out, exists = v.find_or_insert(keys, return_exists=True)
            seen = set()
            for i, k in enumerate(keys.tolist()):
                row = table.get(k, np.full(2, 0.5, np.float32))
                assert np.array_equal(out[i], row) and exists[i] == (k in table or k in seen)
                if ok[k]:
                    seen.add(k)
            for k in batch:
                if ok[k]:
                    table.setdefault(k, np.full(2, 0.5, np.float32))
        elif op == "upsert":
            v.upsert(keys, vals)
            for i, k in enumerate(keys.tolist()):
                if ok[k]:
                    table[k] = vals[i]
        else:
            O.apply_gradients(v, O.SGD(1.0), keys, vals, step=step)
            for k in batch:
                if ok[k]:
                    g = vals[keys == k].sum(0)
                    table[k] = table.get(k, np.full(2, 0.5, np.float32)) - g
        for k in batch:
            if k not in table:
                counts[k] = counts.get(k, 0) + 1
            else:
                counts.pop(k, None)
        got_k, got_v = v.export()
        assert sorted(got_k.tolist()) == sorted(table)
        for k, row in zip(got_k.tolist(), got_v):
            np.testing.assert_allclose(row, table[k], rtol=1e-6)


def test_the_filters_go_by_the_issue_names_in_policies_too():
    """``ne.policies.CounterFilter(min_count=3)`` (the spelling of the bounded-table
    issue, beside the restrict policies) is the admission module's class."""
    v = ne.Variable(2, admit=ne.policies.CounterFilter(min_count=2))
    v.find_or_insert(np.array([7]))
    assert v.size() == 0
    v.find_or_insert(np.array([7]))
    assert v.size() == 1
    for name in ("CounterFilter", "BloomFilter", "RandomFilter"):
        assert getattr(ne.policies, name) is getattr(ne.admission, name)


def test_counter_filter_forgets_beyond_its_capacity():
    f = CounterFilter(min_count=2, capacity=8)
    v = ne.Variable(1, admit=f)
    for k in range(100):
        v.find_or_insert(np.array([k]))
        assert f.counts.size() <= 8
    v.find_or_insert(np.arange(92, 100))          # the last 8 seen: still counted
    assert sorted(v.export()[0].tolist()) == list(range(92, 100))


def test_bloom_filter_never_admits_late_and_rarely_early():
    f = BloomFilter(min_count=2, capacity=20_000, error_rate=0.01)
    v = ne.Variable(1, admit=f)
    twice = np.arange(0, 10_000) * 7 + 1
    v.find_or_insert(twice)
    v.find_or_insert(twice)
    assert v.size() == twice.size                  # every id seen twice is in
    once = np.arange(10_000, 20_000) * 7 + 1
    v.find_or_insert(once)
    early = v.size() - twice.size                 # seen once, admitted by collisions
    assert early <= 0.05 * once.size


def test_admission_with_a_bounded_table_and_bad_arguments():
    v = ne.Variable(1, admit=CounterFilter(min_count=2), max_capacity=4)
    for _ in range(2):
        v.find_or_insert(np.arange(10))
    assert v.size() == 4
    with pytest.raises(TypeError, match="admission filter"):
        ne.Variable(1, admit=3)
    with pytest.raises(ValueError, match="min_count must be >= 1"):
        CounterFilter(min_count=0)
    with pytest.raises(ValueError, match="error_rate"):
        BloomFilter(error_rate=1.5)


@pytest.mark.parametrize("make", [lambda: CounterFilter(min_count=3, capacity=50),
                                  lambda: BloomFilter(min_count=3, capacity=500)],
                         ids=["counter", "bloom"])
def test_filter_state_survives_a_checkpoint(make, tmp_path):
    v, twin = ne.Variable(2, admit=make()), ne.Variable(2, admit=make())
    for ids in (np.arange(10), np.arange(5)):
        v.find_or_insert(ids)
        twin.find_or_insert(ids)
    v.save(tmp_path / "a.nbe")
    w = ne.Variable.load(tmp_path / "a.nbe")
    assert type(w.admit) is type(v.admit) and w.admit.min_count == 3 and w.size() == 0
    for t in (w, twin):
        t.find_or_insert(np.arange(10))           # the third call for 0..4: in
    assert sorted(w.export()[0].tolist()) == sorted(twin.export()[0].tolist()) == list(range(5))


def coin(key, p, seed, call):
    """The oracle of RandomFilter's coin, in Python integers."""
    from jit_kernels.hashing import GOLDEN, hash_key, mix64
    with np.errstate(over="ignore"):          # (uint64 arithmetic wraps, as in the kernel)
        salt = mix64(np.uint64(seed) + np.uint64(call) * GOLDEN)
    return int(mix64(np.uint64(hash_key(np.int64(key))) ^ np.uint64(salt))) >> 11 < round(p * 2.0 ** 53)


@pytest.mark.parametrize("op", ["find_or_insert", "train"])
def test_random_filter_admits_by_its_coin(op):
    """Each inserting call flips one coin per absent id (hash of id, seed, call number):
    the table holds exactly the ids whose coin fell below p in a call while absent; a
    call's repeats of an id share its coin; about p of the ids get in per call."""
    from numbaemb.admission import RandomFilter
    p, seed = 0.3, 11
    v = ne.Variable(2, admit=RandomFilter(p, seed), initializer=ne.initializers.Constant(0.5))
    table, rng = set(), np.random.default_rng(4)
    for call in range(1, 13):
        keys = np.concatenate([rng.choice(EXTREME, 3), rng.integers(-300, 300, 200)])
        if op == "find_or_insert":
            out, exists = v.find_or_insert(keys, return_exists=True)
            assert (out == 0.5).all()
        else:
            O.apply_gradients(v, O.SGD(1.0), keys, np.ones((keys.size, 2), np.float32),
                              step=call)
        table |= {k for k in set(keys.tolist()) - table if coin(k, p, seed, call)}
        assert sorted(v.export()[0].tolist()) == sorted(table)
    assert v.admit.clock == 12
    fresh = np.arange(10**6, 10**6 + 20_000)
    before = v.size()
    v.find_or_insert(fresh)
    assert abs((v.size() - before) / fresh.size - p) < 0.02


def test_random_filter_state_config_and_bad_arguments(tmp_path):
    from numbaemb.admission import RandomFilter, config_of, from_config, merge
    v, twin = ne.Variable(1, admit=RandomFilter(0.5, 3)), ne.Variable(1, admit=RandomFilter(0.5, 3))
    for t in (v, twin):
        for _ in range(3):
            t.find_or_insert(np.arange(100))
    v.save(tmp_path / "r.nbe")
    w = ne.Variable.load(tmp_path / "r.nbe")
    assert (w.admit.p, w.admit.seed, w.admit.clock) == (0.5, 3, 3)
    for t in (w, twin):                          # the same coins from the same call number
        t.find_or_insert(np.arange(100, 300))
    assert sorted(w.export()[0].tolist()) == sorted(twin.export()[0].tolist())
    assert config_of(w.admit) == {"kind": "random", "p": 0.5, "seed": 3}
    assert repr(from_config(config_of(w.admit))) == "RandomFilter(p=0.5, seed=3)"
    late = RandomFilter(0.5, 3)
    late.clock = 9
    assert merge([w.admit, late]).clock == 9
    for bad in (0, 1.5, -0.1, "0.5", True):
        with pytest.raises(ValueError, match="p must be a probability"):
            RandomFilter(bad)
    with pytest.raises(ValueError, match="seed"):
        RandomFilter(0.5, seed=-1)
