"""de.keras.layers.Embedding: model.fit / evaluate / predict, equality with a dense Keras
Embedding, combiners, the unwrapped-optimizer error, inference mode, config."""
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de

_names = itertools.count()


pytestmark = pytest.mark.usefixtures("one_numba_thread")   # tests/tf_bridge/conftest.py


@pytest.fixture
def train_mode():
    yield
    de.enable_train_mode()


def name():
    return f"kemb{next(_names)}"


def data(n=64, vocab=20, seed=0):
    """Ids (n, 3) in [0, vocab); target: a fixed per-id weight summed over the row."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, (n, 3)).astype(np.int64)
    y = rng.standard_normal(vocab).astype(np.float32)[x].sum(1, keepdims=True)
    return x, y


def model_with(layer, combiner=None, dim=4):
    inp = keras.Input((3,), dtype="int64")
    x = layer(inp)
    x = x if combiner else keras.layers.Flatten()(x)
    return keras.Model(inp, keras.layers.Dense(1, kernel_initializer="ones")(x))


def test_fit_evaluate_predict_train_the_table_and_only_fit_inserts():
    x, y = data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    layer = de.keras.layers.Embedding(8, name=name())
    model = model_with(layer)
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)), "mse")
    assert model.jit_compile is False
    before = model.evaluate(ds, verbose=0)
    assert int(layer.params.size()) == 0             # evaluate does not insert
    hist = model.fit(ds, epochs=4, shuffle=False, verbose=0).history["loss"]
    assert hist[-1] < hist[0] and model.evaluate(ds, verbose=0) < before
    assert int(layer.params.size()) == np.unique(x).size
    assert int(model.optimizer.iterations) == 4 * 4
    unseen = np.array([[1000, 1001, 1002]], np.int64)
    pred = model.predict(np.concatenate([x[:2], unseen]), verbose=0)
    assert pred.shape == (3, 1) and int(layer.params.size()) == np.unique(x).size
    np.testing.assert_allclose(pred[:2], model(x[:2]).numpy(), rtol=1e-6)


def test_fit_equals_a_dense_keras_embedding_holding_the_same_rows():
    vocab, dim = 6, 3
    # every id once in every batch of 2 (Keras' dense Adam squares duplicate rows apart)
    x = np.array([[0, 1, 2], [3, 4, 5], [5, 3, 1], [0, 4, 2]] * 2, np.int64)
    y = np.linspace(-1, 1, 8, dtype=np.float32)[:, None]
    layer = de.keras.layers.Embedding(dim, name=name(), num_shards=2)
    ours = model_with(layer)
    dense = model_with(keras.layers.Embedding(vocab, dim))
    dense.layers[1].embeddings.assign(layer.params.lookup(np.arange(vocab)))
    dense.layers[-1].set_weights(ours.layers[-1].get_weights())
    ours.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)), "mse")
    dense.compile(keras.optimizers.Adam(0.1), "mse")
    for m in (ours, dense):
        m.fit(x, y, batch_size=2, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(layer.params.lookup(np.arange(vocab)).numpy(),
                               dense.layers[1].embeddings.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.predict(x, verbose=0), dense.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", [None, "sum", "mean", "sqrtn"])
@pytest.mark.parametrize("with_unique", [True, False])
def test_combiners_reduce_the_last_id_axis(combiner, with_unique):
    layer = de.keras.layers.Embedding(3, combiner=combiner, with_unique=with_unique,
                                      name=name(), initializer=keras.initializers.RandomUniform(seed=1))
    ids = tf.constant([[[1, 2, 2, 9]], [[4, 4, 4, 4]]], tf.int64)       # (2, 1, 4)
    with tf.GradientTape() as tape:
        out = layer(ids)
        loss = tf.reduce_sum(out * tf.range(1.0, 4.0))
    rows = layer.params.lookup(ids).numpy()
    want = {None: rows, "sum": rows.sum(-2), "mean": rows.mean(-2),
            "sqrtn": rows.sum(-2) / 2.0}[combiner]
    assert out.shape == want.shape == layer.compute_output_shape(ids.shape)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    g, = tape.gradient(loss, [layer.handle])
    scale = {None: 1.0, "sum": 1.0, "mean": 0.25, "sqrtn": 0.5}[combiner]
    order = np.argsort(g.indices.numpy())
    np.testing.assert_array_equal(g.indices.numpy()[order], [1, 2, 4, 9])
    np.testing.assert_allclose(g.values.numpy()[order],
                               scale * np.array([[1], [2], [4], [1]]) * [1.0, 2.0, 3.0], rtol=1e-6)
    assert de.owner_of(layer.handle) is layer.params


def test_symbolic_model_with_combiner_trains():
    x, y = data(32)
    model = model_with(de.keras.layers.Embedding(4, combiner="mean", name=name()), combiner="mean")
    assert model.output_shape == (None, 1)
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), "mse")
    loss = model.fit(x, y, batch_size=8, epochs=3, verbose=0).history["loss"]
    assert loss[-1] < loss[0]


def test_plain_keras_optimizer_raises_at_the_first_step_and_trains_nothing():
    x, y = data(16)
    layer = de.keras.layers.Embedding(4, name=name())
    model = model_with(layer)
    model.compile(keras.optimizers.Adam(0.1), "mse")
    kernel = model.layers[-1].get_weights()[0].copy()
    with pytest.raises(TypeError, match="DynamicEmbeddingOptimizer"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert int(layer.params.size()) == 0
    np.testing.assert_array_equal(model.layers[-1].get_weights()[0], kernel)
    with pytest.raises(TypeError, match="DynamicEmbeddingOptimizer"):    # and in a custom loop
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x))
        keras.optimizers.SGD().apply_gradients(zip(tape.gradient(loss, [layer.handle]),
                                                   [layer.handle]))


def test_inference_mode_and_training_false_are_plain_reads(train_mode):
    layer = de.keras.layers.Embedding(2, name=name())
    ids = tf.constant([[3, 4]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids, training=False))
    assert tape.gradient(loss, layer.handle) is None
    de.enable_inference_mode()
    with tf.GradientTape() as tape:
        out = layer(ids, training=True)
        loss = tf.reduce_sum(out)
    assert tape.gradient(loss, layer.handle) is None
    model = model_with(layer)
    assert model.predict(ids.numpy().repeat(2, 0)[:, [0, 1, 1]], verbose=0).shape == (2, 1)
    assert int(layer.params.size()) == 0
    np.testing.assert_array_equal(out.numpy(), layer.params.lookup(ids).numpy())


def test_untrainable_layer_has_no_trainable_weights():
    layer = de.keras.layers.Embedding(2, name=name(), trainable=False)
    layer(tf.constant([1], tf.int64))
    assert layer.trainable_weights == [] and not layer.params.trainable


def test_config_round_trip_and_bad_arguments():
    layer = de.keras.layers.Embedding(5, combiner="sqrtn", name=name(), num_shards=2,
                                      restrict_policy=de.FrequencyRestrictPolicy,
                                      initializer=keras.initializers.RandomUniform(-1.0, 1.0, seed=4))
    config = layer.get_config()
    again = de.keras.layers.Embedding.from_config({**config, "name": name()})
    assert again.combiner == "sqrtn" and again.params.table.num_shards == 2
    assert isinstance(again.params.restrict_policy, de.FrequencyRestrictPolicy)
    assert again.params.initializer == layer.params.initializer
    with pytest.raises(ValueError, match="combiner"):
        de.keras.layers.Embedding(4, combiner="max")
    with pytest.raises(TypeError, match="embedding_size"):
        de.keras.layers.Embedding(4.0)
    with pytest.raises(ValueError, match="embedding_size"):
        de.keras.layers.Embedding(0)
    with pytest.raises(TypeError, match="int64 or int32"):
        de.keras.layers.Embedding(4)(tf.constant([1.0]))
    with pytest.raises(ValueError, match="rank >= 1"):
        de.keras.layers.Embedding(4, combiner="sum")(tf.constant(3, tf.int64))


# ---- tf.SparseTensor / tf.RaggedTensor inputs ------------------------------------------------
BAGS = [[1, 2, 2], [], [-5, 7], [9], [-5, 2**62, 1, 1]]     # an empty row; negative ids are keys


def dense_rows(layer, keys):
    return {k: layer.params.lookup(tf.constant([k], tf.int64)).numpy()[0] for k in keys}


def combined(layer, bags, combiner):
    """Oracle: numpy over the layer's rows (nothing pruned; an empty row gives zeros)."""
    rows = dense_rows(layer, {k for b in bags for k in b})
    out = []
    for b in bags:
        total = sum((rows[k] for k in b), np.zeros(layer.embedding_size, np.float32))
        n = {"sum": 1.0, "mean": len(b), "sqrtn": np.sqrt(len(b))}[combiner] if b else 1.0
        out.append(total / n)
    return np.array(out)


