"""Serving export: SavedModels that serve in a fresh process with only TensorFlow.

One Keras model (dense ids, sparse and ragged bags, every combiner) and one
tf.Module (an int32 table, embedding_lookup_sparse with weights) are exported
once; a subprocess that cannot import numbaemb / jit_kernels / tf_bridge loads
both and serves fixed batches through ``serve`` and the flat
``serving_default`` signature.  The live models (inference) are the oracle:
known ids give trained rows, unknown ids the initializer's value, bit for bit.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numbaemb as ne  # noqa: E402
import tf_bridge as de  # noqa: E402

I64 = np.iinfo(np.int64)
K = keras.initializers


class Emb(keras.layers.Layer):
    """A minimal dynamic embedding layer: dense ids -> rows, sparse/ragged -> combined."""

    def __init__(self, dim, combiner=None, initializer=None, num_shards=1, **kw):
        super().__init__(**kw)
        self.dim, self.combiner = dim, combiner
        self.table = de.Variable(dim=dim, name=self.name, initializer=initializer,
                                 num_shards=num_shards)

    def call(self, ids):
        if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
            return de.safe_embedding_lookup_sparse(self.table, ids, None, combiner=self.combiner)
        return de.embedding_lookup(self.table, ids)

    def compute_output_shape(self, shape):
        return tuple(shape) + (self.dim,) if self.combiner is None else (shape[0], self.dim)


def keras_model():
    ids = keras.Input((3,), dtype="int64", name="ids")
    sp = keras.Input((None,), dtype="int64", sparse=True, name="sp")
    bag = keras.Input((None,), dtype="int64", ragged=True, name="bag")
    user = Emb(4, initializer=K.RandomNormal(stddev=0.5, seed=3), num_shards=3, name="user")
    item = Emb(4, combiner="mean", initializer=K.TruncatedNormal(seed=4), name="item")
    tag = Emb(4, combiner="sqrtn", initializer=K.RandomUniform(-1.0, 1.0, seed=5), name="tag")
    ctx = de.keras.layers.Embedding(4, combiner="sum", name="ctx", num_shards=2,
                                    initializer=K.RandomUniform(seed=6))   # the library's layer
    u, i, t, c = user(ids), item(sp), tag(bag), ctx(ids)
    score = keras.layers.Dense(1, name="head")(
        keras.layers.Concatenate()([keras.layers.Flatten()(u), i, t, c]))
    model = keras.Model([ids, sp, bag], {"user": u, "item": i, "tag": t, "ctx": c, "score": score})
    rng = np.random.default_rng(0)
    for table, known in ((user.table, [1, 2, 3, -1, I64.max, I64.min]), (item.table, [5, 6, 7]),
                         (tag.table, [10, 11, -12]), (ctx.params, [2, 3, 4, I64.min])):
        k = np.array(known, np.int64)
        table.upsert(tf.constant(k), rng.standard_normal((k.size, 4)).astype(np.float32))
    ne.optimizers.apply_gradients(user.table.table, ne.optimizers.Adam(), np.array([1, 8]),
                                  np.ones((2, 4)), step=1)         # slot columns: ignored
    return model


class Tower(tf.Module):
    """Not Keras: an int32 table, weighted sparse lookup, a dense variable."""

    def __init__(self):
        super().__init__()
        self.v = de.Variable(key_dtype=tf.int32, dim=3, name="tower_v",
                             initializer=tf.constant_initializer(0.5))
        self.v.upsert(tf.constant([1, 2, -3], tf.int32), tf.reshape(tf.range(9.0), [3, 3]))
        self.w = tf.Variable(2.0)

    def __call__(self, ids, sp_ids, sp_weights):
        rows = de.embedding_lookup(self.v, ids)
        bag = de.embedding_lookup_sparse(self.v, sp_ids, sp_weights, combiner="sum")
        return {"rows": rows * self.w, "bag": bag}


TOWER_SIG = [tf.TensorSpec([None, None], tf.int64, name="ids"),
             tf.SparseTensorSpec([None, None], tf.int64),
             tf.SparseTensorSpec([None, None], tf.float32)]


def batches():
    """Inputs with known ids, unknown ids, extremes, negative ids (keys), empty rows."""
    dense = np.array([[1, 2, 99], [-1, I64.max, I64.min], [4, 2**40, -7]], np.int64)
    sp = tf.sparse.from_dense(tf.constant([[5, 6, 0], [0, 0, 0], [7, 1000, -2]], tf.int64))
    bag = tf.ragged.constant([[10, 11, 12], [], [-12, 10**12, -1, 10]], tf.int64)
    tower_ids = np.array([[1, 2], [-3, 77]], np.int64)
    tsp = tf.sparse.from_dense(tf.constant([[1, 5, 0], [-3, 0, 9]], tf.int64))
    tw = tf.SparseTensor(tsp.indices, tf.constant([0.5, 2.0, 1.0, 3.0]), tsp.dense_shape)
    return dense, sp, bag, tower_ids, tsp, tw


SCRIPT = """
import sys
sys.modules["numbaemb"] = None; sys.modules["jit_kernels"] = None; sys.modules["tf_bridge"] = None
import os, time
import numpy as np, tensorflow as tf      # imported while the parent exports
deadline = time.time() + 300
while not os.path.exists(sys.argv[1] + ".ready") and time.time() < deadline:
    time.sleep(0.05)
