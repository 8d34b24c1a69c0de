"""TF1 graph mode: DeepRec's get_kv_variable (variable scopes, partitioners), the
tf.compat.v1.train optimizers through de.DynamicEmbeddingOptimizer against a dense
variable, tf.compat.v1.train.Saver round trips into another shard count, and seed 002's
example in a process with eager execution disabled."""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V1 = tf.compat.v1
KEYS = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0, 3, 3], np.int64)
OPTIMIZERS = {
    "sgd": lambda: V1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: V1.train.MomentumOptimizer(0.1, 0.9),
    "nesterov": lambda: V1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "adagrad": lambda: V1.train.AdagradOptimizer(0.1),
    "adam": lambda: V1.train.AdamOptimizer(0.1),
    "ftrl": lambda: V1.train.FtrlOptimizer(0.05, l1_regularization_strength=0.025,
                                           l2_regularization_strength=1e-5)}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_v1_optimizers_match_a_dense_variable(name):
    """Rows of the batch's ids (one repeated) after 3 steps equal a dense table's under
    the same TF1 optimizer; a dense layer trains beside them; global_step advances."""
    ids_np = KEYS
    rows_np = np.array([0, 1, 2, 3, 4, 4])              # the dense twin's row of each id
    with tf.Graph().as_default():
        v = de.get_kv_variable("kv", embedding_dim=4, initializer=V1.ones_initializer())
        dense = V1.get_variable("dense", initializer=np.ones((5, 4), np.float32))
        bias = V1.get_variable("bias", initializer=np.full(4, 0.1, np.float32))
        ref_bias = V1.get_variable("ref_bias", initializer=np.full(4, 0.1, np.float32))
        w = tf.constant(np.linspace(0.5, 2.0, 24).reshape(6, 4), tf.float32)
        loss = tf.reduce_sum((tf.nn.embedding_lookup(v, tf.constant(ids_np)) + bias) ** 2 * w)
        ref = tf.reduce_sum((tf.nn.embedding_lookup(dense, tf.constant(rows_np)) + ref_bias)
                            ** 2 * w)
        step = V1.train.get_or_create_global_step()
        opt = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())
        train = opt.minimize(loss, global_step=step, var_list=[v, bias])
        ref_train = OPTIMIZERS[name]().minimize(ref, var_list=[dense, ref_bias])
        got = tf.nn.embedding_lookup(v, tf.constant(ids_np))
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            for _ in range(3):
                sess.run([train, ref_train])
            got, want, b, rb, steps = sess.run([got, tf.gather(dense, rows_np), bias, ref_bias,
                                                step])
    assert np.allclose(got, want, atol=2e-6), np.abs(got - want).max()
    assert np.allclose(b, rb, atol=1e-6) and steps == 3 and not np.allclose(got, 1.0)


def test_scopes_reuse_and_partitioners():
    with tf.Graph().as_default():
        with V1.variable_scope("s", reuse=V1.AUTO_REUSE):
            a = de.get_kv_variable("e", embedding_dim=2,
                                   partitioner=V1.fixed_size_partitioner(num_shards=5))
            assert de.get_kv_variable("e", embedding_dim=2) is a
        assert a.name == "s/e" and len(a.table.shards) == 5
        with V1.variable_scope("s"):
            with pytest.raises(ValueError, match="already exists"):
                de.get_kv_variable("e", embedding_dim=2)
        with V1.variable_scope("s", reuse=True):
            assert de.get_kv_variable("e", embedding_dim=2) is a
            with pytest.raises(ValueError, match="does not exist"):
                de.get_kv_variable("f", embedding_dim=2)
        with V1.variable_scope("s", reuse=V1.AUTO_REUSE):
            with pytest.raises(ValueError, match="dim 2"):
                de.get_kv_variable("e", embedding_dim=3)
    with tf.Graph().as_default():                     # another graph: its own names
        assert len(de.get_kv_variable("s/e", embedding_dim=2).table.shards) == 1
    with pytest.raises(ValueError, match="embedding_dim"):
        de.get_kv_variable("x")
    with pytest.raises(NotImplementedError, match="constraint"):
        de.get_kv_variable("x", embedding_dim=2, constraint=lambda t: t)


def test_saver_round_trip_from_five_shards_into_three(tmp_path):
    path = str(tmp_path / "model.ckpt")

    def graph(shards):
        ids = tf.constant(KEYS)
        v = de.get_kv_variable("kv", embedding_dim=3, partitioner=V1.fixed_size_partitioner(
            shards), initializer=V1.random_normal_initializer(seed=1))
        w = de.get_kv_variable("other", embedding_dim=3)
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids) ** 2) + tf.reduce_sum(
            tf.nn.embedding_lookup(w, ids))
        train = de.DynamicEmbeddingOptimizer(V1.train.AdamOptimizer(0.1)).minimize(loss)
        return v, w, train, V1.train.Saver()

    with tf.Graph().as_default():
        v, w, train, saver = graph(5)
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            sess.run(train)
            saver.save(sess, path)
            sess.run(train)                                    # not saved
        want = de.checkpoint.table_state(v)
    names = [n for n, _ in tf.train.list_variables(path)]
    assert "kv/keys" in names and "other/keys" in names
    with tf.Graph().as_default():
        v, w, train, saver = graph(3)
        with V1.Session() as sess:
            saver.restore(sess, path)
            sess.run(train)                                    # the second step, again
        got = de.checkpoint.table_state(v)
    meta = [json.loads(s["columns"]) for s in (want, got)]
    assert [m.pop("num_shards") for m in meta] == [5, 3] and meta[0] == meta[1]
    a, b = np.argsort(want["keys"]), np.argsort(got["keys"])
    for k in ("keys", "values", "column_bytes"):                # rows and Adam slots
        assert np.allclose(want[k][a], got[k][b], atol=1e-6), k


