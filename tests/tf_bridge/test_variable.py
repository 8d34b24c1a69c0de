"""de.Variable: TFRA methods with TF in and out, eager and in tf.function; initializers;
bad input."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import numbaemb as ne
import tf_bridge as de
from tf_bridge.initializers import translate

_names = itertools.count()


def var(**kw):
    kw.setdefault("name", f"tv{next(_names)}")
    return de.Variable(**kw)


K = tf.keras.initializers


@pytest.mark.parametrize("tf_init, ne_init", [
    (None, ne.initializers.Zeros()),
    (K.Zeros(), ne.initializers.Zeros()),
    (K.Ones(), ne.initializers.Constant(1.0)),
    (K.Constant(0.25), ne.initializers.Constant(0.25)),
    (K.Constant([1.0, 2.0, 3.0]), ne.initializers.Constant([1.0, 2.0, 3.0])),
    (K.RandomNormal(0.5, 2.0, seed=7), ne.initializers.RandomNormal(0.5, 2.0, seed=7)),
    (K.RandomUniform(-1.0, 3.0, seed=8), ne.initializers.RandomUniform(-1.0, 3.0, seed=8)),
    (K.TruncatedNormal(0.0, 0.1, seed=9), ne.initializers.TruncatedNormal(0.0, 0.1, seed=9)),
    (K.RandomNormal(stddev=0.05), ne.initializers.RandomNormal(0.0, 0.05)),
    (tf.random_normal_initializer(1.0, 0.5, seed=3), ne.initializers.RandomNormal(1.0, 0.5, seed=3)),
    (tf.random_uniform_initializer(seed=4), ne.initializers.RandomUniform(seed=4)),
    (tf.constant_initializer(2.0), ne.initializers.Constant(2.0)),
    (tf.zeros_initializer(), ne.initializers.Zeros()),
    (1.5, ne.initializers.Constant(1.5)),
    (np.array([1.0, 2.0, 3.0]), ne.initializers.Constant([1.0, 2.0, 3.0])),
])
def test_initializers_translate_to_numbaemb(tf_init, ne_init):
    assert translate(tf_init) == ne_init
    v = var(dim=3, initializer=tf_init)
    oracle = ne.Variable(3, name=v.name, initializer=ne_init)
    keys = np.array([0, 5, -1, 2**62])
    np.testing.assert_array_equal(v.lookup(tf.constant(keys)).numpy(), oracle.lookup(keys))


def test_callable_initializer_gets_shape_of_missing_keys():
    shapes = []

    def init(shape, dtype=None):
        shapes.append((tuple(shape), dtype))
        return np.random.default_rng(len(shapes)).normal(size=shape)

    v = var(dim=2, initializer=init)
    v.upsert([1], [[9.0, 9.0]])
    e = v.lookup(tf.constant([[1, 4], [4, 6]], tf.int64)).numpy()
    assert shapes == [((2, 2), tf.float32)]            # one draw per distinct missing key
    np.testing.assert_array_equal(e[0, 0], [9.0, 9.0])
    np.testing.assert_array_equal(e[0, 1], e[1, 0])    # key 4 twice: one row
    glorot = var(dim=4, initializer=K.GlorotUniform(seed=1))
    assert glorot.lookup([1, 2, 3]).shape == (3, 4) and int(glorot.size()) == 0


def test_callable_initializer_rows_are_kept_for_the_optimizer_step():
    v = var(dim=3, initializer=lambda shape: np.random.normal(size=shape))
    ids = tf.constant([5, 6, 5], tf.int64)
    first = de.embedding_lookup(v, ids).numpy()
    np.testing.assert_array_equal(de.embedding_lookup(v, ids).numpy(), first)   # same rows
    assert int(v.size()) == 0
    v.insert_initial_values(ids)
    keys, values = v.export()
    assert sorted(keys.numpy().tolist()) == [5, 6]
    np.testing.assert_array_equal(v.lookup(ids).numpy(), first)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_methods_match_numbaemb(graph):
    v = var(dim=3, initializer=K.RandomUniform(seed=2), num_shards=2)
    oracle = ne.Variable(3, name=v.name, initializer=ne.initializers.RandomUniform(seed=2),
                         num_shards=2)
    run = tf.function if graph else (lambda f: f)
    keys = np.array([[1, -1], [2**63 - 1, 7]])
    vals = np.arange(12, dtype=np.float32).reshape(2, 2, 3)

    @run
    def step(k, x, ex):
        v.upsert(k, x)
        v.accum(k, x, x + 1.0, ex)
        v.remove(k[:, :1])
        rows, exists = v.lookup(k, return_exists=True)
        ek, ev = v.export()
        return rows, exists, v.size(), ek, ev

    ex = np.array([[True, False], [True, True]])
    rows, exists, size, ek, ev = step(tf.constant(keys), tf.constant(vals), tf.constant(ex))
    oracle.upsert(keys, vals)
    oracle.accum(keys, vals, vals + 1.0, ex)
    oracle.remove(keys[:, :1])
    want_rows, want_exists = oracle.lookup(keys, return_exists=True)
    np.testing.assert_array_equal(rows.numpy(), want_rows)
    np.testing.assert_array_equal(exists.numpy(), want_exists)
    assert int(size) == oracle.size() == 2 and int(v.size(1)) == oracle.size(1)
    ok, ov = oracle.export()
    order = np.argsort(ek.numpy())
    np.testing.assert_array_equal(ek.numpy()[order], np.sort(ok))
    np.testing.assert_array_equal(ev.numpy()[order], ov[np.argsort(ok)])
    run(lambda: v.clear())()
    assert int(v.size()) == 0


@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3, 4)])
def test_keys_of_any_shape(shape):
    v = var(dim=2, initializer=K.RandomNormal(seed=1))
    keys = np.arange(int(np.prod(shape))).reshape(shape)
    want = v.table.lookup(keys)
    assert v.lookup(tf.constant(keys, tf.int64)).shape == shape + (2,)
    got = tf.function(v.lookup)(tf.constant(keys, tf.int64))
    np.testing.assert_array_equal(got.numpy(), want)


def test_int32_ids_and_int32_table():
    v = var(dim=2, initializer=1.0)
    np.testing.assert_array_equal(v.lookup(tf.constant([3], tf.int32)).numpy(), [[1.0, 1.0]])
    v32 = var(dim=2, key_dtype=tf.int32)
    v32.upsert(tf.constant([7], tf.int64), [[2.0, 2.0]])     # int64 keys that fit are fine
    assert v32.export()[0].dtype == tf.int32
    with pytest.raises(ValueError, match="keys"):
        v32.lookup(tf.constant([2**40], tf.int64))


def test_get_variable_registry():
    a = de.get_variable("gv_same", dim=4, initializer=K.RandomNormal(stddev=0.1))
    assert de.get_variable("gv_same", dim=4, initializer=K.RandomNormal(stddev=0.1)) is a
    with pytest.raises(ValueError, match="dim"):
        de.get_variable("gv_same", dim=5)


@pytest.mark.parametrize("keys", [tf.constant([1.0]), tf.constant(["a"]), tf.constant([True]),
                                  [1.5], np.array([1], np.uint64)])
def test_bad_keys_raise_type_error_naming_keys(keys):
    v = var(dim=2)
    for call in (lambda: v.lookup(keys), lambda: v.upsert(keys, [[1.0, 1.0]]),
                 lambda: v.remove(keys)):
        with pytest.raises(TypeError, match="keys"):
            call()


def test_bad_values_and_shapes_apply_nothing():
    v = var(dim=2)
    v.upsert([1, 2], tf.ones([2, 2]))
    with pytest.raises(ValueError, match="values"):
        v.upsert([3, 4], tf.ones([3, 2]))
    with pytest.raises(ValueError, match="values"):
        v.upsert([3, 4], tf.ones([2, 3]))
    with pytest.raises(TypeError, match="values"):
        v.upsert([3], tf.constant([["a", "b"]]))
    with pytest.raises(TypeError, match="exists"):
        v.accum([3], [[0.0, 0.0]], [[1.0, 1.0]], [1])
    with pytest.raises(ValueError, match="exists"):
        v.accum([3], [[0.0, 0.0]], [[1.0, 1.0]], [True, False])
    with pytest.raises(TypeError, match="keys"):       # at trace time inside tf.function
        tf.function(lambda k: v.upsert(k, tf.ones([1, 2])))(tf.constant([1.0]))
    assert int(v.size()) == 2
    np.testing.assert_array_equal(v.lookup([1, 2]).numpy(), np.ones((2, 2)))


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="key_dtype"):
        var(key_dtype=tf.float32)
    with pytest.raises(TypeError, match="value_dtype"):
        var(value_dtype=tf.uint16)
    with pytest.raises(ValueError, match="dim"):
        var(dim=0)
    with pytest.raises(ValueError, match="kv_creator"):
        var(kv_creator=object())
    with pytest.raises(TypeError, match="initializer"):
        var(initializer="zeros")


# ---- a plain Keras optimizer on a dynamic variable: a clear TypeError, nothing changed -------
@pytest.mark.parametrize("make_opt", [lambda: tf.keras.optimizers.SGD(0.5),
                                      lambda: tf.keras.optimizers.SGD(0.5, momentum=0.9),
                                      lambda: tf.keras.optimizers.Adam(0.5)],
                         ids=["SGD", "SGD-momentum", "Adam"])
@pytest.mark.parametrize("target", ["variable", "trainable_handle"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_plain_keras_optimizer_raises_clear_type_error(make_opt, target, graph):
    v = var(dim=2, initializer=1.0)
    v.upsert([0], [[5.0, 5.0]])
    ids = tf.constant([0, 0, 3], tf.int64)        # id 0 is row 0 of the (1, dim) handle too
    source = v if target == "variable" else v.trainable_handle
    opt = make_opt()

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(de.embedding_lookup(v, ids))
        grads = tape.gradient(loss, [source])
        opt.apply_gradients(zip(grads, [source]))

    with pytest.raises(TypeError, match=rf"de\.Variable '{v.name}'.*DynamicEmbeddingOptimizer"):
        (tf.function(step) if graph else step)()
    assert int(v.size()) == 1 and int(opt.iterations) == 0
    np.testing.assert_array_equal(v.lookup([0]).numpy(), [[5.0, 5.0]])
    np.testing.assert_array_equal(v.trainable_handle.numpy(), np.zeros((1, 2)))   # not scattered
    wrapped = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))          # the remedy
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(v, ids))
    wrapped.apply_gradients(zip(tape.gradient(loss, [source]), [source]))
    np.testing.assert_array_equal(v.lookup([0, 3]).numpy(), [[4.0, 4.0], [0.5, 0.5]])


def test_trainable_handle_is_a_resource_variable_that_refuses_overwrite():
    v = var(dim=3)
    h = v.trainable_handle
    assert isinstance(h, tf.Variable) and h.shape == (1, 3) and h.trainable
    assert de.owner_of(h) is v and v.trainable_variables == [h]
    np.testing.assert_array_equal(h.value().numpy(), np.zeros((1, 3)))
    h.overwrite_with_gradient = False                  # what Keras' add_weight sets
    with pytest.raises(ValueError, match="overwrite_with_gradient"):
        h.overwrite_with_gradient = True
    with pytest.raises(TypeError, match="DynamicEmbeddingOptimizer"):
        h.overwrite_with_gradient
    assert not var(dim=3, trainable=False).trainable_handle.trainable
