"""Checkpoints of dynamic tables: table_state, tf.train.Checkpoint, Keras .keras files.

Everything round-trips with its optimizer slots and policy columns, N -> M shards;
the oracle is the saved table's own export (keys sorted)."""
import itertools
import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numbaemb as ne  # noqa: E402
import tf_bridge as de  # noqa: E402
from tf_bridge.checkpoint import (KerasTableSaving, restore_table_state,  # noqa: E402
                                  table_state)

I64 = np.iinfo(np.int64)
EXTREMES = np.array([I64.min, I64.max, -1, 0], np.int64)
_names = itertools.count()


def var(**kw):
    kw.setdefault("name", f"ckv{next(_names)}")
    kw.setdefault("initializer", keras.initializers.RandomNormal(stddev=0.1, seed=4))
    return de.Variable(**kw)


def train(v, keys, seed=0, opt=ne.optimizers.Adam(learning_rate=0.1)):
    """Two optimizer steps (slot columns appear) and a policy score column."""
    table = v.table if isinstance(v, de.Variable) else v
    rng = np.random.default_rng(seed)
    for step in (1, 2):
        grads = rng.standard_normal(keys.shape + (table.dim,)).astype(table.value_dtype)
        ne.optimizers.apply_gradients(table, opt, keys, grads, step=step)
    policy = ne.policies.FrequencyRestrictPolicy(table)
    policy.update(keys[: keys.size // 2])
    return opt


def sorted_state(v):
    s = table_state(v)
    meta = json.loads(s["columns"])
    order = np.argsort(s["keys"], kind="stable")
    cols = {c["name"]: (c["dtype"], c["width"]) for c in meta["columns"]}
    return s["keys"][order], s["values"][order], s["column_bytes"][order], cols


def assert_same_table(a, b):
    ka, va, ca, ma = sorted_state(a)
    kb, vb, cb, mb = sorted_state(b)
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(va, vb)
    assert ma == mb
    if ma:                              # same layout: the byte rows must agree
        np.testing.assert_array_equal(ca, cb)


# ---- table_state -------------------------------------------------------------------------
@pytest.mark.parametrize("n_from, n_to, key_dtype", [(1, 3, np.int64), (4, 2, np.int64),
                                                     (3, 3, np.int32), (2, 1, np.int32)])
def test_table_state_roundtrip_with_slots_n_to_m(n_from, n_to, key_dtype):
    info = np.iinfo(key_dtype)
    keys = np.concatenate([[info.min, info.max, -1, 0],
                           np.random.default_rng(1).integers(info.min, info.max, 300)]).astype(key_dtype)
    a = ne.Variable(3, key_dtype=key_dtype, num_shards=n_from, name="t",
                    initializer=ne.initializers.RandomUniform(seed=2))
    opt = train(a, keys)
    b = ne.Variable(3, key_dtype=key_dtype, num_shards=n_to, name="t",
                    initializer=ne.initializers.RandomUniform(seed=2))
    b.upsert(np.array([123456], key_dtype), np.ones((1, 3)))     # stale content is replaced
    restore_table_state(b, table_state(a))
    assert b.size() == a.size() == np.unique(keys).size
    assert sum(b.size(i) for i in range(n_to)) == b.size()
    assert_same_table(a, b)
    probe = np.concatenate([keys[:50], np.array([7, 123456], key_dtype)])
    np.testing.assert_array_equal(b.lookup(probe), a.lookup(probe))
    for slot in ("m", "v"):
        np.testing.assert_array_equal(ne.optimizers.slot_values(b, opt, slot, probe),
                                      ne.optimizers.slot_values(a, opt, slot, probe))
    np.testing.assert_array_equal(b.export("policy/frequency")[1].sum(),
                                  a.export("policy/frequency")[1].sum())
    # keys are where the restoring table's partitioner puts them
    for i, shard in enumerate(b.shards):
        k, _ = shard.export()
        assert (ne.default_partitioner(k, n_to) == i).all()


def test_empty_table_and_existing_columns_without_saved_rows():
    a = ne.Variable(2)
    b = ne.Variable(2, num_shards=2)
    train(b, np.arange(10))                                  # b has slots, a has none
    restore_table_state(b, table_state(a))
    assert b.size() == 0
    b.upsert(np.array([4]), np.ones((1, 2)))                 # slots start from their init
    s = table_state(b)
    assert s["column_bytes"].shape[0] == 1 and not s["column_bytes"].any()


def test_bad_state_is_rejected_and_changes_nothing():
    a = var(dim=2)
    a.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    state = table_state(a)
    b = var(dim=2)
    b.upsert(tf.constant([9], tf.int64), tf.ones([1, 2]))
    with pytest.raises(ValueError, match="dim 2.*dim 3"):
        restore_table_state(var(dim=3), state)
    with pytest.raises(ValueError, match="value_dtype"):
        restore_table_state(var(dim=2, value_dtype=tf.float64), state)
    with pytest.raises(ValueError, match="duplicate"):
        restore_table_state(b, dict(state, keys=np.array([1, 1], np.int64)))
    with pytest.raises(ValueError, match="column_bytes"):
        restore_table_state(b, dict(state, column_bytes=np.zeros((2, 3), np.uint8)))
    with pytest.raises(ValueError, match="values must have shape"):
        restore_table_state(b, dict(state, values=np.zeros((1, 2), np.float32)))
    with pytest.raises(ValueError, match="JSON"):
        restore_table_state(b, dict(state, columns="{not json"))
    with pytest.raises(ValueError, match="key dtype int32"):
        big = dict(state, keys=np.array([1, 2**40], np.int64))
        restore_table_state(var(dim=2, key_dtype=tf.int32), big)
    with pytest.raises(ValueError, match="must be a dict"):
        restore_table_state(b, [1, 2])
    with pytest.raises(TypeError, match="tf_bridge.Variable or a numbaemb.Variable"):
        table_state(object())
    np.testing.assert_array_equal(b.export()[0].numpy(), [9])


# ---- tf.train.Checkpoint -------------------------------------------------------------------
@pytest.mark.parametrize("n_from, n_to", [(3, 2), (1, 4)])
def test_tf_train_checkpoint_restores_slots_into_fresh_variable(tmp_path, n_from, n_to):
    keys = np.concatenate([EXTREMES, np.arange(1, 200) * 7919])
    a = var(dim=4, num_shards=n_from, name="user")
    opt = train(a, keys)
    dense = tf.Variable([1.0, 2.0])
    path = tf.train.Checkpoint(emb=a, dense=dense).save(str(tmp_path / "ckpt"))
    names = dict(tf.train.list_variables(path))
    assert names["emb/.ATTRIBUTES/keys"] == [keys.size]
    assert names["emb/.ATTRIBUTES/values"] == [keys.size, 4]
    assert names["emb/.ATTRIBUTES/column_bytes"] == [keys.size, 2 * 4 * 4 + 8]   # m, v, freq

    b = var(dim=4, num_shards=n_to, name="user")             # fresh: no slot columns yet
    b.upsert(tf.constant([5], tf.int64), tf.ones([1, 4]))
    dense2 = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(emb=b, dense=dense2).restore(path).assert_consumed()
    assert_same_table(a, b)
    assert b.table.num_shards == n_to
    np.testing.assert_array_equal(dense2.numpy(), [1.0, 2.0])
    ids = tf.constant(np.concatenate([keys[:20], [5, 6]]), tf.int64)
    np.testing.assert_array_equal(b.lookup(ids).numpy(), a.lookup(ids).numpy())
    np.testing.assert_array_equal(ne.optimizers.slot_values(b.table, opt, "v", ids.numpy()),
                                  ne.optimizers.slot_values(a.table, opt, "v", ids.numpy()))


def build_model(shards):
    """de.keras.layers.Embedding (Adam slots + timestamp scores in its table) -> Dense."""
    ids = keras.Input((3,), dtype="int64", name="ids")
    emb = de.keras.layers.Embedding(4, combiner="mean", name="user", num_shards=shards,
                                    restrict_policy=de.TimestampRestrictPolicy,
                                    initializer=keras.initializers.RandomNormal(seed=1))
    model = keras.Model(ids, keras.layers.Dense(1, name="head")(emb(ids)))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)), "mse")
    return model


