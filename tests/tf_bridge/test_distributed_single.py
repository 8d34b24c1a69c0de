"""``tf_bridge.distributed`` in one process (no mpiexec): Horovod's names work with a
world of one, and collective calls are chained in program order inside graphs."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de
from tf_bridge import distributed as hvd
from tf_bridge.dlpack import numpy_call


def test_world_of_one():
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    assert hvd.comm() is None and not hvd.mpi_enabled()
    x = tf.constant([[1.0, 2.0]])
    assert np.array_equal(hvd.allreduce(x).numpy(), x.numpy())
    assert np.array_equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0).numpy(), 2 * x.numpy())
    assert np.array_equal(hvd.allgather(x).numpy(), x.numpy())
    assert np.array_equal(hvd.broadcast(x, 0).numpy(), x.numpy())
    assert hvd.broadcast_object([1], 0) == [1] and hvd.allgather_object(3) == [3]
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(x, 1)


def test_distributed_table_in_one_process_is_a_plain_table():
    v = de.Variable(dim=2, name="single_dist", initializer=1.0, distributed=True)
    assert not v.distributed and type(v.table).__name__ == "Variable"
    layer = de.keras.layers.Embedding(3, name="single_dist_layer", distributed=True)
    assert layer.get_config()["distributed"] is True
    assert type(layer).from_config(layer.get_config()).distributed


def test_distributed_table_limits_hold_in_one_process():
    with pytest.raises(TypeError, match="depend on the key only"):
        de.Variable(dim=2, name="dist_glorot", distributed=True,
                    initializer=keras.initializers.GlorotUniform())
    v = de.Variable(dim=2, name="dist_policy", distributed=True,
                    restrict_policy=de.TimestampRestrictPolicy)   # split tables take them
    assert v.restrict_policy is not None and not v.distributed
    with pytest.raises(TypeError, match="distributed must be a bool"):
        de.Variable(dim=2, name="dist_str", distributed="yes")


def test_tape_and_optimizer_in_one_process_train_as_usual():
    v = de.Variable(dim=2, name="single_tape", initializer=1.0)
    w = tf.Variable([1.0, 1.0])
    opt = hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5)))
    assert isinstance(opt, de.DynamicEmbeddingOptimizer)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(v, tf.constant([3, 3], tf.int64))) + \
            tf.reduce_sum(w * w)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, [v, w])
    opt.apply_gradients(zip(grads, [v, w]))
    assert v.lookup(tf.constant([3], tf.int64)).numpy().tolist() == [[0.0, 0.0]]
    assert np.allclose(w.numpy(), 0.0)


def _three_calls(a, b):
    x = numpy_call(lambda a: (a + 1,), [a], [tf.float32], name="first", collective=True)[0]
    plain = numpy_call(lambda b: (b * 2,), [b], [tf.float32], name="plain")[0]
    y = numpy_call(lambda b: (b + 1,), [b], [tf.float32], name="second", collective=True)[0]
    z = numpy_call(lambda: (), [], [], name="third", collective=True)
    with tf.control_dependencies([z]):
        return x + y + plain


def test_collective_calls_wait_on_each_other_in_program_order():
    """Independent collective numpy calls in one graph get a chain of control edges.
    (Inside tf.function, TF's automatic control dependencies chain every stateful op
    as well; a TF1 graph has only ours.)"""
    f = tf.function(_three_calls)
    assert f(tf.constant(1.0), tf.constant(2.0)).numpy() == 2.0 + 3.0 + 4.0
    graphs = [f.get_concrete_function(tf.TensorSpec([]), tf.TensorSpec([])).graph]
    with tf.Graph().as_default() as g:
        out = _three_calls(tf.constant(1.0), tf.constant(2.0))
        with tf.compat.v1.Session(graph=g) as sess:
            assert sess.run(out) == 9.0
    graphs.append(g)
    for graph in graphs:
        ops = {op.name: op for op in graph.get_operations()}
        assert ops["first"] in ops["second"].control_inputs
        assert ops["second"] in ops["third"].control_inputs
        assert not ops["first"].control_inputs
    assert not ops["plain"].control_inputs          # the TF1 graph: only collectives chained


def test_all2all_limits_in_one_process():
    layer = de.sok.All2AllDenseEmbedding(2, 3, dynamic_input=True, use_hashtable=False,
                                         name="single_sok")
    assert layer.params.key_range == (0, 2) and layer.params.max_keys == 2
    with pytest.raises(ValueError, match=r"keys must be in \[0, 2\)"):
        layer(tf.constant([0, 2], tf.int64))
    bounded = de.sok.All2AllDenseEmbedding(2, 3, dynamic_input=True, name="single_sok_cap")
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(bounded(tf.constant([7, 8, 9], tf.int64), training=True))
    grads = tape.gradient(loss, bounded.trainable_weights)
    with pytest.raises(ValueError, match="over its capacity of 2 keys"):
        opt.apply_gradients(zip(grads, bounded.trainable_weights))
    assert int(bounded.params.size()) == 0


def test_save_model_and_load_model_in_one_process(tmp_path):
    """hvd.save_model / hvd.load_model with a world of one; the saved optimizer is the
    plain one (keras.models.load_model needs nothing of tf_bridge.distributed)."""
    ids = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(3, name="single_save_emb", combiner="sum", distributed=True,
                                    initializer=keras.initializers.RandomNormal(0, 0.1, seed=3))
    model = keras.Model(ids, keras.layers.Dense(1)(emb(ids)))
    opt = hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)))
    assert type(opt) is de.DynamicEmbeddingOptimizer
    model.compile(opt, loss="mse")
    x = np.array([[1, 2], [np.iinfo(np.int64).min, np.iinfo(np.int64).max]], np.int64)
    model.fit(x, np.ones((2, 1)), verbose=0)
    path = str(tmp_path / "m.keras")
    hvd.save_model(model, path)
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is de.DynamicEmbeddingOptimizer
    assert not hasattr(plain.optimizer, "_hvd_settings")
    loaded = hvd.load_model(path)
    assert loaded.optimizer._hvd_settings["op"] == hvd.Average
    assert int(loaded.optimizer.iterations) == 1
    for m in (model, loaded):
        m.fit(x, np.zeros((2, 1)), verbose=0)
    assert np.allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match="suffix|extension|.keras"):
        hvd.save_model(model, str(tmp_path / "m.h6"))
