"""Bounded, admission-filtered and expiring tables split across MPI ranks: each owner
runs the bounds of one process on the keys that reach it (capacity per rank, the
rank's own filter), so a local table fed the owner's received sequence is the oracle."""
import numpy as np

import numbaemb as ne
from jit_kernels.exchange import default_owners
from numbaemb import admission

from .conftest import COMM, RANK, WORLD, agree, multi_rank, shared_tmpdir

pytestmark = multi_rank
INIT = ne.initializers.RandomUniform(-1, 1, seed=5)
EXTREMES = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0])


def batch(call, rank):
    """Rank ``rank``'s ids at call ``call`` (every rank can compute every rank's)."""
    rng = np.random.default_rng(1000 * call + rank)
    ids = rng.zipf(1.3, 40) % 300 - 150
    return np.concatenate([ids, EXTREMES[call % 4:call % 4 + 1]]).astype(np.int64)


def received(call, me=RANK):
    """What owner ``me`` receives at ``call``: each rank's distinct ids it owns, in first
    occurrence, the ranks in order (the exchange's plan)."""
    seq = []
    for r in range(WORLD):
        ids = batch(call, r)
        _, first = np.unique(ids, return_index=True)
        ids = ids[np.sort(first)]
        seq.append(ids[default_owners(ids, WORLD, 64) == me])
    return np.concatenate(seq)


def same_table(v, oracle):
    k1, v1 = v.export()
    k2, v2 = oracle.export()
    o1, o2 = np.argsort(k1), np.argsort(k2)
    return np.array_equal(k1[o1], k2[o2]) and np.array_equal(v1[o1], v2[o2])


