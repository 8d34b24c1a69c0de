"""Bounded tables in the TF bridge: a Keras layer with ``max_capacity`` trains, stays
within its capacity, and round-trips through tf.train.Checkpoint and .keras files with
its scores (the next inserts still evict the least recent keys)."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tf_bridge as de  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def model_with(cap, window=None):
    ids = keras.Input((4,), dtype="int64")
    emb = de.keras.layers.Embedding(3, combiner="sum", name="bounded_emb", max_capacity=cap,
                                    evict="lru", initializer=keras.initializers.Zeros(),
                                    evict_window=window)
    model = keras.Model(ids, keras.layers.Dense(1)(emb(ids)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                  loss="mse")
    return model, emb


@pytest.mark.parametrize("window", [None, 32])     # the default (buckets); a window of slots
def test_bounded_layer_trains_within_capacity_and_checkpoints(tmp_path, window):
    model, emb = model_with(100, window)
    x = np.random.default_rng(0).integers(0, 400, (256, 4))
    model.fit(x, np.ones((256, 1)), batch_size=16, epochs=1, verbose=0, shuffle=False)
    table = emb.params
    assert 0 < int(table.size()) <= 100
    recent = np.unique(x[-16:])                       # the last batch's ids: all kept
    assert table.lookup(tf.constant(recent), return_exists=True)[1].numpy().all()
    path = tf.train.Checkpoint(m=model).save(str(tmp_path / "ck"))
    model2, emb2 = model_with(100, window)
    model2(x[:1])
    tf.train.Checkpoint(m=model2).restore(path)
    k1, v1 = table.export()
    k2, v2 = emb2.params.export()
    o1, o2 = np.argsort(k1.numpy()), np.argsort(k2.numpy())
    assert np.array_equal(k1.numpy()[o1], k2.numpy()[o2])
    assert np.array_equal(v1.numpy()[o1], v2.numpy()[o2])
    # the restored clock is past every restored score: ids inserted after the restore
    # outrank every restored key, so the next inserts evict restored keys, not them
    t2 = emb2.params.table
    fresh = np.arange(10_000, 10_010)
    t2.find_or_insert(fresh)
    t2.find_or_insert(np.arange(20_000, 20_030))
    assert t2.lookup(fresh, return_exists=True)[1].all() and t2.size() == 100
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    layer = loaded.get_layer("bounded_emb")
    assert layer.params.table.max_capacity == 100 and int(layer.params.size()) == int(table.size())
    assert layer.params.table.evict_window == ("bucket" if window is None else window)


def test_restoring_more_keys_than_the_capacity_is_refused():
    from tf_bridge.checkpoint import restore_table_state, table_state
    big = de.Variable(dim=2, name="bounded_big")
    big.upsert(tf.range(10, dtype=tf.int64), tf.ones([10, 2]))
    small = de.Variable(dim=2, name="bounded_small", max_capacity=5)
    with pytest.raises(ValueError, match="max_capacity"):
        restore_table_state(small, table_state(big))
    assert int(small.size()) == 0


@pytest.mark.parametrize("scored", [True, False], ids=["lfu-state", "unbounded-state"])
def test_a_bucketed_table_restores_a_full_buckets_keys_by_score(scored):
    """A state saved from another layout (a window of slots, or an unbounded table)
    with 40 keys of one bucket restores into a bucketed table: the 32 highest-scored
    (without scores: the first 32) keep their values and scores, the rest are dropped
    with a warning, and no row is written twice."""
    import numbaemb as ne
    from jit_kernels.bucket_bounded import homes_of
    from tf_bridge.checkpoint import restore_table_state, table_state
    into = de.Variable(dim=2, name="bucketed_into", max_capacity=60, evict="lfu",
                       evict_window="bucket")
    mask = into.table.shards[0].mask
    keys = np.array([k for k in range(200_000) if homes_of.python_twin()(k, mask) >> 8 == 0][:40])
    src = ne.Variable(2, max_capacity=60, evict="lfu", evict_window=32) if scored \
        else ne.Variable(2)
    src.upsert(keys, np.arange(80, dtype=np.float32).reshape(40, 2))
    hits = np.random.default_rng(4).permutation(40)
    for k, h in zip(keys, hits):            # key k scores 1 + h (distinct)
        for _ in range(int(h) if scored else 0):
            src.find_or_insert(np.array([k]))
    with pytest.warns(UserWarning, match="8 restored keys did not fit"):
        restore_table_state(into, table_state(src))
    kept = keys[np.argsort(-hits, kind="stable")[:32]] if scored else keys[:32]
    got, vals = into.table.export()
    assert sorted(got.tolist()) == sorted(kept.tolist()) and into.table.size() == 32
    at = {int(k): i for i, k in enumerate(keys)}
    want = np.array([[2 * at[int(k)], 2 * at[int(k)] + 1] for k in got], np.float32)
    np.testing.assert_array_equal(vals, want)
    if scored:
        _, scores = into.table.export("score")
        np.testing.assert_array_equal(scores[:, 0], [1 + hits[at[int(k)]] for k in got])


def test_an_evict_policy_without_max_capacity_is_refused():
    """A policy that never applies (the table grows) is an error, as in numbaemb."""
    with pytest.raises(ValueError, match="need max_capacity"):
        de.keras.layers.Embedding(3, evict="lfu")
    with pytest.raises(ValueError, match="need max_capacity"):
        de.Variable(dim=2, name="bounded_no_cap", evict="epoch_lru")


def test_admission_and_steps_to_live_through_the_layer():
    from numbaemb.admission import CounterFilter
    ids = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(2, combiner="sum", name="admit_emb", steps_to_live=2,
                                    admit=CounterFilter(min_count=2))
    model = keras.Model(ids, keras.layers.Dense(1)(emb(ids)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)),
                  loss="mse")
    x = np.array([[1, 2], [3, 1]], np.int64)       # a step counts each id once
    model.fit(x, np.ones((2, 1)), batch_size=2, epochs=1, verbose=0)
    assert int(emb.params.size()) == 0
    model.fit(np.array([[1, 4], [1, 1]]), np.ones((2, 1)), batch_size=2, verbose=0)
    assert sorted(emb.params.export()[0].numpy().tolist()) == [1]     # second step: in
    for _ in range(3):                             # 5 and 6 get in; 1 goes stale
        model.fit(np.array([[5, 6], [5, 6]]), np.ones((2, 1)), batch_size=2, verbose=0)
    assert emb.params.expire() == 1
    assert sorted(emb.params.export()[0].numpy().tolist()) == [5, 6]


@pytest.mark.parametrize("make", ["counter", "bloom"])
def test_admission_filter_state_and_epoch_round_trip_through_tf_checkpoints(make, tmp_path):
    """tf.train.Checkpoint and .keras files keep an admission filter's counts (an id seen
    once before the save is admitted at its second sighting after the restore) and a
    bounded table's epoch; a filter of another kind refuses the state, changing nothing."""
    from numbaemb.admission import BloomFilter, CounterFilter

    def fresh(name, kind=make):
        f = CounterFilter(min_count=2) if kind == "counter" else BloomFilter(min_count=2,
                                                                          capacity=1000)
        return de.Variable(dim=2, name=name, admit=f, max_capacity=50, evict="epoch_lru")

    v = fresh("admit_ckpt")
    v.table.set_epoch(7)
    v.table.find_or_insert(np.array([11, 12]))       # counted once: not admitted yet
    v.table.find_or_insert(np.array([12]))           # 12: twice, admitted
    assert sorted(v.table.export()[0].tolist()) == [12]
    path = tf.train.Checkpoint(t=v).save(str(tmp_path / "ck"))
    w = fresh("admit_ckpt2")
    tf.train.Checkpoint(t=w).restore(path)
    assert w.table.epoch == 7 and sorted(w.table.export()[0].tolist()) == [12]
    w.table.find_or_insert(np.array([11, 13]))       # 11: second sighting; 13: first
    assert sorted(w.table.export()[0].tolist()) == [11, 12]
    other = fresh("admit_other", "bloom" if make == "counter" else "counter")
    other.table.find_or_insert(np.array([5, 5]))
    with pytest.raises(ValueError, match="admission filter"):
        from tf_bridge.checkpoint import restore_table_state, table_state
        restore_table_state(other, table_state(v))
    assert other.table.size() == 0                   # nothing applied


