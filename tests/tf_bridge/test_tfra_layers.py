"""TFRA's SquashedEmbedding, FieldWiseEmbedding and HvdAllToAllEmbedding: shapes and
values against numpy, training steps, config round trips, TFRA's docstring example."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de

L = de.keras.layers
EXTREME = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]


@keras.saving.register_keras_serializable(package="tests")
def mod3(ids):
    return tf.math.floormod(ids, 3)


@pytest.mark.parametrize("combiner", ["sum", "mean", "min", "max", "prod", "std"])
def test_squashed_reduces_all_but_the_batch_axis(combiner):
    layer = L.SquashedEmbedding(4, combiner=combiner, name=f"sq_{combiner}",
                                initializer=keras.initializers.RandomNormal(seed=3))
    ids = np.array([[15, 2], [4, EXTREME[0]], [EXTREME[1], -1]], np.int64)
    out = layer(tf.constant(ids)).numpy()
    rows = layer.params.lookup(tf.constant(ids)).numpy()
    want = getattr(np, {"std": "std"}.get(combiner, combiner))(rows, axis=1)
    assert out.shape == (3, 4) and np.allclose(out, want, atol=1e-6)
    one = layer(tf.constant([2, 7, 4], tf.int64)).numpy()
    assert one.shape == (4,)
    three = layer(tf.constant(np.arange(24).reshape(2, 3, 4), tf.int64))
    assert three.shape == (2, 4)


def test_squashed_trains_and_round_trips_its_config():
    layer = L.SquashedEmbedding(2, name="sq_train", initializer=1.0)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    ids = tf.constant([[3, 3], [5, EXTREME[0]]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids, training=True))
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_weights),
                            layer.trainable_weights))
    got = layer.params.lookup(tf.constant([3, 5, EXTREME[0]], tf.int64)).numpy()[:, 0]
    assert np.allclose(got, [1 - 0.5 * 2, 0.5, 0.5])          # 3 twice in the batch
    clone = L.SquashedEmbedding.from_config(layer.get_config())
    assert clone.squash == "sum" and clone.combiner is None
    with pytest.raises(ValueError, match="combiner"):
        L.SquashedEmbedding(2, combiner="sqrtn")
    with pytest.raises(TypeError, match="dense ids"):
        layer(tf.ragged.constant([[1], [2, 3]], tf.int64))


def test_field_wise_is_tfras_example():
    layer = L.FieldWiseEmbedding(2, 3, slot_map_fn=mod3, name="fw_doc",
                                 initializer=keras.initializers.Zeros())
    ids = tf.constant([[23, 12, 0], [9, 13, 10]], tf.int64)
    assert np.array_equal(layer(ids).numpy(), np.zeros((2, 3, 2)))
    layer.params.upsert(tf.range(0, 100, dtype=tf.int64), tf.ones((100, 2)))
    assert np.array_equal(layer(ids).numpy()[..., 0], [[2, 0, 1], [1, 2, 0]])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_field_wise_against_numpy_and_a_training_step(combiner):
    layer = L.FieldWiseEmbedding(3, 3, slot_map_fn=mod3, combiner=combiner, name=f"fw_{combiner}",
                                 initializer=keras.initializers.RandomUniform(seed=1))
    ids = np.array([[EXTREME[0], 4, 7, -1], [EXTREME[1], 0, 0, 5]], np.int64)
    out = layer(tf.constant(ids)).numpy()
    rows = layer.params.lookup(tf.constant(ids)).numpy()
    for b in range(2):
        for s in range(3):
            mask = np.mod(ids[b], 3) == s
            total = rows[b][mask].sum(0)
            n = mask.sum()
            want = total if combiner == "sum" else (
                total / max(n, 1) if combiner == "mean" else total / np.sqrt(max(n, 1)))
            assert np.allclose(out[b, s], want, atol=1e-6), (b, s)
    assert layer(tf.constant([5, 6], tf.int64)).shape == (2, 3, 3)      # (batch,) ids
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    before = layer.params.lookup(tf.constant([0], tf.int64)).numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant(ids), training=True))
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_weights),
                            layer.trainable_weights))
    after = layer.params.lookup(tf.constant([0], tf.int64)).numpy()
    step = {"sum": 2.0, "mean": 1.0, "sqrtn": 2 / np.sqrt(2)}[combiner]   # 0 twice in field 0
    assert np.allclose(before - after, step, atol=1e-6)


def test_field_wise_checks_and_saves(tmp_path):
    with pytest.raises(ValueError, match="slot_map_fn"):
        L.FieldWiseEmbedding(2, 3, slot_map_fn=None)
    with pytest.raises(ValueError, match="nslots"):
        L.FieldWiseEmbedding(2, 0, slot_map_fn=mod3)
    layer = L.FieldWiseEmbedding(2, 2, slot_map_fn=mod3, name="fw_bad")
    with pytest.raises(tf.errors.InvalidArgumentError, match="nslots"):
        layer(tf.constant([[2]], tf.int64))                          # field 2 of 2
    inp = keras.Input((3,), dtype="int64")
    fw = L.FieldWiseEmbedding(2, 3, slot_map_fn=mod3, name="fw_saved")
    model = keras.Model(inp, keras.layers.Flatten()(fw(inp)))
    x = np.array([[1, 2, EXTREME[0]], [EXTREME[1], 5, 6]], np.int64)
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    model.fit(x, np.ones((2, 6)), verbose=0)
    model.save(tmp_path / "fw.keras")
    loaded = keras.models.load_model(tmp_path / "fw.keras")
    assert np.allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_hvd_all_to_all_is_a_distributed_embedding():
    layer = L.HvdAllToAllEmbedding(embedding_size=3, name="hvd_a2a", mpi_size=1)
    assert layer.distributed and layer(tf.constant([[1, 2]], tf.int64)).shape == (1, 2, 3)
    assert L.HvdAllToAllEmbedding.from_config(layer.get_config()).distributed
    with pytest.raises(ValueError, match="mpi_size"):
        L.HvdAllToAllEmbedding(embedding_size=3, mpi_size=4)
    assert L.BasicEmbedding is L.Embedding