def test_bounded_inserts_evict_per_rank_as_the_oracle_does():
    for evict, window in (("lru", 8), ("lfu", 8), ("epoch_lru", 8), ("lru", "bucket"),
                          ("lfu", "bucket")):
        kw = dict(max_capacity=60, evict=evict, evict_window=window, initializer=INIT)
        v = ne.Variable(3, comm=COMM, name=f"bounded_{evict}_{window}", **kw)
        oracle = ne.Variable(3, **kw)
        for call in range(12):
            if evict == "epoch_lru":
                v.set_epoch(call // 4)
                oracle.set_epoch(call // 4)
            v.find_or_insert(batch(call, RANK))
            oracle.find_or_insert(received(call))
        agree(v.local_size() <= 60 and same_table(v, oracle), evict)
        agree(v.size() == COMM.allreduce(v.local_size()))
        rows = v.lookup(batch(11, RANK))             # the last call's ids: all present
        agree(np.array_equal(rows, v.find_or_insert(batch(11, RANK))))


def _distinct(ids):
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]


def received_sums(call, me=RANK):
    """The gradient sums owner ``me`` receives at ``call`` for all-ones gradients: each
    rank's count of each distinct id it sends (in :func:`received`'s order)."""
    out = []
    for r in range(WORLD):
        ids = batch(call, r)
        d = _distinct(ids)
        counts = np.array([np.count_nonzero(ids == k) for k in d], np.float32)
        out.append(counts[default_owners(d, WORLD, 64) == me])
    return np.repeat(np.concatenate(out)[:, None], 2, axis=1)


def test_admission_counts_a_key_once_per_call_on_its_owner():
    opt = ne.optimizers.SGD(1.0)
    v = ne.Variable(2, comm=COMM, name="admit_split", admit=admission.CounterFilter(2),
                    initializer=INIT)
    oracle = ne.Variable(2, admit=admission.CounterFilter(2), initializer=INIT)
    seen = []
    for call in range(6):
        ids = batch(call, RANK)
        ne.optimizers.apply_gradients(v, opt, ids, np.ones((ids.shape[0], 2)), step=call + 1)
        ne.optimizers.apply_gradients(oracle, opt, received(call), received_sums(call),
                                      step=call + 1)
        seen.append(received(call))
    owned = np.unique(np.concatenate(seen)).shape[0]
    agree(same_table(v, oracle) and 0 < v.local_size() < owned, (v.local_size(), owned))


def test_random_admission_on_each_owner_is_the_oracles():
    """RandomFilter on a split table: each owner's coins are those of one process fed
    what reaches it (the same seed, the same calls), so its table is the oracle's."""
    opt = ne.optimizers.SGD(1.0)
    v = ne.Variable(2, comm=COMM, name="random_split", admit=admission.RandomFilter(0.4, 7),
                    initializer=INIT)
    oracle = ne.Variable(2, admit=admission.RandomFilter(0.4, 7), initializer=INIT)
    for call in range(6):
        ids = batch(call, RANK)
        ne.optimizers.apply_gradients(v, opt, ids, np.ones((ids.shape[0], 2)), step=call + 1)
        ne.optimizers.apply_gradients(oracle, opt, received(call), received_sums(call),
                                      step=call + 1)
    agree(same_table(v, oracle) and v.local.admit.clock == oracle.admit.clock > 0)


def test_steps_to_live_expire_removes_each_ranks_stale_keys():
    v = ne.Variable(2, comm=COMM, name="ttl_split", steps_to_live=2)
    opt = ne.optimizers.SGD(0.1)
    ne.optimizers.apply_gradients(v, opt, np.arange(20) + 100 * RANK, np.ones((20, 2)), step=1)
    for step in (2, 3):
        ne.optimizers.apply_gradients(v, opt, np.arange(5), np.ones((5, 2)), step=step)
    removed = ne.expiry.expire(v)                    # not collective: this rank's keys
    left = sorted(sum(COMM.allgather(v.export()[0].tolist()), []))
    agree(left == list(range(5)) and COMM.allreduce(removed) == 20 * WORLD - 5, left)


def test_bounds_and_filter_state_round_trip_through_checkpoints(tmp_path_factory):
    d = shared_tmpdir(tmp_path_factory)
    kw = dict(max_capacity=500, evict="lru", admit=admission.CounterFilter(2),
              initializer=INIT)
    v = ne.Variable(3, comm=COMM, name="bounded_ckpt", **kw)
    for call in range(4):
        v.find_or_insert(batch(call, RANK))
    v.save(d)
    saved_keys = np.concatenate(COMM.allgather(v.export()[0]))
    saved_tracked = np.concatenate(COMM.allgather(admission.state(v.admit)[1]["keys"]))
    w = ne.Variable.load(d, comm=COMM)               # same world: each rank its part
    sv, sw = admission.state(v.admit), admission.state(w.admit)
    agree(w.max_capacity == 500 and w.local._clock == v.local._clock and same_table(w, v))
    agree(all(np.array_equal(sv[1][n], sw[1][n]) for n in sv[1]), "filter state")
    nxt = batch(4, RANK)                             # both behave alike from here
    v.find_or_insert(nxt)
    w.find_or_insert(nxt)
    agree(same_table(w, v))
    one = ne.Variable.load(d)                        # one process: every key, merged counts
    tracked = admission.state(one.admit)[1]["keys"]
    agree(np.array_equal(np.sort(one.export()[0]), np.sort(saved_keys))
          and np.array_equal(np.sort(tracked), np.sort(saved_tracked)), "merged into one")


def test_loading_more_keys_than_a_ranks_capacity_is_refused_unless_resized(tmp_path_factory):
    """max_capacity is per rank: a checkpoint of full ranks loads into as many ranks,
    not into one process (ValueError there, nothing half-loaded)."""
    import pytest
    d = shared_tmpdir(tmp_path_factory)
    v = ne.Variable(2, comm=COMM, name="full_ranks", max_capacity=30)
    owned = np.arange(4000)[default_owners(np.arange(4000), WORLD, 64) == RANK][:30]
    v.find_or_insert(np.concatenate(COMM.allgather(owned)))   # 30 keys on every rank
    agree(v.local_size() == 30)
    v.save(d)
    agree(ne.Variable.load(d, comm=COMM).size() == 30 * WORLD)
    with pytest.raises(ValueError, match="max_capacity"):
        ne.Variable.load(d)
    # unless loaded at a size of its own: then the highest-scored stay (a warning)
    every = np.concatenate(COMM.allgather(owned))
    saved = dict(zip(every.tolist(), v.lookup(every)))
    with pytest.warns(UserWarning, match=f"{30 * WORLD - 50} keys of checkpoint"):
        one = ne.Variable.load(d, max_capacity=50, evict_window=8)
    agree(one.size() == 50 and one.evict_window == 8)
    with pytest.warns(UserWarning, match="20 keys of checkpoint"):
        w = ne.Variable.load(d, comm=COMM, max_capacity=10)
    agree(w.local_size() == 10 and w.max_capacity == 10)
    for t in (one, w):          # (w's lookup is collective: every rank calls it)
        k = t.export()[0]
        agree(np.array_equal(t.lookup(k), np.array([saved[x] for x in k.tolist()])),
              "the kept keys keep their values")
    COMM.Barrier()


def test_bucketed_ranks_load_into_one_process_by_score(tmp_path_factory):
    """Resharding a bucketed table: every rank's keys of one bucket (20 a rank) meet in
    one process's bucket of 32; the highest-scored stay, the rest are dropped with a
    warning, and the kept keys keep their values."""
    import pytest

    from jit_kernels.bucket_bounded import homes_of
    d = shared_tmpdir(tmp_path_factory)
    v = ne.Variable(2, comm=COMM, name="bucket_ranks", max_capacity=400, evict="custom",
                    evict_window="bucket", initializer=INIT)
    mask, home = v.local.shards[0].mask, homes_of.python_twin()
    cand = np.arange(400_000)
    cand = cand[default_owners(cand, WORLD, 64) == RANK]
    mine = np.array([k for k in cand[:60_000] if home(k, mask) >> 8 == 0][:20], np.int64)
    everyone = np.concatenate(COMM.allgather(mine))
    scores = (np.arange(everyone.shape[0]) * 7919) % 1000       # distinct, every rank alike
    v.find_or_insert(everyone, scores=scores)
    agree(v.local_size() == 20)
    want_values = v.lookup(everyone)
    v.save(d)
    if WORLD * 20 > 32:
        with pytest.warns(UserWarning, match="did not fit"):
            one = ne.Variable.load(d)
    else:
        one = ne.Variable.load(d)
    kept = everyone[np.argsort(-scores, kind="stable")[:32]]
    got = one.export()[0]
    agree(np.array_equal(np.sort(got), np.sort(kept)), "the 32 highest scores stay")
    at = {int(k): i for i, k in enumerate(everyone)}
    pos = np.array([at[int(k)] for k in kept])
    agree(np.array_equal(one.lookup(kept), want_values[pos]), "the kept keys' values")
    COMM.Barrier()


def test_return_evicted_gives_each_rank_what_its_table_evicted():
    kw = dict(max_capacity=25, evict="lru", evict_window=8, initializer=INIT)
    v = ne.Variable(3, comm=COMM, name="evicting_split", **kw)
    oracle = ne.Variable(3, **kw)
    for call in range(8):
        rows, exists, ev_keys, ev_vals = v.find_or_insert(batch(call, RANK), return_exists=True,
                                                          return_evicted=True)
        _, o_keys, o_vals = oracle.find_or_insert(received(call), return_evicted=True)
        agree(np.array_equal(ev_keys, o_keys) and np.array_equal(ev_vals, o_vals), call)
        agree(rows.shape == (batch(call, RANK).shape[0], 3) and exists.dtype == bool)
    _, cols = v.find_or_insert(batch(9, RANK), return_evicted="columns")[1:]
    agree(set(cols) >= {"values", "score"}, sorted(cols))


def test_custom_scores_travel_with_their_keys():
    """evict='custom' (inserts and upserts): each key's score reaches its owner (a rank's last position, the
    last rank's), so the owners evict as the oracle fed the same scores does."""
    kw = dict(max_capacity=25, evict="custom", evict_window=8, initializer=INIT)
    v = ne.Variable(3, comm=COMM, name="custom_split", **kw)
    oracle = ne.Variable(3, **kw)

    def score(ids, call):                     # a function of the key: repeats agree
        return (ids * 7919 + call) % 1000

    def values(ids):                          # a function of the key, too
        return np.repeat((ids % 97)[:, None], 3, 1).astype(np.float32)

    for call in range(8):                     # find_or_insert, then upsert, alternately
        ids, seq = batch(call, RANK), received(call)
        if call % 2:
            v.upsert(ids, values(ids), scores=score(ids, call))
            oracle.upsert(seq, values(seq), scores=score(seq, call))
        else:
            v.find_or_insert(ids, scores=score(ids, call))
            oracle.find_or_insert(seq, scores=score(seq, call))
    agree(same_table(v, oracle) and v.local_size() <= 25)


def test_mismatched_eviction_arguments_raise_on_every_rank():
    import pytest
    v = ne.Variable(2, comm=COMM, name="mismatch_split", max_capacity=10)
    with pytest.raises(ValueError):           # only rank 0 asks for the evictions
        v.find_or_insert(np.arange(3), return_evicted=RANK == 0)
    with pytest.raises(ValueError, match="custom"):   # scores on an "lru" table: everywhere
        v.find_or_insert(np.arange(3), scores=np.ones(3, np.int64))
    with pytest.raises(ValueError, match="custom"):
        v.upsert(np.arange(3), np.ones((3, 2)), scores=np.ones(3, np.int64))
    c = ne.Variable(2, comm=COMM, name="mismatch_custom", max_capacity=10, evict="custom")
    with pytest.raises(ValueError):           # only rank 0 gives scores
        c.upsert(np.arange(3), np.ones((3, 2)),
                 scores=np.ones(3, np.int64) if RANK == 0 else None)
    agree(v.size() == 0 and c.size() == 0)


def accum_args(call, rank):
    """Rank ``rank``'s accum arguments at ``call``: keys (repeats, extremes), old and new
    rows, exists flags."""
    keys = batch(call, rank)[:20]
    rng = np.random.default_rng(7000 + 100 * call + rank)
    old = rng.integers(-3, 3, (keys.size, 2)).astype(np.float32)
    new = rng.integers(-3, 3, (keys.size, 2)).astype(np.float32)
    return keys, old, new, rng.random(keys.size) < 0.5


def test_accum_on_split_bounded_tables_runs_each_owners_bounds():
    """Every position goes to its owner (ranks in order, batch order within), whose
    bounded table applies accum as one process fed that sequence does."""
    kw = dict(max_capacity=25, evict="lru", evict_window=8, initializer=INIT)
    v = ne.Variable(2, comm=COMM, name="bounded_accum", **kw)
    oracle = ne.Variable(2, **kw)
    for call in range(8):
        parts = [accum_args(call, r) for r in range(WORLD)]
        v.accum(*parts[RANK])
        mine = [[a[default_owners(p[0], WORLD, 64) == RANK] for a in p] for p in parts]
        oracle.accum(*(np.concatenate([m[j] for m in mine]) for j in range(4)))
    agree(v.local_size() <= 25 and v.local_size() > 0 and same_table(v, oracle))
