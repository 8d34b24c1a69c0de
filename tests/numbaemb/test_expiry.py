"""steps_to_live and the L2-norm threshold against an oracle of last-update steps and
row norms (extreme keys in play; a checkpoint in the middle keeps the steps)."""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb import optimizers as O
from numbaemb.expiry import expire, prune_small

I64 = np.iinfo(np.int64)
EXTREME = np.array([I64.min, I64.max, -1, 0], np.int64)


def test_expire_removes_exactly_the_stale_keys(tmp_path):
    v = ne.Variable(2, steps_to_live=3, num_shards=3)
    last = {}                               # key -> step of its last update (0: none)
    rng = np.random.default_rng(4)
    v.upsert(EXTREME[:2], np.ones((2, 2)))  # never trained: step 0
    last.update({int(k): 0 for k in EXTREME[:2]})
    for step in range(1, 16):
        ids = np.concatenate([rng.choice(EXTREME, 1), rng.integers(-8, 8, 4)])
        O.apply_gradients(v, O.Adam(0.1), ids, np.ones((ids.size, 2)), step=step)
        last.update({int(k): step for k in ids})
        if step == 8:
            v.save(tmp_path / "t.nbe")
            v = ne.Variable.load(tmp_path / "t.nbe", num_shards=2)
            assert v.steps_to_live == 3 and v._last_step == 8
        if step % 4 == 0 or step == 15:
            removed = expire(v)
            stale = {k for k, s in last.items() if s <= step - 3}
            assert removed == len(stale)
            for k in stale:
                del last[k]
        assert sorted(v.export()[0].tolist()) == sorted(last)
    expire(v, step=100)                      # an explicit step: everything is stale
    assert v.size() == 0


@pytest.mark.parametrize("value_dtype", [np.float32, np.float16])
def test_prune_small_rows_by_l2_norm(value_dtype):
    v = ne.Variable(3, value_dtype=value_dtype)
    rng = np.random.default_rng(5)
    keys = np.concatenate([EXTREME, np.arange(1, 21)])
    rows = (rng.standard_normal((keys.size, 3)) * rng.uniform(0, 2, (keys.size, 1)))
    v.upsert(keys, rows)
    stored = v.lookup(keys).astype(np.float64)
    norms = np.sqrt((stored ** 2).sum(1))
    removed = prune_small(v, 1.0)
    assert removed == int((norms < 1.0).sum())
    assert sorted(v.export()[0].tolist()) == sorted(keys[norms >= 1.0].tolist())


def test_string_tables_forget_the_names_of_expired_keys():
    v = ne.Variable(2, key_dtype="string", steps_to_live=1)
    O.apply_gradients(v, O.SGD(0.1), np.array([b"old"], object), np.ones((1, 2)), step=1)
    O.apply_gradients(v, O.SGD(0.1), np.array([b"new"], object), np.ones((1, 2)), step=2)
    assert expire(v) == 1 and v.export()[0].tolist() == [b"new"] and len(v.names) == 1


def test_bad_expiry_arguments():
    with pytest.raises(ValueError, match="steps_to_live"):
        expire(ne.Variable(2))
    with pytest.raises(ValueError, match="steps_to_live must be >= 1"):
        ne.Variable(2, steps_to_live=0)
    with pytest.raises(ValueError, match="min_norm"):
        prune_small(ne.Variable(2), -1.0)