_rng = np.random.default_rng(0)
BATCHES = [(_rng.integers(-10, 20, (8, 3)), _rng.standard_normal((8, 1)).astype(np.float32))
           for _ in range(4)]


@pytest.mark.parametrize("how", ["tf.train.Checkpoint", ".keras"])
def test_resumed_training_equals_uninterrupted(tmp_path, how):
    """Save after 2 steps, restore (3 -> 2 shards for tf.train.Checkpoint), train 2 more:
    table rows, Adam slots, timestamps and dense weights equal the run that never stopped."""
    keras.utils.set_random_seed(0)
    model = build_model(3)
    for x, y in BATCHES[:2]:
        model.train_on_batch(x, y)
    if how == ".keras":
        model.save(tmp_path / "m.keras")
    else:
        path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
            str(tmp_path / "ckpt"))
    saved = sorted_state(model.get_layer("user").params)
    for x, y in BATCHES[2:]:
        model.train_on_batch(x, y)

    if how == ".keras":
        resumed = keras.models.load_model(tmp_path / "m.keras")
    else:
        keras.utils.set_random_seed(1)                      # other dense initial weights
        resumed = build_model(2)
        resumed.optimizer.build(resumed.trainable_variables)
        tf.train.Checkpoint(model=resumed, optimizer=resumed.optimizer).restore(
            path).assert_existing_objects_matched()
        assert resumed.get_layer("user").params.table.num_shards == 2
    table = resumed.get_layer("user").params
    assert table is not model.get_layer("user").params
    got = sorted_state(table)
    assert got[3] == saved[3] and {"Adam/m", "Adam/v", "policy/timestamp"} <= set(got[3])
    for a, b in zip(got[:3], saved[:3]):
        np.testing.assert_array_equal(a, b)
    assert int(resumed.optimizer.iterations) == 2
    for x, y in BATCHES[2:]:
        resumed.train_on_batch(x, y)
    assert_same_table(table, model.get_layer("user").params)
    np.testing.assert_array_equal(resumed.get_layer("head").kernel.numpy(),
                                  model.get_layer("head").kernel.numpy())


