"""String keys in the TF bridge: ``de.Variable(key_dtype=tf.string)`` and the layers on it.

Oracles: a dict for table ops; for training, an int64 table fed each string's
position in a vocabulary (same constant initializer, same optimizer) must end
with the same rows; for serving, the live model in inference mode, served by a
fresh process that cannot import numbaemb.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tf_bridge as de  # noqa: E402
from tf_bridge.checkpoint import restore_table_state, table_state  # noqa: E402

from .serving_helpers import reload_and_serve  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_numba_thread")

VOCAB = [b"", b"a", b"a\x00", "héllo".encode(), b"x" * 65, b"user:1", b"user:10",
         bytes(range(1, 40))]


def strings(items):
    return tf.constant(np.array(items, object), tf.string)


def rows_of(v, keys):
    return v.lookup(strings(keys)).numpy()


def test_table_ops_follow_a_dict():
    v = de.Variable(key_dtype=tf.string, dim=2, name="st_ops", num_shards=3)
    oracle = {}
    rng = np.random.default_rng(0)
    for step in range(30):
        keys = [VOCAB[i] for i in rng.integers(0, len(VOCAB), 4)]
        op = step % 3
        if op == 0:
            vals = rng.standard_normal((4, 2)).astype(np.float32)
            v.upsert(strings(keys), vals)
            oracle.update(zip(keys, vals))              # last one wins
        elif op == 1:
            v.remove(strings(keys[:2]))
            for k in keys[:2]:
                oracle.pop(k, None)
        else:
            old, flags = rows_of(v, keys), [k in oracle for k in keys]
            v.accum(strings(keys), old, old + 1, tf.constant(flags))
            for k, o, e in zip(keys, old, flags):       # in batch order (TFRA's rules)
                if e and k in oracle:
                    oracle[k] = oracle[k] + 1
                elif not e and k not in oracle:
                    oracle[k] = o + 1
        got, exists = v.lookup(strings(VOCAB), return_exists=True)
        assert exists.numpy().tolist() == [k in oracle for k in VOCAB]
        for k, row in zip(VOCAB, got.numpy()):
            np.testing.assert_array_equal(row, oracle.get(k, np.zeros(2, np.float32)))
        keys_out, vals_out = v.export()
        assert sorted(keys_out.numpy().tolist()) == sorted(oracle)
        assert int(v.size()) == len(oracle)
    v.clear()
    assert int(v.size()) == 0 and v.export()[0].shape == (0,)


def test_keys_are_checked():
    v = de.Variable(key_dtype=tf.string, dim=2, name="st_bad")
    w = de.Variable(dim=2, name="st_bad_int")
    for bad in (tf.constant([1, 2], tf.int64), np.array([1.5]), [b"a", 3]):
        with pytest.raises(TypeError, match="keys must"):
            v.lookup(bad)
        with pytest.raises(ValueError, match="keys must"):     # DtypeError is both
            v.upsert(bad, np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="ids must be an int64 or int32 tensor"):
        de.embedding_lookup(w, strings([b"a"]))
    with pytest.raises(TypeError, match="key_dtype must be one of"):
        de.Variable(key_dtype=tf.float32, dim=2, name="st_bad_f")
    assert int(v.size()) == 0
    assert rows_of(v, ["a", b"b"]).shape == (2, 2)              # str and bytes both fine


def _train(var, ids, steps, opt):
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            emb = de.embedding_lookup(var, x)
            loss = tf.reduce_sum(emb * emb * tf.range(1.0, 3.0))
        opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
        return loss
    return [float(step(x)) for x in ids[:steps]]


def test_training_matches_an_int_table():
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, len(VOCAB), (3, 4)) for _ in range(6)]
    s = de.Variable(key_dtype=tf.string, dim=2, name="st_train", initializer=0.3, num_shards=2)
    n = de.Variable(dim=2, name="st_train_int", initializer=0.3)
    ls = _train(s, [strings([[VOCAB[i] for i in r] for r in b]) for b in batches], 6,
                de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)))
    ln = _train(n, [tf.constant(b, tf.int64) for b in batches], 6,
                de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)))
    np.testing.assert_allclose(ls, ln, rtol=1e-6)
    used = sorted(set(np.concatenate(batches).ravel().tolist()))
    np.testing.assert_allclose(rows_of(s, [VOCAB[i] for i in used]),
                               n.lookup(tf.constant(used, tf.int64)).numpy(), rtol=1e-6)
    assert sorted(s.export()[0].numpy().tolist()) == sorted(VOCAB[i] for i in used)


def test_gradient_indices_are_the_string_ids():
    v = de.Variable(key_dtype=tf.string, dim=2, name="st_grad", initializer=1.0)
    keys = strings([[b"p", b"q"], [b"p", b"r"]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(v, keys))
    g = tape.gradient(loss, [v])[0]
    want = v.ids(strings([b"p", b"q", b"r"])).numpy()            # registered by the lookup
    assert g.indices.numpy().tolist() == want.tolist()
    np.testing.assert_array_equal(g.values.numpy(), [[2, 2], [1, 1], [1, 1]])
    lev0 = tf.strings.to_hash_bucket_fast(strings([b"p", b"q", b"r"]), 2 ** 63 - 1).numpy()
    np.testing.assert_array_equal(want, lev0)                  # no collisions: level 0


def test_sparse_and_split_lookups():
    a = de.Variable(key_dtype=tf.string, dim=2, name="st_sp_a")
    b = de.Variable(key_dtype=tf.string, dim=2, name="st_sp_b")
    vals = {k: np.float32([i, -i]) for i, k in enumerate(VOCAB)}
    a.upsert(strings(VOCAB), np.stack(list(vals.values())))
    bag = tf.ragged.constant([[b"a", b"user:1"], [], [b"zz", b"a"]], tf.string)
    got = de.safe_embedding_lookup_sparse(a, bag, combiner="sum").numpy()
    np.testing.assert_array_equal(got, [vals[b"a"] + vals[b"user:1"], [0, 0], vals[b"a"]])
    got = de.embedding_lookup_sparse(a, bag.to_sparse(), None, combiner="mean").numpy()
    np.testing.assert_array_equal(got[0], (vals[b"a"] + vals[b"user:1"]) / 2)
    # two variables: a string lives in params[fingerprint mod 2]
    part = tf.strings.to_hash_bucket_fast(strings(VOCAB), 2).numpy()
    for k, p in zip(VOCAB, part):
        (a, b)[p].upsert(strings([k]), vals[k][None] * 10)
    got = de.embedding_lookup([a, b], strings(VOCAB)).numpy()
    np.testing.assert_array_equal(got, np.stack(list(vals.values())) * 10)


def test_checkpoint_round_trip_keeps_slots_and_names(tmp_path):
    v = de.Variable(key_dtype=tf.string, dim=2, name="st_ck", initializer=0.2, num_shards=3)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    batches = [strings(VOCAB[:5]), strings(VOCAB[3:])]
    _train(v, batches, 2, opt)
    path = tf.train.Checkpoint(emb=v).save(str(tmp_path / "ck"))
    w = de.Variable(key_dtype=tf.string, dim=2, name="st_ck2", initializer=0.2, num_shards=2)
    w.upsert(strings([b"stale"]), np.ones((1, 2), np.float32))
    tf.train.Checkpoint(emb=w).restore(path)
    assert sorted(w.export()[0].numpy().tolist()) == sorted(VOCAB)
    np.testing.assert_array_equal(rows_of(w, VOCAB), rows_of(v, VOCAB))
    sv, sw = table_state(v), table_state(w)
    order_v, order_w = np.argsort(sv["keys"]), np.argsort(sw["keys"])
    np.testing.assert_array_equal(sv["column_bytes"][order_v], sw["column_bytes"][order_w])
    with pytest.raises(ValueError, match="string and integer keys do not mix"):
        restore_table_state(de.Variable(dim=2, name="st_ck_int"), sv)
    bad = dict(sv, keys=np.array([b"a"] * len(sv["keys"]), object))
    with pytest.raises(ValueError, match="duplicate keys"):
        restore_table_state(w, bad)
    np.testing.assert_array_equal(rows_of(w, VOCAB), rows_of(v, VOCAB))     # unchanged


def _string_model():
    words = keras.Input((3,), dtype="string", name="words")
    emb = de.keras.layers.Embedding(4, key_dtype=tf.string, combiner="mean", name="wemb",
                                    initializer=keras.initializers.RandomNormal(seed=2))
    model = keras.Model(words, keras.layers.Dense(1, name="head")(emb(words)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)),
                  loss="mse")
    x = np.array([[b"a", b"b", "héllo".encode()], [b"d", b"a", b"x" * 65]] * 8, object)
    model.fit(tf.data.Dataset.from_tensor_slices((x, np.ones((16, 1), np.float32))).batch(4),
              epochs=2, verbose=0)
    return model, emb


def test_keras_layer_saves_and_serves_string_ids(tmp_path):
    model, emb = _string_model()
    assert sorted(emb.params.export()[0].numpy().tolist()) == sorted(
        [b"a", b"b", b"d", "héllo".encode(), b"x" * 65])
    query = np.array([[b"a", b"never seen", b"x" * 65], [b"", b"b", b"d"]], object)
    want, served = reload_and_serve(model, query, tmp_path, feed=tf.constant)
    np.testing.assert_allclose(served["serve"], want, rtol=1e-6)
    np.testing.assert_allclose(served["signature"], want, rtol=1e-6)


def test_corrupt_saved_string_keys_are_refused(tmp_path):
    model, emb = _string_model()
    store = {}
    emb.save_own_variables(store)
    starts = np.asarray(store["de:params:keys"]).copy()
    starts[-1] += 3                                      # past the end of the bytes
    store["de:params:keys"] = starts
    before = emb.params.export()[0].numpy().tolist()
    with pytest.raises(ValueError, match="string keys of table .* are corrupt"):
        emb.load_own_variables(store)
    assert emb.params.export()[0].numpy().tolist() == before



def test_nul_bytes_survive_graph_mode():
    """Strings reach numpy as one joined buffer + lengths: trailing NULs (which numpy
    ``S`` scalars would strip) must survive, also at the end of the buffer."""
    v = de.Variable(key_dtype=tf.string, dim=1, name="st_nul")
    up = tf.function(lambda k, x: v.upsert(k, x))
    look = tf.function(lambda k: v.lookup(k))
    up(strings([b"a", b"b\x00"]), tf.constant([[1.0], [2.0]]))
    got = look(strings([b"b\x00", b"b", b"a", b"a\x00"])).numpy().ravel()
    assert got.tolist() == [2.0, 0.0, 1.0, 0.0]
    assert sorted(v.export()[0].numpy().tolist()) == [b"a", b"b\x00"]
    assert look(strings([])).shape == (0, 1)
    assert v.lookup(tf.constant(b"b\x00")).numpy().tolist() == [2.0]      # a scalar key
