"""Integer value tables (int8 / int32 / int64): id maps and counters, as TFRA's.

Every table op against a dict oracle, extreme keys; native checkpoints round trip into
another shard count; optimizers refuse them; floats are not silently truncated."""
import numpy as np
import pytest

import numbaemb as ne

EXTREME = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0], np.int64)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_int_table_ops_match_a_dict(dtype, tmp_path):
    info = np.iinfo(dtype)
    v = ne.Variable(3, value_dtype=dtype, initializer=-1, num_shards=2)
    oracle = {}
    rng = np.random.default_rng(1)
    for step in range(4):
        keys = np.concatenate([EXTREME, rng.integers(-20, 20, 8)])
        vals = rng.integers(info.min, info.max, (keys.size, 3), endpoint=True).astype(dtype)
        v.upsert(keys, vals)
        for k, row in zip(keys.tolist(), vals):
            oracle[k] = row.copy()                    # the last write of a repeated key wins
        got, exists = v.lookup(np.concatenate([keys, [12345]]), return_exists=True)
        assert got.dtype == dtype and not exists[-1] and np.all(got[-1] == -1)
        for k, row in zip(keys.tolist(), got[:-1]):
            assert np.array_equal(row, oracle[k])
        v.remove(keys[:2])
        for k in keys[:2].tolist():
            oracle.pop(k, None)
    counts = np.ones((2, 3), dtype)
    old, exists = v.lookup(EXTREME[2:], return_exists=True)
    v.accum(EXTREME[2:], old, old + counts, exists)            # counters: += 1
    for k in EXTREME[2:].tolist():
        oracle[k] = (oracle[k] + 1).astype(dtype)
    keys, values = v.export()
    assert values.dtype == dtype and {int(k) for k in keys} == set(oracle)
    v.save(tmp_path / "t")
    w = ne.Variable.load(tmp_path / "t", num_shards=3)
    assert w.value_dtype == dtype
    got = w.lookup(np.array(sorted(oracle)))
    assert np.array_equal(got, np.array([oracle[k] for k in sorted(oracle)]))


def test_int_tables_refuse_floats_overflow_and_optimizers():
    v = ne.Variable(2, value_dtype=np.int8)
    with pytest.raises(ne.DtypeError, match="integers"):
        v.upsert(np.array([1]), np.array([[1.5, 2.0]]))
    with pytest.raises(ValueError, match="range"):
        v.upsert(np.array([1]), np.array([[1000, 2]]))
    with pytest.raises(ne.DtypeError, match="not trainable"):
        ne.optimizers.apply_gradients(v, ne.optimizers.SGD(0.1), np.array([1]),
                                      np.ones((1, 2), np.int8), step=1)
    assert v.size() == 0
    with pytest.raises(ne.DtypeError, match="value_dtype"):
        ne.Variable(2, value_dtype=np.uint16)