def test_get_kv_variable_in_tf2_eager_mode():
    v = de.get_kv_variable("eager_kv", embedding_dim=2, initializer=V1.ones_initializer())
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant(KEYS[:3])))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    assert np.allclose(v.lookup(tf.constant(KEYS[:3])), 0.5)
    v1 = de.DynamicEmbeddingOptimizer(V1.train.GradientDescentOptimizer(0.5))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant(KEYS[:3])))
    v1.apply_gradients(zip(tape.gradient(loss, v.trainable_variables), v.trainable_variables))
    assert np.allclose(v.lookup(tf.constant(KEYS[:3])), 0.0)


SEED_002 = """
import os, sys, numpy as np
import tensorflow as tf
import tf_bridge as de
tf.compat.v1.disable_eager_execution()
ckp_path = os.path.join(sys.argv[1], 'model.ckpt')
num_shards = 5
with tf.compat.v1.variable_scope('test', reuse=tf.compat.v1.AUTO_REUSE):
    var = de.get_kv_variable("kv_embedding", embedding_dim=64, key_dtype=tf.int64,
                             initializer=tf.compat.v1.ones_initializer(),
                             partitioner=tf.compat.v1.fixed_size_partitioner(num_shards=num_shards))
    dense = tf.compat.v1.get_variable("dense", initializer=np.ones((7, 64), np.float32))
ids = tf.convert_to_tensor([1, 2, 3, 6, 8, 9], dtype=tf.int64)
emb = tf.nn.embedding_lookup(var, ids)
emb1 = tf.nn.embedding_lookup(var, tf.convert_to_tensor([1000000000000000], dtype=tf.int64))
fun = tf.add(emb, 1.0, name='add')
loss = tf.reduce_sum(fun)
ref = tf.reduce_sum(tf.add(tf.nn.embedding_lookup(dense, tf.range(6)), 1.0))
make = lambda: tf.compat.v1.train.FtrlOptimizer(0.005, l1_regularization_strength=0.025,
                                                l2_regularization_strength=0.00001)
opt = de.DynamicEmbeddingOptimizer(make())
g_v = opt.compute_gradients(loss)
train_op = opt.apply_gradients(g_v)
ref_op = make().minimize(ref, var_list=[dense])
init = tf.compat.v1.global_variables_initializer()
saver = tf.compat.v1.train.Saver()
with tf.compat.v1.Session() as sess:
    sess.run(init)
    first = sess.run({'emb': emb, 'fun': fun, 'train': train_op, 'ref': ref_op})
    assert np.all(first['emb'] == 1.0) and np.all(first['fun'] == 2.0)
    assert np.all(sess.run(emb1) == 1.0)
    save_path = saver.save(sess, ckp_path)
    trained, want = sess.run([emb, dense])
    assert np.allclose(trained, want[:6]) and not np.allclose(trained, 1.0)
with tf.compat.v1.Session() as sess:
    saver.restore(sess, ckp_path)
    assert np.all(sess.run(emb1) == 1.0)
    assert np.allclose(sess.run(emb), trained)
print("seed 002 ok", len(var.table.shards))
"""


def test_seed_002_example_in_graph_mode(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SEED_002, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seed 002 ok 5" in proc.stdout


def test_a_plain_tf1_optimizer_is_refused_with_a_clear_error():
    with tf.Graph().as_default():
        v = de.get_kv_variable("plain", embedding_dim=2)
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([1, 2], tf.int64)))
        with pytest.raises(TypeError, match="DynamicEmbeddingOptimizer"):
            V1.train.FtrlOptimizer(0.1).minimize(loss)


def test_writes_are_ops_a_session_runs():
    """upsert / accum / remove / clear return their op in a graph (nothing happens until
    it runs, as TFRA's); eagerly they return None."""
    with tf.Graph().as_default():
        v = de.Variable(dim=2, name="writes")
        keys = tf.constant([5, -1], tf.int64)
        up = v.upsert(keys, tf.ones([2, 2]))
        acc = v.accum(keys, tf.ones([2, 2]), tf.fill([2, 2], 3.0), tf.constant([True, True]))
        rm, clear = v.remove(keys[:1]), v.clear()
        assert all(isinstance(op, tf.Operation) for op in (up, acc, rm, clear))
        size, rows = v.size(), v.lookup(keys)
        with V1.Session() as sess:
            assert sess.run(size) == 0                   # built, not run
            sess.run(up)
            sess.run(acc)
            assert sess.run(rows).tolist() == [[3.0, 3.0], [3.0, 3.0]]
            sess.run(rm)
            assert sess.run(size) == 1
            sess.run(clear)
            assert sess.run(size) == 0
    assert de.Variable(dim=2, name="eager_writes").upsert(tf.constant([1], tf.int64),
                                                         tf.ones([1, 2])) is None