def as_input(kind, bags):
    rt = tf.ragged.constant(bags, tf.int64)
    return {"ragged": rt, "ragged-int32-splits": rt.with_row_splits_dtype(tf.int32),
            "sparse": rt.to_sparse()}[kind]


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("kind", ["sparse", "ragged", "ragged-int32-splits"])
@pytest.mark.parametrize("with_unique", [True, False])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_sparse_and_ragged_ids_combine_per_row(combiner, kind, with_unique, graph):
    layer = de.keras.layers.Embedding(3, combiner=combiner, with_unique=with_unique, name=name(),
                                      initializer=keras.initializers.RandomUniform(seed=2))
    ids = as_input(kind, BAGS)
    scale = tf.constant(np.random.default_rng(1).normal(size=(len(BAGS), 3)), tf.float32)

    def step(x):
        with tf.GradientTape() as tape:
            out = layer(x)
            loss = tf.reduce_sum(out * scale)
        return out, tape.gradient(loss, [layer.handle])[0]

    out, g = (tf.function(step) if graph else step)(ids)
    assert out.shape == (len(BAGS), 3)
    np.testing.assert_allclose(out.numpy(), combined(layer, BAGS, combiner), rtol=1e-5, atol=1e-6)
    # gradient: d loss / d row of key k = sum over bags holding k of scale[bag] / n(bag)
    want = {}
    for b, bag in enumerate(BAGS):
        n = {"sum": 1.0, "mean": len(bag), "sqrtn": np.sqrt(len(bag))}[combiner] if bag else 1.0
        for k in bag:
            want[k] = want.get(k, 0) + scale.numpy()[b] / n
    got = {}
    for k, row in zip(g.indices.numpy().tolist(), g.values.numpy()):
        got[k] = got.get(k, 0) + row
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    assert int(layer.params.size()) == 0


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_sparse_ids_equal_tf_safe_embedding_lookup_sparse(combiner):
    """With non-negative ids (which TF would not prune) the math is tf.nn's."""
    layer = de.keras.layers.Embedding(4, combiner=combiner, name=name(),
                                      initializer=keras.initializers.RandomNormal(seed=3))
    bags = [[3, 1, 1], [], [0, 7], [9]]
    dense = layer.params.lookup(tf.range(10, dtype=tf.int64)).numpy()
    for x in (as_input("sparse", bags), as_input("ragged", bags)):
        want = tf.nn.safe_embedding_lookup_sparse(dense, x, None, combiner).numpy()
        np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-5, atol=1e-6)


