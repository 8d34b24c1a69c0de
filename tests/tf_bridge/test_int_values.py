"""Integer value tables in TensorFlow (TFRA: id maps, counters): read and written,
never trained; checkpoints and the TF-only serving copy keep their values."""
import numpy as np
import pytest
import tensorflow as tf

import numbaemb as ne
import tf_bridge as de
from tf_bridge.serving import ServingTable

KEYS = tf.constant([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0, 7], tf.int64)


@pytest.mark.parametrize("dtype", [tf.int8, tf.int32, tf.int64])
def test_int_table_reads_writes_checkpoints_and_serves(dtype, tmp_path):
    v = de.Variable(dim=3, value_dtype=dtype, name=f"ints_{dtype.name}", initializer=-1)
    assert not v.trainable and v.trainable_variables == []
    vals = np.arange(12).reshape(4, 3).astype(dtype.as_numpy_dtype)
    v.upsert(KEYS[:4], vals)
    want = np.concatenate([vals, np.full((1, 3), -1)]).astype(dtype.as_numpy_dtype)
    for lookup in (de.embedding_lookup, tf.function(de.embedding_lookup),
                   tf.nn.embedding_lookup):
        got = lookup(v, KEYS)
        assert got.dtype == dtype and np.array_equal(got.numpy(), want)
    old, exists = v.lookup(KEYS, return_exists=True)
    v.accum(KEYS, old, old + 1, exists)                      # counters; 7 is inserted at 0
    counted = np.concatenate([vals + 1, np.zeros((1, 3))]).astype(dtype.as_numpy_dtype)
    assert np.array_equal(v.lookup(KEYS).numpy(), counted)
    path = tf.train.Checkpoint(v=v).save(str(tmp_path / "c"))
    w = de.Variable(dim=3, value_dtype=dtype, name=f"ints_{dtype.name}_2", initializer=-1,
                    num_shards=3)
    tf.train.Checkpoint(v=w).restore(path)
    assert np.array_equal(w.lookup(KEYS).numpy(), counted)
    served = ServingTable(v.table)(tf.concat([KEYS, tf.constant([12345], tf.int64)], 0))
    assert served.dtype == dtype
    assert np.array_equal(served.numpy(), np.concatenate([counted, np.full((1, 3), -1)]))


def test_int_tables_refuse_floats_overflow_and_training():
    v = de.Variable(dim=2, value_dtype=tf.int8, name="ints_bad")
    with pytest.raises(ne.DtypeError, match="integers"):
        v.upsert([1], [[1.5, 2.0]])
    with pytest.raises(ValueError, match="range"):
        v.upsert([1], tf.constant([[1000, 2]], tf.int32))
    with pytest.raises(ne.DtypeError, match="not trainable"):
        ne.optimizers.apply_gradients(v.table, ne.optimizers.SGD(0.1), np.array([1]),
                                      np.ones((1, 2), np.int8), step=1)
    assert int(v.size()) == 0
    with pytest.raises(ne.DtypeError, match="value_dtype"):
        de.Variable(dim=2, value_dtype=tf.uint8, name="ints_u8")
