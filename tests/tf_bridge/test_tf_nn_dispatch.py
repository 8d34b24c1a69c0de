"""tf.nn's embedding lookups on tf_bridge variables (TF's type dispatch): values and
gradients against a dense tf.Variable oracle, eager, in tf.function and in a TF1 graph;
lists of variables as ``params``."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de

EXTREME = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]
KEYS = np.array(EXTREME + [7, 12, 2**40], np.int64)


def dense_twin(dim, init):
    """A dense table whose row i is key KEYS[i]'s initial row, and the map key -> row."""
    return tf.Variable(np.full((len(KEYS), dim), init, np.float32)), {int(k): i for i, k in
                                                                       enumerate(KEYS)}


def rows_of(ids, index):
    return np.vectorize(lambda k: index[int(k)])(ids)


@pytest.mark.parametrize("wrap", ["eager", "function"])
def test_lookup_gradient_and_step_match_a_dense_variable(wrap):
    v = de.Variable(dim=2, name=f"nn_dense_{wrap}", initializer=0.5)
    dense, index = dense_twin(2, 0.5)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
    ref_opt = keras.optimizers.Adagrad(0.1)
    ids = np.array([[KEYS[0], KEYS[1]], [KEYS[2], KEYS[0]], [KEYS[3], KEYS[5]]], np.int64)
    weights = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 2, 2))

    def step(ids, rows):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids) ** 2 * weights)
        g = tape.gradient(loss, [v])
        opt.apply_gradients(zip(g, [v]))
        with tf.GradientTape() as tape:
            ref = tf.reduce_sum(tf.nn.embedding_lookup(dense, rows) ** 2 * weights)
        # dense gradient: a repeated id's slices summed before Adagrad squares them (ours)
        ref_opt.apply_gradients([(tf.convert_to_tensor(tape.gradient(ref, dense)), dense)])
        return loss, ref

    run = tf.function(step) if wrap == "function" else step
    for _ in range(3):
        loss, ref = run(tf.constant(ids), tf.constant(rows_of(ids, index)))
        assert np.isclose(float(loss), float(ref), rtol=1e-6)
    got = tf.nn.embedding_lookup(v, tf.constant(KEYS)).numpy()
    assert np.allclose(got, dense.numpy(), atol=1e-6)
    assert int(v.size()) == len(np.unique(ids))            # only the batch's ids were inserted


def test_sparse_and_safe_lookups_dispatch_to_ours():
    v = de.Variable(dim=3, name="nn_sparse", initializer=keras.initializers.RandomNormal(seed=1))
    sp = tf.sparse.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant(KEYS[[0, 4, 1]]), [3, 2])
    w = tf.sparse.SparseTensor(sp.indices, [2.0, 1.0, 0.5], sp.dense_shape)
    for combiner in ("sum", "mean", "sqrtn"):
        want = de.embedding_lookup_sparse(v, sp, w, combiner=combiner)
        assert np.allclose(tf.nn.embedding_lookup_sparse(v, sp, w, combiner=combiner), want)
        assert np.allclose(tf.compat.v1.nn.embedding_lookup_sparse(v, sp, w, combiner=combiner),
                           want)
        safe = de.safe_embedding_lookup_sparse(v, sp, w, combiner=combiner)
        assert np.allclose(tf.nn.safe_embedding_lookup_sparse(v, sp, w, combiner=combiner), safe)
        assert np.allclose(tf.compat.v1.nn.safe_embedding_lookup_sparse([v], sp, w,
                                                                        combiner=combiner), safe)
    assert np.allclose(tf.compat.v1.nn.embedding_lookup(v, KEYS, partition_strategy="div",
                                                        max_norm=0.01),
                       de.embedding_lookup(v, KEYS, max_norm=0.01))


def test_a_list_of_variables_splits_ids_by_key_mod_n():
    vs = [de.Variable(dim=2, name=f"nn_part{i}", initializer=float(i)) for i in range(3)]
    ids = tf.constant(KEYS.reshape(7, 1))
    got = tf.nn.embedding_lookup(vs, ids).numpy()
    assert got.shape == (7, 1, 2)
    assert np.array_equal(got[:, 0, 0], (KEYS % 3).astype(np.float32))   # floor mod
    assert np.array_equal(tf.nn.embedding_lookup([vs[1]], ids), de.embedding_lookup(vs[1], ids))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(vs, ids))
    grads = tape.gradient(loss, vs)
    opt.apply_gradients(zip(grads, vs))
    after = tf.nn.embedding_lookup(vs, ids).numpy()[:, 0, 0]
    assert np.array_equal(after, (KEYS % 3).astype(np.float32) - 1)
    for i, v in enumerate(vs):                         # each key lives in one variable only
        keys = v.export()[0].numpy()
        assert set(keys.tolist()) == set(KEYS[KEYS % 3 == i].tolist())
    sp = tf.sparse.SparseTensor([[0, 0], [0, 1], [1, 0], [1, 1]],
                                tf.constant([1, 2, 0, 5], tf.int64), [2, 2])
    # 1 and 2, 5 untrained (their variable's initial value); 0 trained once (0 - 1)
    assert np.allclose(tf.nn.embedding_lookup_sparse(vs, sp, None, combiner="sum")[:, 0],
                       [1 + 2, (0 - 1) + 2])
    with pytest.raises(ValueError, match="non-empty list"):
        de.embedding_lookup([], ids)
    with pytest.raises(ValueError, match="one dim"):
        de.embedding_lookup([vs[0], de.Variable(dim=3, name="nn_other")], ids)
    with pytest.raises(TypeError, match=r"params\[1\]"):
        de.embedding_lookup([vs[0], "x"], ids)


def test_dispatch_in_a_tf1_graph():
    with tf.Graph().as_default():
        v = de.Variable(dim=2, name="nn_graph", initializer=1.5)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = tf.compat.v1.nn.embedding_lookup(v, ids)
        extreme = tf.nn.embedding_lookup([v], tf.constant(KEYS))
        sp = tf.sparse.SparseTensor([[0, 0], [1, 0], [1, 1]], ids, [2, 2])
        comb = tf.compat.v1.nn.safe_embedding_lookup_sparse(v, sp, combiner="sum")
        loss = tf.reduce_sum(emb * 3.0)
        grad, = tf.compat.v1.gradients(loss, [v.trainable_handle])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            feed = {ids: KEYS[3:6]}        # 0, 7, 12: tf.nn's safe lookup prunes ids < 0
            e, c, g, x = sess.run([emb, comb, grad, extreme], feed)
    assert e.shape == (3, 2) and np.all(e == 1.5) and x.shape == (7, 2) and np.all(x == 1.5)
    assert np.allclose(c, [[1.5, 1.5], [3.0, 3.0]])
    assert sorted(g.indices.tolist()) == sorted(KEYS[3:6].tolist()) and np.all(g.values == 3.0)