def test_sparse_and_ragged_shapes_without_combiner_and_higher_rank():
    plain = de.keras.layers.Embedding(2, name=name())
    rt = as_input("ragged", BAGS)
    out = plain(rt)
    assert isinstance(out, tf.RaggedTensor) and out.shape.as_list() == [len(BAGS), None, 2]
    np.testing.assert_array_equal(out.flat_values.numpy(), plain.params.lookup(rt.flat_values))
    with pytest.raises(ValueError, match="SparseTensor input needs a combiner"):
        plain(rt.to_sparse())
    summed = de.keras.layers.Embedding(2, combiner="sum", name=name())
    sp3 = tf.SparseTensor([[0, 0, 0], [0, 0, 1], [1, 1, 0]], tf.constant([4, 5, 6], tf.int64),
                          [2, 2, 3])                      # (2, 2, ids): one vector per (i, j)
    rows = dense_rows(summed, [4, 5, 6])
    want = np.zeros((2, 2, 2), np.float32)
    want[0, 0], want[1, 1] = rows[4] + rows[5], rows[6]
    np.testing.assert_allclose(summed(sp3).numpy(), want, rtol=1e-6)
    r3 = tf.ragged.constant([[[4, 5], []], [[6]]], tf.int64)
    out3 = summed(r3)
    assert isinstance(out3, tf.RaggedTensor) and out3.shape.as_list() == [2, None, 2]
    np.testing.assert_allclose(out3.flat_values.numpy(), [rows[4] + rows[5], [0, 0], rows[6]],
                               rtol=1e-6)
    with pytest.raises(TypeError, match="int64 or int32"):
        summed(tf.ragged.constant([[1.0]]))


def test_functional_model_with_sparse_and_ragged_inputs_fits_and_serves(tmp_path):
    sp_in = keras.Input((None,), sparse=True, dtype="int64", name="clicked")
    bag_in = keras.Input((None,), ragged=True, dtype="int64", name="bag")
    a = de.keras.layers.Embedding(4, combiner="mean", name=name())
    b = de.keras.layers.Embedding(4, combiner="sqrtn", name=name())
    ea, eb = a(sp_in), b(bag_in)
    assert ea.shape == eb.shape == (None, 4) and not eb.ragged
    head = keras.layers.Dense(1)(keras.layers.Concatenate()([ea, eb]))
    model = keras.Model([sp_in, bag_in], head)
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)), "mse")
    rng = np.random.default_rng(0)
    bags = [rng.integers(-30, 30, rng.integers(0, 5)).tolist() for _ in range(64)]
    y = np.array([[np.tanh(sum(bg) / 20.0)] for bg in bags], np.float32)
    rt = tf.ragged.constant(bags, tf.int64)
    ds = tf.data.Dataset.from_tensor_slices((rt, y)).batch(16).map(
        lambda r, t: ((r.to_sparse(), r), t))
    loss = model.fit(ds, epochs=4, shuffle=False, verbose=0).history["loss"]
    assert loss[-1] < loss[0]
    distinct = len({k for bg in bags for k in bg})
    assert int(a.params.size()) == int(b.params.size()) == distinct
    x = [tf.ragged.constant([[1, 2], [], [1000]], tf.int64).to_sparse(),
         tf.ragged.constant([[-3], [4, 4, -30], []], tf.int64)]
    live = model.predict(x, verbose=0)
    assert int(a.params.size()) == distinct                  # predict does not insert
    served = tf.saved_model.load(de.export_for_serving(model, str(tmp_path / "sm")))
    np.testing.assert_allclose(served.serve(x).numpy(), live, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="sparse input needs a combiner"):
        de.keras.layers.Embedding(4, name=name())(keras.Input((None,), sparse=True, dtype="int64"))