def test_keras_file_keeps_the_admission_counts(tmp_path):
    from numbaemb.admission import CounterFilter
    ids = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(2, combiner="sum", name="admit_keras",
                                    admit=CounterFilter(min_count=2))
    model = keras.Model(ids, keras.layers.Dense(1)(emb(ids)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(np.array([[1, 2]]), np.ones((1, 1)), verbose=0)        # 1 and 2 counted once
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    table = loaded.get_layer("admit_keras").params.table
    assert table.size() == 0
    table.find_or_insert(np.array([2, 3]))
    assert table.export()[0].tolist() == [2]


def test_split_tables_gathered_state_merges_the_ranks_filters_and_clocks():
    """hvd.save_model writes one state for a table split across ranks: the ranks'
    counter filters merge (every rank's tracked ids) and the latest clock wins."""
    import json

    import numbaemb as ne
    from numbaemb.admission import CounterFilter, state
    from tf_bridge.checkpoint import decode_filter, table_state
    from tf_bridge.distributed.saving import _merge_extras
    parts = []
    for r, ids in enumerate(([1, 2, 3], [10, 11])):        # two "ranks"' local tables
        t = ne.Variable(2, admit=CounterFilter(2), max_capacity=10)
        for _ in range(r + 1):                             # ids seen once: counted, not in
            t.find_or_insert(np.array(ids) + 100 * _)
        parts.append(json.loads(table_state(t)["columns"]))
    meta = dict(parts[0])
    _merge_extras(meta, parts)
    merged = state(decode_filter(meta["admission"]))[1]
    assert sorted(merged["keys"].tolist()) == [1, 2, 3, 10, 11, 110, 111]
    assert meta["bounded"]["clock"] == 2


def test_bp_v2_layer_on_a_bounded_table_trains_within_capacity():
    """bp_v2 steps add through accum, which a bounded table applies with its evictions."""
    import keras
    layer = de.keras.layers.Embedding(4, max_capacity=50, bp_v2=True, name="bp_v2_bounded")
    inp = keras.Input((2,), dtype="int64")
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(layer(inp))))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)), "mse")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 200, (256, 2)).astype(np.int64)
    y = (x % 7).sum(1, keepdims=True).astype(np.float32)
    hist = model.fit(x, y, batch_size=32, epochs=3, verbose=0).history["loss"]
    assert hist[-1] < hist[0]
    assert 0 < int(layer.params.size()) <= 50