d = dict(np.load(sys.argv[1]))
sp = tf.SparseTensor(d["sp_indices"], d["sp_values"], d["sp_dense_shape"])
bag = tf.RaggedTensor.from_row_splits(d["bag_values"], d["bag_row_splits"])
tsp = tf.SparseTensor(d["tsp_indices"], d["tsp_values"], d["tsp_dense_shape"])
tw = tf.SparseTensor(d["tsp_indices"], d["tw_values"], d["tsp_dense_shape"])
out = {}
m = tf.saved_model.load(sys.argv[2])
for k, v in m.serve([tf.constant(d["ids"]), sp, bag]).items():
    out["keras_" + k] = v.numpy()
flat = {k: tf.constant(d[k]) for k in ["ids", "sp_indices", "sp_values", "sp_dense_shape",
                                       "bag_values", "bag_row_splits"]}
for k, v in m.signatures["serving_default"](**flat).items():
    out["sig_" + k] = v.numpy()
out["lookup_user"] = m.lookup_user(tf.constant(d["ids"])).numpy()
t = tf.saved_model.load(sys.argv[3])
for k, v in t.serve(tf.constant(d["tower_ids"]), tsp, tw).items():
    out["tower_" + k] = v.numpy()
np.savez(sys.argv[4], **out)
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    script = tmp / "serve.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp / "in.npz"), str(tmp / "keras"),
                             str(tmp / "tower"), str(tmp / "out.npz")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        return _export_and_serve(tmp, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _export_and_serve(tmp, proc):
    model, tower = keras_model(), Tower()
    sizes = [model.get_layer(n).table.table.size() for n in ("user", "item", "tag")]
    de.export_for_serving(model, str(tmp / "keras"))
    de.export_for_serving(tower, str(tmp / "tower"), TOWER_SIG)
    assert de.get_model_mode() == "train"                       # restored after tracing
    dense, sp, bag, tower_ids, tsp, tw = batches()
    np.savez(tmp / "in.npz", ids=dense, sp_indices=sp.indices, sp_values=sp.values,
             sp_dense_shape=sp.dense_shape, bag_values=bag.values, bag_row_splits=bag.row_splits,
             tower_ids=tower_ids, tsp_indices=tsp.indices, tsp_values=tsp.values,
             tsp_dense_shape=tsp.dense_shape, tw_values=tw.values)
    (tmp / "in.npz.ready").write_text("")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    live = model([tf.constant(dense), sp, bag], training=False)
    # serving never inserts: the live tables are as they were
    assert sizes == [model.get_layer(n).table.table.size() for n in ("user", "item", "tag")]
    return dict(np.load(tmp / "out.npz")), model, tower, live


@pytest.mark.parametrize("key", ["user", "item", "tag", "ctx"])
def test_fresh_process_serves_lookups_bit_exact(exported, key):
    served, model, _, live = exported
    np.testing.assert_array_equal(served[f"keras_{key}"], live[key].numpy())
    np.testing.assert_array_equal(served[f"sig_{key}"], live[key].numpy())


def test_known_ids_trained_rows_unknown_ids_initializer_defaults(exported):
    served, model, _, _ = exported
    dense = batches()[0]
    table = model.get_layer("user").table
    rows, exists = table.lookup(tf.constant(dense), return_exists=True)
    assert exists.numpy().any() and not exists.numpy().all()
    np.testing.assert_array_equal(served["keras_user"], rows.numpy())
    np.testing.assert_array_equal(served["lookup_user"], rows.numpy())
    oracle = ne.Variable(4, name="user", initializer=ne.initializers.RandomNormal(0.0, 0.5, seed=3))
    unknown = dense[~exists.numpy()]
    np.testing.assert_array_equal(served["keras_user"][~exists.numpy()], oracle.lookup(unknown))


def test_dense_head_and_signature(exported):
    served, _, _, live = exported
    np.testing.assert_allclose(served["keras_score"], live["score"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(served["sig_score"], served["keras_score"])


def test_tf_module_int32_table_weighted_sparse(exported):
    served, _, tower, _ = exported
    _, _, _, tower_ids, tsp, tw = batches()
    live = tower(tf.constant(tower_ids), tsp, tw)
    np.testing.assert_array_equal(served["tower_rows"], live["rows"].numpy())
    np.testing.assert_array_equal(served["tower_bag"], live["bag"].numpy())
    assert (served["tower_rows"][1, 1] == 1.0).all()            # unknown: 0.5 * w


def test_export_refuses_what_cannot_serve(tmp_path):
    rand = de.Variable(dim=2, name="callable_init",
                       initializer=lambda shape, dtype=None: np.ones(shape))
    spec = [tf.TensorSpec([None], tf.int64)]
    with pytest.raises(ValueError, match="callable initializer"):
        de.export_for_serving(lambda ids: de.embedding_lookup(rand, ids), str(tmp_path / "a"), spec)
    v = de.Variable(dim=2, name="sized")
    with pytest.raises(ValueError, match="calls back into Python"):
        de.export_for_serving(lambda ids: de.embedding_lookup(v, ids) * tf.cast(v.size(), tf.float32),
                              str(tmp_path / "b"), spec)
    with pytest.raises(ValueError, match="input_signature is needed"):
        de.export_for_serving(lambda ids: ids, str(tmp_path / "c"))
    with pytest.raises(TypeError, match="input_signature must"):
        de.export_for_serving(lambda ids: ids, str(tmp_path / "d"), "ids")
    assert de.get_model_mode() == "train"


def test_export_is_a_snapshot_and_empty_tables_serve_defaults(tmp_path):
    v = de.Variable(dim=2, name="snap", initializer=tf.keras.initializers.RandomUniform(seed=1))
    empty = de.Variable(dim=2, name="snap_empty", initializer=2.0)
    spec = [tf.TensorSpec([None], tf.int64)]
    v.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    want = v.lookup(tf.constant([1, 2], tf.int64)).numpy()
    path = de.export_for_serving(
        lambda ids: de.embedding_lookup(v, ids) + de.embedding_lookup(empty, ids),
        str(tmp_path / "sm"), spec)
    v.upsert(tf.constant([1, 2], tf.int64), tf.zeros([2, 2]))   # after export: not served
    served = tf.saved_model.load(path)              # keep a reference: it owns the variables
    got = served.serve(tf.constant([1, 2], tf.int64)).numpy()
    np.testing.assert_array_equal(got, want + 2.0)


def test_sequential_default_signature_and_subclassed_model(tmp_path):
    seq = keras.Sequential([keras.Input((3,), dtype="int64"),
                            de.keras.layers.Embedding(4, combiner="mean", name="seq_e"),
                            keras.layers.Dense(1)])
    seq.get_layer("seq_e").params.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = de.keras.layers.Embedding(2, name="sub_e", initializer=0.5)

        def call(self, ids):
            return self.emb(ids)

    sub = Sub()
    x = tf.constant([[1, 2, 9]], tf.int64)
    sub(x)
    with pytest.raises(ValueError, match="input_signature is needed"):
        de.export_for_serving(sub, str(tmp_path / "no_sig"))
    seq_path = de.export_for_serving(seq, str(tmp_path / "seq"))
    sub_path = de.export_for_serving(sub, str(tmp_path / "sub"),
                                     [tf.TensorSpec([None, None], tf.int64, name="ids")])
    s1, s2 = tf.saved_model.load(seq_path), tf.saved_model.load(sub_path)
    np.testing.assert_array_equal(s1.serve(x).numpy(), seq(x, training=False).numpy())
    np.testing.assert_array_equal(s2.serve(x).numpy(), sub(x, training=False).numpy())
    assert list(s2.signatures["serving_default"].structured_input_signature[1]) == ["ids"]


def test_nested_signature_gets_flat_named_components(tmp_path):
    v = de.Variable(dim=2, name="nested", initializer=tf.keras.initializers.RandomNormal(seed=1))
    v.upsert(tf.constant([1, 4], tf.int64), tf.ones([2, 2]))

    def fn(x):          # one positional argument: a dict of a ragged and a dense input
        return {"bag": de.safe_embedding_lookup_sparse(v, x["bag"], None, combiner="mean"),
                "ids": de.embedding_lookup(v, x["ids"])}

    sig = [{"bag": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
            "ids": tf.TensorSpec([None], tf.int64)}]
    served = tf.saved_model.load(de.export_for_serving(fn, str(tmp_path / "sm"), sig))
    flat = served.signatures["serving_default"]
    assert sorted(flat.structured_input_signature[1]) == ["bag_row_splits", "bag_values", "ids"]
    bag = tf.ragged.constant([[1, 2], [], [4, 9, -1]], tf.int64)
    ids = tf.constant([1, 7], tf.int64)
    got = flat(bag_values=bag.values, bag_row_splits=bag.row_splits, ids=ids)
    want = fn({"bag": bag, "ids": ids})
    for k in want:
        np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())
