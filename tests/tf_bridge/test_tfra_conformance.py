"""Forms TFRA users pass, as TFRA's own tests use them: one-element default values,
TF1 initializers, error types, TFRA's argument names, lists as params, negative ids."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import numbaemb as ne
import tf_bridge as de

KEYS = tf.constant([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0, -100], tf.int64)


@pytest.mark.parametrize("init", [np.array([-1]), -1, [-1.0], tf.constant([-1.0]),
                                  tf.constant(-1.0)], ids=["array", "int", "list", "tensor",
                                                          "scalar-tensor"])
def test_a_one_element_default_fills_the_row(init):
    v = de.get_variable("tfra_default", dim=8, initializer=init)
    assert np.array_equal(v.lookup(KEYS).numpy(), np.full((5, 8), -1.0, np.float32))


@pytest.mark.parametrize("make", [
    lambda: tf.compat.v1.random_uniform_initializer(),
    lambda: tf.compat.v1.random_uniform_initializer(-2.0, 3.0, seed=7),
    lambda: tf.compat.v1.random_normal_initializer(),
    lambda: tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1),
    lambda: tf.compat.v1.constant_initializer(0.5),
    lambda: tf.compat.v1.zeros_initializer(),
    lambda: tf.compat.v1.ones_initializer()])
def test_tf1_initializers_translate_with_and_without_seed(make):
    """Per-key rows: the same key gives the same row in another table of the same name
    (a restarted job), an unseeded initializer included."""
    a = de.Variable(dim=4, name="tfra_tf1", initializer=make())
    b = de.Variable(dim=4, name="tfra_tf1", initializer=make())
    rows = a.lookup(KEYS).numpy()
    assert np.array_equal(rows, b.lookup(KEYS).numpy())
    assert isinstance(a.initializer, ne.initializers.Initializer)
    cfg = make().get_config()
    if "maxval" in cfg:
        lo, hi = cfg["minval"], 1.0 if cfg["maxval"] is None else cfg["maxval"]
        assert rows.min() >= lo and rows.max() < hi and len(np.unique(rows)) == rows.size


def test_bad_key_dtypes_raise_an_error_that_is_both_type_and_value_error():
    v = de.Variable(dim=2, name="tfra_errors")
    calls = [lambda: v.lookup(tf.constant([1.5])), lambda: v.upsert([1.5], [[1.0, 2.0]]),
             lambda: v.remove(tf.constant(["a"])),
             lambda: de.embedding_lookup(v, tf.constant([1.0])),
             lambda: tf.function(lambda x: de.embedding_lookup(v, x))(tf.constant([1.0])),
             lambda: ne.Variable(2).lookup(np.array([1.5])),
             lambda: de.Variable(dim=2, value_dtype=tf.string),
             lambda: v.upsert(tf.constant([1], tf.int64), tf.constant([["a", "b"]]))]
    for call in calls:
        with pytest.raises(ValueError) as got:
            call()
        assert isinstance(got.value, TypeError) and isinstance(got.value, ne.DtypeError)
    assert int(v.size()) == 0


def test_tfra_argument_names_and_forms():
    def rows_allocated(layer):
        return sum(s.columns["values"].data.shape[0] for s in layer.params.table.shards)

    tfra = de.keras.layers.Embedding(4, name="tfra_capacity", init_capacity=5000)
    ours = de.keras.layers.Embedding(4, name="tfra_size", init_size=5000)
    plain = de.keras.layers.Embedding(4, name="tfra_plain")
    assert rows_allocated(tfra) == rows_allocated(ours) >= 5000 > rows_allocated(plain)
    with pytest.raises(ValueError, match="not both"):
        de.keras.layers.Embedding(4, name="tfra_both", init_capacity=64, init_size=32)
    v = de.Variable(dim=3, name="tfra_list", initializer=2.0)
    assert np.array_equal(de.embedding_lookup([v], KEYS), de.embedding_lookup(v, KEYS))


def test_safe_lookup_treats_negative_ids_as_keys():
    """TFRA looks -100 up as an ordinary key; tf.nn would prune it (a dense table's
    invalid row).  Weights <= 0 are still pruned for combiners other than sum."""
    v = de.Variable(dim=2, name="tfra_negative",
                    initializer=keras.initializers.RandomNormal(seed=2))
    sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([-100, 3, -1], tf.int64), [2, 2])
    rows = v.lookup(tf.constant([-100, 3, -1], tf.int64)).numpy()
    got = de.safe_embedding_lookup_sparse(v, sp, None, combiner="sum").numpy()
    assert np.allclose(got, [rows[0] + rows[1], rows[2]])
    w = tf.SparseTensor(sp.indices, [1.0, 0.0, 2.0], sp.dense_shape)
    got = de.safe_embedding_lookup_sparse(v, sp, w, combiner="mean").numpy()
    assert np.allclose(got, [rows[0], rows[2]])                 # 3 pruned: weight 0


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, tf.string], ids=lambda d: d.name)
@pytest.mark.parametrize("value_dtype", [tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                                         tf.float32, tf.float64], ids=lambda d: d.name)
def test_every_key_and_value_dtype_pair(key_dtype, value_dtype):
    """TFRA's variable test loop: every key dtype with every value dtype, as TFRA's
    tests write them (keys and values built with tf.constant / tf.cast)."""
    raw = [0, 1, -1, 2 ** 30, -(2 ** 30)]
    keys = (tf.constant([b"%d" % k for k in raw]) if key_dtype == tf.string
            else tf.constant(raw, key_dtype))
    values = tf.cast(tf.reshape(tf.range(10), [5, 2]) - 4, value_dtype)
    v = de.get_variable(f"tfra_pair_{key_dtype.name}_{value_dtype.name}", key_dtype,
                        value_dtype, dim=2, initializer=-1)
    v.upsert(keys, values)
    got = v.lookup(keys)
    assert got.dtype == value_dtype
    assert np.array_equal(tf.cast(got, tf.float64).numpy(), tf.cast(values, tf.float64).numpy())
    v.remove(keys[:2])
    got, exists = v.lookup(keys, return_exists=True)
    assert exists.numpy().tolist() == [False, False, True, True, True]
    assert np.all(tf.cast(got[:2], tf.float64).numpy() == -1)
    k, x = v.export()
    assert int(v.size()) == 3 and k.dtype == key_dtype and x.dtype == value_dtype