@pytest.mark.parametrize("window", ["bucket", 8])
def test_a_smaller_table_restores_the_highest_scored_keys(window):
    """A bounded state restores into a table of a smaller max_capacity: the highest
    scores stay (a warning), with their values; a string table keeps only their names."""
    import numbaemb as ne
    from tf_bridge.checkpoint import restore_table_state, table_state
    big = ne.Variable(dim=2, max_capacity=100, evict="custom", key_dtype="string")
    keys = np.array([f"id-{i}" for i in range(60)], object)
    scores = (np.arange(60) * 37) % 60 - 30              # distinct, negative ones too
    scores[7] = np.iinfo(np.int64).min                   # (its negation is itself)
    big.upsert(keys, np.arange(120, dtype=np.float32).reshape(60, 2), scores=scores)
    small = ne.Variable(dim=2, max_capacity=20, evict="custom", key_dtype="string",
                        evict_window=window)
    with pytest.warns(UserWarning, match="40 restored keys left out"):
        restore_table_state(small, table_state(big))
    top = keys[np.argsort(scores)[::-1][:20]]
    held = small.export()[0]
    assert sorted(held.tolist()) == sorted(k.encode() for k in top)
    np.testing.assert_array_equal(small.lookup(top), big.lookup(top))
    assert len(small.names) == 20
