"""float16 / bfloat16 tables in the TF bridge.

Oracles: TensorFlow's own casts for values written as float32; for training, a
float32 twin whose rows are set to the 16-bit table's before each step and rounded
(``tf.cast``) after it must give the same bits (optimizer math in float32, rounded
once on store); for checkpoints and serving, the live table.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tf_bridge as de  # noqa: E402
from tf_bridge.checkpoint import table_state  # noqa: E402

from .serving_helpers import reload_and_serve  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_numba_thread")
HALVES = [tf.float16, tf.bfloat16]
I64 = np.iinfo(np.int64)
KEYS = tf.constant([I64.min, -1, 0, 7, I64.max], tf.int64)


def bits(t):
    return tf.bitcast(tf.convert_to_tensor(t), tf.int16).numpy()


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_values_round_as_tensorflow_casts(dtype):
    v = de.Variable(dim=3, value_dtype=dtype, name=f"hv_round_{dtype.name}", num_shards=2,
                    initializer=keras.initializers.TruncatedNormal(seed=4))
    x = tf.constant([[1.0009765625, 65519.0, -3e-8], [1e6, -0.0, 0.1],
                     [np.nan, 2.5, 1.00048828125], [3.0, 4.0, 5.0], [1e-3, -1e-3, 7.0]])
    v.upsert(KEYS, x)
    got, exists = v.lookup(KEYS, return_exists=True)
    assert got.dtype == dtype and exists.numpy().all()
    assert np.array_equal(bits(got), bits(tf.cast(x, dtype)))
    keys, rows = v.export()
    assert rows.dtype == dtype and sorted(keys.numpy().tolist()) == sorted(KEYS.numpy().tolist())
    # unknown ids: the float32 initializer's value, rounded once
    twin = de.Variable(dim=3, name=f"hv_round32_{dtype.name}",
                       initializer=keras.initializers.TruncatedNormal(seed=4))
    fresh = tf.constant([11, 12], tf.int64)
    assert np.array_equal(bits(v.lookup(fresh)), bits(tf.cast(twin.lookup(fresh), dtype)))
    with pytest.raises(TypeError, match="real numbers"):
        v.upsert(KEYS[:1], np.array([["a", "b", "c"]]))


@pytest.mark.parametrize("make_opt", [lambda: keras.optimizers.Adam(0.05),
                                      lambda: keras.optimizers.SGD(0.1, momentum=0.9),
                                      lambda: keras.optimizers.Adagrad(0.1)],
                         ids=["adam", "sgd", "adagrad"])
@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_training_is_float32_math_rounded_once(dtype, make_opt):
    init = keras.initializers.RandomNormal(stddev=0.5, seed=9)
    v = de.Variable(dim=4, value_dtype=dtype, name=f"hv_train_{dtype.name}", initializer=init)
    twin = de.Variable(dim=4, name=f"hv_twin_{dtype.name}", initializer=init)
    opt_v, opt_t = de.DynamicEmbeddingOptimizer(make_opt()), de.DynamicEmbeddingOptimizer(make_opt())

    def step(var, opt, ids):
        @tf.function
        def run(ids):
            with tf.GradientTape() as tape:
                # the twin goes through the 16-bit dtype too, so TF rounds its output
                # gradient (the gradient of a 16-bit tensor is 16-bit) as for the table
                e = tf.cast(tf.cast(de.embedding_lookup(var, ids), dtype), tf.float32)
                loss = tf.reduce_sum(e * e * tf.range(1.0, 5.0)) + tf.reduce_sum(e)
            grads = tape.gradient(loss, [var])
            opt.apply_gradients(zip(grads, [var]))
            return loss
        return run(ids)

    rng = np.random.default_rng(0)
    for _ in range(4):
        ids = tf.constant(rng.integers(-4, 4, (3, 2)), tf.int64)
        flat = tf.reshape(ids, [-1])
        twin.upsert(flat, tf.cast(v.lookup(flat), tf.float32))     # the same starting rows
        lv, lt = step(v, opt_v, ids), step(twin, opt_t, ids)
        np.testing.assert_allclose(float(lv), float(lt), rtol=1e-6)
        after = twin.lookup(flat)
        assert np.array_equal(bits(v.lookup(flat)), bits(tf.cast(after, dtype)))
        twin.upsert(flat, tf.cast(tf.cast(after, dtype), tf.float32))
    slots = [c["dtype"] for c in __import__("json").loads(table_state(v)["columns"])["columns"]]
    assert slots and all(np.dtype(d) == np.float32 for d in slots)       # slots stay float32


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_checkpoint_round_trip(dtype, tmp_path):
    v = de.Variable(dim=2, value_dtype=dtype, name=f"hv_ck_{dtype.name}", num_shards=3)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.cast(de.embedding_lookup(v, KEYS), tf.float32))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    path = tf.train.Checkpoint(emb=v).save(str(tmp_path / "ck"))
    w = de.Variable(dim=2, value_dtype=dtype, name=f"hv_ck2_{dtype.name}", num_shards=2)
    tf.train.Checkpoint(emb=w).restore(path)
    assert np.array_equal(bits(w.lookup(KEYS)), bits(v.lookup(KEYS)))
    sv, sw = table_state(v), table_state(w)
    ov, ow = np.argsort(sv["keys"]), np.argsort(sw["keys"])
    assert np.array_equal(sv["column_bytes"][ov], sw["column_bytes"][ow])
    other = de.Variable(dim=2, name=f"hv_ck32_{dtype.name}")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="dtype"):
        tf.train.Checkpoint(emb=other).restore(path).assert_consumed()     # TF's own check
    assert int(other.size()) == 0


def test_keras_layer_trains_saves_and_serves_bfloat16(tmp_path):
    ids_in = keras.Input((3,), dtype="int64", name="ids")
    emb = de.keras.layers.Embedding(4, value_dtype=tf.bfloat16, combiner="sum", name="bfemb",
                                    initializer=keras.initializers.RandomUniform(seed=3))
    out = keras.layers.Dense(1, name="head")(keras.ops.cast(emb(ids_in), "float32"))
    model = keras.Model(ids_in, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)),
                  loss="mse")
    x = np.random.default_rng(1).integers(0, 50, (64, 3))
    model.fit(x, np.ones((64, 1), np.float32), batch_size=16, epochs=2, verbose=0)
    assert emb.params.export()[1].dtype == tf.bfloat16
    query = np.array([[1, 2, 10 ** 12], [-5, 3, 49]], np.int64)
    want, served = reload_and_serve(model, query, tmp_path)
    np.testing.assert_allclose(served["serve"], want, rtol=1e-6)
    np.testing.assert_allclose(served["signature"], want, rtol=1e-6)