def test_keras_layer_mixin_saves_every_table_attribute(tmp_path):
    class Two(KerasTableSaving, keras.layers.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.a = de.Variable(dim=2, name=f"{self.name}_a")
            self.tables = [de.Variable(dim=3, name=f"{self.name}_b", num_shards=2)]
            self.w = self.add_weight(shape=(2,), initializer="ones")

        def call(self, ids):
            return de.embedding_lookup(self.a, ids) * self.w

    layer = Two(name="two")
    layer.a.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    train(layer.tables[0], np.arange(5))
    store = {}
    layer.save_own_variables(store)
    assert sorted(k for k in store if not k.startswith("de:")) == ["0"]
    assert {k.split(":")[1] for k in store if k.startswith("de:")} == {"a", "tables.0"}
    other = Two(name="two")
    other.w.assign([5.0, 5.0])
    other.load_own_variables(store)
    assert_same_table(layer.a, other.a)
    assert_same_table(layer.tables[0], other.tables[0])
    np.testing.assert_array_equal(other.w.numpy(), [1.0, 1.0])
    del store["de:a:keys"]
    with pytest.raises(ValueError, match="no table for attribute 'a'"):
        other.load_own_variables(store)


def test_graph_mode_serialize_and_restore():
    a = var(dim=2, num_shards=2)
    train(a, np.arange(-5, 5))
    eager = table_state(a)
    from tf_bridge.checkpoint import restore_from_tensors, serialize_to_tensors
    traced = tf.function(lambda: serialize_to_tensors(a))()
    assert traced["columns"].numpy().decode() == eager["columns"]
    b = var(dim=2, num_shards=3)
    tf.function(lambda t: restore_from_tensors(b, t))(traced)
    assert_same_table(a, b)


def test_unsaved_variables_and_savedmodel_refusal(tmp_path):
    v = var(dim=2, checkpoint=False)
    v.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    path = tf.train.Checkpoint(emb=v).save(str(tmp_path / "c"))
    assert not any("emb/" in n for n, _ in tf.train.list_variables(path))
    module = tf.Module()
    module.emb = var(dim=2)
    with pytest.raises(ValueError, match="export_for_serving"):
        tf.saved_model.save(module, str(tmp_path / "sm"))


def test_async_checkpoint_writes_the_table_as_it_was_at_save(tmp_path):
    v = var(dim=2, num_shards=2)
    v.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    ckpt = tf.train.Checkpoint(emb=v)
    opts = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    first = ckpt.save(str(tmp_path / "c"), options=opts)
    v.upsert(tf.constant([3], tf.int64), tf.ones([1, 2]))    # while / after it is written
    second = ckpt.save(str(tmp_path / "c"), options=opts)
    v.remove(tf.constant([1], tf.int64))
    ckpt.sync()
    for path, want in ((first, [1, 2]), (second, [1, 2, 3])):
        w = var(dim=2)
        tf.train.Checkpoint(emb=w).restore(path).assert_consumed()
        assert sorted(w.export()[0].numpy().tolist()) == want


GPU_RESTORE = r"""
import numpy as np
import numbaemb as ne
from tests.cuda_support import simulate_as_tests_do
simulate_as_tests_do()      # as tests/conftest.py does
from numbaemb.optimizers import Adam, apply_gradients, slot_values
from tf_bridge.checkpoint import restore_table_state, table_state

def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()

def same(a, b, rule):
    ka, kb = (np.sort(host(t.export()[0])) for t in (a, b))
    assert np.array_equal(ka, kb) and ka.size, (ka, kb)
    assert np.array_equal(host(a.lookup(ka)), host(b.lookup(ka)))
    for s, _ in rule.slots():
        assert np.array_equal(slot_values(a, rule, s, ka), slot_values(b, rule, s, ka)), s

rule, rng = Adam(0.1), np.random.default_rng(3)
keys = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0] + list(range(20)))
src = ne.Variable(3, device="cuda", num_shards=2, seed=5)
for step in (1, 2):
    apply_gradients(src, rule, keys, rng.standard_normal((keys.size, 3)).astype(np.float32),
                    step=step)
state = table_state(src)
for target in (ne.Variable(3, device="cuda", seed=5), ne.Variable(3, num_shards=3, seed=5)):
    target.upsert(np.array([777]), np.ones((1, 3), np.float32))      # replaced by the state
    restore_table_state(target, state)
    same(target, src, rule)
back = ne.Variable(3, device="cuda", num_shards=2, seed=5)            # CPU state -> GPU
restore_table_state(back, table_state(target))
same(back, src, rule)
# a bounded GPU table: scores and clock restored, so later inserts evict as the CPU's do
b_src = ne.Variable(2, max_capacity=16, evict_window=4, seed=1)
b_src.find_or_insert(np.arange(30))
b_src.find_or_insert(np.arange(5))
twins = [ne.Variable(2, max_capacity=16, evict_window=4, seed=1, device=d) for d in ("cpu", "cuda")]
for t in twins:
    restore_table_state(t, table_state(b_src))
    t.find_or_insert(np.arange(100, 106))
(ck, cs), (gk, gs) = ((host(a) for a in t.export("score")) for t in twins)
co, go = np.argsort(ck), np.argsort(gk)
assert np.array_equal(ck[co], gk[go]) and np.array_equal(cs[co], gs[go])
assert len(set(range(100, 106)) & set(gk.tolist())) >= 5      # the new ids outrank the old
# a window table's state into bucketed twins: 40 keys of one bucket, the 32 highest-scored
# kept (rows -1 of the others skipped, on the device too), the same on the GPU as the CPU
import warnings
from jit_kernels.bucket_bounded import homes_of
w_src = ne.Variable(2, max_capacity=60, evict="lfu", evict_window=32, seed=1)
buckets = [ne.Variable(2, max_capacity=60, evict="lfu", seed=1, device=d) for d in ("cpu", "cuda")]
mask = buckets[0].shards[0].mask
same_bucket = np.array([k for k in range(100_000) if homes_of.python_twin()(k, mask) >> 8 == 0][:40])
w_src.upsert(same_bucket, np.arange(80, dtype=np.float32).reshape(40, 2))
for i, k in enumerate(same_bucket):
    for _ in range(i % 7):
        w_src.find_or_insert(np.array([k]))
for t in buckets:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restore_table_state(t, table_state(w_src))
    assert any("8 restored keys did not fit" in str(c.message) for c in caught), caught
(ck, cv), (gk, gv) = ((host(a) for a in t.export()) for t in buckets)
co, go = np.argsort(ck), np.argsort(gk)
assert ck.size == 32 and np.array_equal(ck[co], gk[go]) and np.array_equal(cv[co], gv[go])
assert np.array_equal(cv[co], np.array([[2 * i, 2 * i + 1] for i in
                      [int(np.flatnonzero(same_bucket == k)[0]) for k in ck[co]]], np.float32))
print("restored into GPU tables")
"""


def test_table_state_restores_into_gpu_tables():
    """restore_table_state into GPU tables (the CUDA simulator, in a subprocess: this env
    has TensorFlow, the simulator env has not): GPU -> GPU and CPU -> GPU with Adam
    slots across shard counts, and a bounded table's scores and clock."""
    import importlib.util
    import os
    import subprocess
    import sys
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("needs numba-cuda (the simulator of numba's legacy CUDA target differs)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", TF_CPP_MIN_LOG_LEVEL="3")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", GPU_RESTORE], capture_output=True, text=True,
                          timeout=600, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restored into GPU tables" in proc.stdout
