"""TF1 graph serving export: de.export_graph_for_serving writes a SavedModel of a session's
graph with TF-native table lookups, which serves in a process without tf_bridge or
numbaemb what the session computes (trained rows, initializer values for unknown ids)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V1 = tf.compat.v1
I64 = np.iinfo(np.int64)
# unknown ids and the extremes beside trained ones
BATCH = np.array([[1, 2, 99], [I64.max, 4, -1], [I64.min, 0, 3]], np.int64)

SERVE = """
import json, sys
import numpy as np, tensorflow as tf
path, feeds = sys.argv[1], json.loads(sys.argv[2])
fn = tf.saved_model.load(path).signatures["serving_default"]
args = {k: tf.constant(np.array(v, dtype=d)) for k, (v, d) in feeds.items()}
out = {k: v.numpy().tolist() for k, v in fn(**args).items()}
print(json.dumps({"out": out, "ours": [m for m in ("tf_bridge", "numbaemb") if m in sys.modules]}))
"""


def serve_elsewhere(path, feeds):
    """Run the SavedModel's serving signature in a fresh process with TensorFlow only."""
    arg = json.dumps({k: (np.asarray(v).astype(str if np.asarray(v).dtype.kind == "S" else
                                               np.asarray(v).dtype).tolist(),
                          str(np.asarray(v).dtype)) for k, v in feeds.items()})
    proc = subprocess.run([sys.executable, "-c", SERVE, str(path), arg], capture_output=True,
                          text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ours"] == []
    return {k: np.array(v) for k, v in got["out"].items()}


def ctr_graph():
    """ids (batch, 3) and dense x (batch, 2) -> score (batch,), a 2-shard kv table
    with a seeded normal initializer, trained 3 Adagrad steps."""
    ids = V1.placeholder(tf.int64, [None, 3], name="ids")
    x = V1.placeholder(tf.float32, [None, 2], name="x")
    v = de.get_kv_variable("kv", embedding_dim=4,
                           initializer=V1.random_normal_initializer(0.0, 1.0, seed=3),
                           partitioner=V1.fixed_size_partitioner(2))
    w = V1.get_variable("w", initializer=np.linspace(0.1, 1.0, 8).reshape(4, 2)
                        .astype(np.float32))
    emb = tf.reduce_sum(tf.nn.embedding_lookup(v, ids), axis=1)
    score = tf.reduce_sum(tf.matmul(emb, w) * x, axis=1)
    train = de.DynamicEmbeddingOptimizer(V1.train.AdagradOptimizer(0.1)).minimize(
        tf.reduce_sum(score ** 2))
    return ids, x, v, score, train


def test_the_export_serves_what_the_session_computes(tmp_path):
    with tf.Graph().as_default():
        ids, x, v, score, train = ctr_graph()
        lookup, exists = v.lookup(ids, return_exists=True)      # the direct lookup op too
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            for _ in range(3):
                sess.run(train, {ids: [[1, 2, 3], [3, 4, -1]], x: np.ones((2, 2))})
            feed = {ids: BATCH, x: np.full((3, 2), 0.5, np.float32)}
            want = sess.run({"score": score, "rows": lookup, "exists": exists}, feed)
            size = v.size()
            n = sess.run(size)
            path = de.export_graph_for_serving(
                sess, tmp_path / "sm", {"ids": ids, "x": x},
                {"score": score, "rows": lookup, "exists": exists})
            assert sess.run(size) == n == 5                 # the export inserted nothing
    got = serve_elsewhere(path, {"ids": BATCH, "x": np.full((3, 2), 0.5, np.float32)})
    np.testing.assert_array_equal(got["score"], want["score"])
    np.testing.assert_array_equal(got["rows"], want["rows"])
    np.testing.assert_array_equal(got["exists"], want["exists"])
    assert want["exists"].tolist() == [[True, True, False], [False, True, True],
                                       [False, False, True]]
    assert sorted(os.listdir(tmp_path)) == ["sm"]            # no temporary directory left


def test_string_keys_and_the_graph_holds_no_copy_of_the_table(tmp_path):
    with tf.Graph().as_default():
        keys = V1.placeholder(tf.string, [None], name="keys")
        v = de.Variable(dim=8, key_dtype=tf.string, name="words",
                        initializer=tf.keras.initializers.RandomUniform(-1.0, 1.0, seed=5))
        words = np.array([f"w{i}".encode() for i in range(20000)], object)
        rows = np.arange(20000 * 8, dtype=np.float32).reshape(-1, 8)
        insert = v.upsert(tf.constant(words), tf.constant(rows))
        out = tf.nn.embedding_lookup(v, keys)
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            sess.run(insert)
            probe = np.array([b"w7", b"unknown", b"", b"w19999"], object)
            want = sess.run(out, {keys: probe})
            path = de.export_graph_for_serving(sess, tmp_path / "sm", {"keys": keys},
                                               {"rows": out})
    np.testing.assert_array_equal(want[[0, 3]], rows[[7, 19999]])
    assert os.path.getsize(os.path.join(path, "saved_model.pb")) < 200_000   # rows: 640 KB
    got = serve_elsewhere(path, {"keys": probe.astype("S")})
    np.testing.assert_array_equal(got["rows"], want)


def test_bad_arguments_and_python_calls_raise_before_writing(tmp_path):
    with tf.Graph().as_default():
        ids, x, v, score, _ = ctr_graph()
        random_init = de.get_kv_variable("drawn", embedding_dim=4,
                                         initializer=lambda shape, dtype=None: tf.ones(shape))
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            with pytest.raises(TypeError, match="sess"):
                de.export_graph_for_serving(None, tmp_path / "a", {"ids": ids}, {"s": score})
            with pytest.raises(TypeError, match="inputs"):
                de.export_graph_for_serving(sess, tmp_path / "a", [ids], {"s": score})
            with pytest.raises(TypeError, match="outputs"):
                de.export_graph_for_serving(sess, tmp_path / "a", {"ids": ids}, {"s": 1.0})
            counted = score + tf.cast(v.size(), tf.float32)
            with pytest.raises(ValueError, match="not table lookups"):
                de.export_graph_for_serving(sess, tmp_path / "a", {"ids": ids, "x": x},
                                            {"s": counted})
            drawn = tf.nn.embedding_lookup(random_init, ids)
            with pytest.raises(ValueError, match="callable initializer"):
                de.export_graph_for_serving(sess, tmp_path / "a", {"ids": ids}, {"e": drawn})
            (tmp_path / "taken").mkdir()
            with pytest.raises(ValueError, match="exists"):
                de.export_graph_for_serving(sess, tmp_path / "taken", {"ids": ids, "x": x},
                                            {"s": score})
    assert sorted(os.listdir(tmp_path)) == ["taken"]


def test_an_input_the_outputs_do_not_use_stays_in_the_signature(tmp_path):
    with tf.Graph().as_default():
        ids = V1.placeholder(tf.int64, [None], name="ids")
        unused = V1.placeholder(tf.float32, [None], name="unused")
        v = de.Variable(dim=2, name="small", initializer=1.5)
        out = tf.nn.embedding_lookup(v, ids)
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            path = de.export_graph_for_serving(sess, tmp_path / "sm",
                                               {"ids": ids, "unused": unused}, {"rows": out})
    got = serve_elsewhere(path, {"ids": np.array([3, -1], np.int64),
                                 "unused": np.zeros(2, np.float32)})
    np.testing.assert_array_equal(got["rows"], np.full((2, 2), 1.5, np.float32))
