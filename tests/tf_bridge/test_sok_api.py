"""SOK's dynamic-variable API (``from tf_bridge import sok``): the seed's two examples
print what SOK prints; initializer forms, export / assign, lookup_sparse, capacity."""
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de
from numbaemb import admission as ne_admission
from tf_bridge import sok

IDS = tf.constant([0, 1, 2**40], tf.int64)

# seed 001's examples; `import sparse_operation_kit as sok` replaced, Horovod lines removed
EXAMPLE_1 = """
import numpy as np
import tensorflow as tf
from tf_bridge import sok
v = sok.DynamicVariable(dimension=3, initializer="13")
print("v.shape:", v.shape)
print("v.size:", v.size)
indices = tf.convert_to_tensor([0, 1, 2**40], dtype=tf.int64)
embedding = tf.nn.embedding_lookup(v, indices)
print("embedding:", embedding)
print("v.shape:", v.shape)
print("v.size:", v.size)
"""
EXAMPLE_2 = """
import numpy as np
import tensorflow as tf
from tf_bridge import sok
v = sok.DynamicVariable(dimension=3, var_type="hbm", initializer="13")
indices = tf.convert_to_tensor([0, 1, 2**40], dtype=tf.int64)
with tf.GradientTape() as tape:
    embedding = tf.nn.embedding_lookup(v, indices)
    print("embedding:", embedding)
    loss = tf.reduce_sum(embedding)
grads = tape.gradient(loss, [v])
optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
optimizer = sok.OptimizerWrapper(optimizer)
optimizer.apply_gradients(zip(grads, [v]))
embedding = tf.nn.embedding_lookup(v, indices)
print("embedding:", embedding)
"""


def run_example(code, capsys):
    """Run a seed example as a script of its own (its own globals) in this process and
    return what it printed (a process each took 28 s of the suite, TensorFlow's start)."""
    capsys.readouterr()
    exec(compile(textwrap.dedent(code), "<seed example>", "exec"), {"__name__": "__main__"})
    return capsys.readouterr().out


def test_seed_examples_print_what_sok_prints(capsys):
    out = run_example(EXAMPLE_1, capsys)
    assert out.count("v.shape: (None, 3)") == 2
    assert "v.size: tf.Tensor(0," in out and "v.size: tf.Tensor(3," in out   # lookup inserted
    assert out.count("13.") == 9
    out = run_example(EXAMPLE_2, capsys).split("embedding:")
    assert out[1].count("13.") == 9 and out[2].count("12.") == 9


def test_properties_and_initializer_forms():
    v = sok.DynamicVariable(dimension=4, name="sok_props", key_type=tf.int32, dtype=tf.float64)
    assert v.shape == tf.TensorShape([None, 4]) and v.dimension == 4
    assert v.key_type == tf.int32 and v.dtype == tf.float64 and v.var_type == "hbm"
    rows = v.lookup(tf.constant([1, 2, -3], tf.int32)).numpy()
    assert np.all(np.abs(rows) <= 0.05) and len(np.unique(rows)) == 12    # "random": per key
    assert np.array_equal(rows, v.lookup(tf.constant([1, 2, -3], tf.int32)).numpy())
    assert np.all(sok.DynamicVariable(2, initializer="-2.5").lookup(IDS).numpy() == -2.5)
    assert np.all(sok.DynamicVariable(2, initializer=0.25).lookup(IDS).numpy() == 0.25)
    k = sok.DynamicVariable(2, initializer=keras.initializers.RandomNormal(seed=4))
    assert np.array_equal(k.lookup(IDS), de.Variable(dim=2, name=k.name, initializer=
                                                     keras.initializers.RandomNormal(seed=4)
                                                     ).lookup(IDS))
    with pytest.raises(ValueError, match="initializer"):
        sok.DynamicVariable(2, initializer="glorot")
    with pytest.raises(ValueError, match="var_type"):
        sok.DynamicVariable(2, var_type="dram")
    with pytest.raises(ValueError, match="dimension"):
        sok.DynamicVariable(0)
    with pytest.raises(ValueError, match="init_capacity"):
        sok.DynamicVariable(2, init_capacity=-1)


def test_training_lookups_insert_inference_lookups_do_not():
    v = sok.DynamicVariable(dimension=2, initializer="1")
    de.enable_inference_mode()
    try:
        tf.nn.embedding_lookup(v, IDS)
    finally:
        de.enable_train_mode()
    assert int(v.size) == 0
    tf.nn.embedding_lookup(v, tf.constant([5, 5, 6], tf.int64))
    assert int(v.size) == 2
    keys, values = sok.export(v)
    assert sorted(keys.numpy().tolist()) == [5, 6] and np.all(values.numpy() == 1.0)


def test_export_assign_and_lookup_sparse():
    a = sok.DynamicVariable(dimension=2, initializer="0", name="sok_a")
    b = sok.DynamicVariable(dimension=2, initializer="0", name="sok_b")
    keys = np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max], np.int64)
    vals = np.arange(8, dtype=np.float32).reshape(4, 2)
    assert sok.assign(a, keys, vals) is a
    k, v = sok.export(a)
    order = np.argsort(k.numpy())
    assert np.array_equal(k.numpy()[order], np.sort(keys))
    assert np.array_equal(v.numpy()[order], vals[np.argsort(keys)])
    sok.assign(b, keys, 10 * vals)
    ids = tf.ragged.constant([[keys[0], keys[1]], [keys[3]]], tf.int64)
    sa, mb = sok.lookup_sparse([a, b], [ids, ids], combiners=["sum", "mean"])
    assert np.allclose(sa, [vals[0] + vals[1], vals[3]])
    assert np.allclose(mb, [10 * (vals[0] + vals[1]) / 2, 10 * vals[3]])
    assert np.allclose(sok.lookup_sparse(a, ids), sa)                 # default combiner: sum
    with pytest.raises(ValueError, match="one entry per variable"):
        sok.lookup_sparse([a, b], [ids])
    with pytest.raises(TypeError, match="DynamicVariable"):
        sok.export("a")


def test_lookup_sparse_of_many_variables_trains_as_one_lookup_per_variable():
    """In a tf.function: one op looks all three variables up (SOK's fused lookup); the
    outputs and the tables after Adam steps equal per-variable lookups' exactly."""
    rng = np.random.default_rng(3)
    extremes = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]
    bags = [[list(rng.integers(-5, 9, rng.integers(1, 4))) for _ in range(6)] for _ in range(3)]
    bags[0][0] = extremes
    sp = [tf.ragged.constant(b, tf.int64) for b in bags]
    combiners = ["sum", "mean", "sum"]

    def make(tag):
        return [sok.DynamicVariable(dimension=d, initializer=str(t + 1), name=f"sokm_{tag}_{t}")
                for t, d in enumerate([2, 3, 4])]

    def trainer(vars_, lookup):
        opt = sok.OptimizerWrapper(keras.optimizers.Adam(0.1))

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                outs = lookup(vars_)
                loss = tf.add_n([tf.reduce_sum(o * o) for o in outs])
            opt.apply_gradients(zip(tape.gradient(loss, vars_), vars_))
            return outs
        return step

    fused, alone = make("fused"), make("alone")
    step_f = trainer(fused, lambda vs: sok.lookup_sparse(vs, sp, combiners=combiners))
    step_a = trainer(alone, lambda vs: [de.embedding_lookup_sparse(v, i, None, combiner=c)
                                       for v, i, c in zip(vs, sp, combiners)])
    for _ in range(3):
        for of, oa in zip(step_f(), step_a()):
            np.testing.assert_array_equal(of.numpy(), oa.numpy())
    for vf, va in zip(fused, alone):
        kf, xf = sok.export(vf)
        ka, xa = sok.export(va)
        of, oa = np.argsort(kf.numpy()), np.argsort(ka.numpy())
        np.testing.assert_array_equal(kf.numpy()[of], ka.numpy()[oa])
        np.testing.assert_array_equal(xf.numpy()[of], xa.numpy()[oa])
    graph = step_f.get_concrete_function().graph
    lookups = [op.name for op in graph.get_operations()
               if op.type == "PyFunc" and "lookup" in op.name]
    assert len(lookups) == 1, lookups


def test_max_capacity_refuses_a_lookup_that_would_overfill():
    v = sok.DynamicVariable(dimension=2, initializer="1", max_capacity=3)
    tf.nn.embedding_lookup(v, tf.constant([1, 2], tf.int64))
    with pytest.raises(ValueError, match="max_capacity"):
        tf.nn.embedding_lookup(v, tf.constant([3, 4, 1], tf.int64))
    assert int(v.size) == 2                                        # nothing was inserted
    tf.nn.embedding_lookup(v, tf.constant([3, 1], tf.int64))
    assert int(v.size) == 3


def test_init_is_a_world_of_one_without_mpiexec():
    sok.init()
    assert de.distributed.size() == 1
    with pytest.raises(ValueError, match="comm_tool"):
        sok.init(comm_tool="nccl")


@pytest.mark.parametrize("strategy, evict", [("kLru", "lru"), ("kLfu", "lfu"),
                                             ("kEpochLru", "epoch_lru"),
                                             ("kEpochLfu", "epoch_lfu")])
def test_hybrid_max_capacity_evicts_as_hkv(strategy, evict):
    """var_type="hybrid" with max_capacity is HKV's bounded table: SOK training steps (a
    lookup that inserts, then SGD) into a full table evict, and the table (keys, rows,
    scores) is at every step the bounded numbaemb table fed the same calls (the
    lookup's find_or_insert of the batch's distinct ids, then the optimizer step).  LFU
    evicts nothing here: a lookup and a step count every key twice, and a new id (one
    count) is not admitted in its place."""
    import numbaemb as ne
    cap, rng = 24, np.random.default_rng(5)
    v = sok.DynamicVariable(dimension=2, initializer="1", var_type="hybrid", max_capacity=cap,
                            evict_strategy=strategy, name=f"sok_hkv_{evict}")
    ref = ne.Variable(2, max_capacity=cap, evict=evict, initializer=1.0)
    assert v.table.max_capacity == cap and v.table.evict == evict and v.max_keys is None
    opt = sok.OptimizerWrapper(keras.optimizers.SGD(1.0))
    extremes = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]
    evicted = refused = 0
    for step in range(1, 9):
        ids = np.concatenate([rng.integers(-40, 40, 12), rng.choice(extremes, 2)])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant(ids, tf.int64)))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        uniq, counts = np.unique(ids, return_counts=True)
        first = uniq[np.argsort([np.flatnonzero(ids == k)[0] for k in uniq], kind="stable")]
        before = set(ref.export()[0].tolist())
        ref.find_or_insert(first)
        grads = np.repeat(counts[np.searchsorted(uniq, first)], 2).reshape(-1, 2)
        ne.optimizers.apply_gradients(ref, ne.optimizers.SGD(learning_rate=1.0), first,
                                      grads.astype(np.float32), step=step)
        after = set(ref.export()[0].tolist())
        evicted, refused = evicted + len(before - after), refused + len(set(first) - after)
        k, x = (a.numpy() for a in sok.export(v))
        rk, rx = ref.export()
        o, ro = np.argsort(k), np.argsort(rk)
        np.testing.assert_array_equal(k[o], rk[ro])
        np.testing.assert_array_equal(x[o], rx[ro])
        np.testing.assert_array_equal(v.table.export("score")[1][o], ref.export("score")[1][ro])
        assert int(v.size) <= cap
    assert int(v.size) == cap
    assert (evicted, refused > 10) == (0, True) if evict == "lfu" else evicted > 10


def test_hybrid_settings_are_hkvs():
    """HKV's placement settings are accepted (no effect on a host table); the rest
    of its config is checked; "hbm" keeps max_capacity as a hard limit."""
    v = sok.DynamicVariable(2, var_type="hybrid", max_capacity=8, max_hbm_for_vectors=1,
                            max_bucket_size=128, max_load_factor=0.5, block_size=1024,
                            io_block_size=1024, device_id=0, io_by_cpu=False, filter_ratio=1.0)
    assert v.table.max_capacity == 8 and v.table.evict == "lru"
    assert sok.DynamicVariable(2, var_type="hybrid").table.max_capacity is None   # grows
    hbm = sok.DynamicVariable(2, max_capacity=8, evict_strategy="kLfu")   # DET ignores HKV's
    assert hbm.table.max_capacity is None and hbm.max_keys == 8
    with pytest.raises(ValueError, match="evict_strategy"):
        sok.DynamicVariable(2, var_type="hybrid", max_capacity=8, evict_strategy="lru")
    with pytest.raises(NotImplementedError, match="kCustomized"):
        sok.DynamicVariable(2, var_type="hybrid", max_capacity=8, evict_strategy="kCustomized")
    for bad in (0, 1.5, "0.5"):
        with pytest.raises(ValueError, match="filter_ratio"):
            sok.DynamicVariable(2, var_type="hybrid", filter_ratio=bad)
    with pytest.raises(ValueError, match="not both"):
        sok.DynamicVariable(2, var_type="hybrid", filter_ratio=0.5,
                            admit=ne_admission.CounterFilter(2))
    assert sok.DynamicVariable(2, filter_ratio=0.5).table.admit is None     # DET: ignored
    with pytest.raises(ValueError, match="max_capacity"):
        sok.DynamicVariable(2, var_type="hybrid", max_capacity=-1)
    with pytest.raises(TypeError):
        sok.DynamicVariable(2, var_type="hybrid", max_capacity=8, bucket_size=3)


def test_hybrid_bounded_variable_round_trips_through_a_checkpoint(tmp_path):
    """tf.train.Checkpoint of a full "hybrid" DynamicVariable keeps its keys, rows and
    scores, and its LRU clock: after the restore, new ids evict the least recent keys
    exactly as in the table that was saved."""
    def make():
        return sok.DynamicVariable(dimension=2, initializer="1", var_type="hybrid",
                                   max_capacity=16, name="sok_hkv_ckpt")

    def step(var, ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(var, tf.constant(ids, tf.int64)))
        sok.OptimizerWrapper(keras.optimizers.SGD(0.5)).apply_gradients(
            zip(tape.gradient(loss, [var]), [var]))

    v = make()
    for s in range(4):
        step(v, np.arange(8) + 6 * s)
    path = tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpt"))
    w = make()
    tf.train.Checkpoint(v=w).read(path).assert_consumed()
    for var in (v, w):
        step(var, np.arange(100, 106))
    (kv, xv), (kw, xw) = ((a.numpy() for a in sok.export(t)) for t in (v, w))
    ov, ow = np.argsort(kv), np.argsort(kw)
    np.testing.assert_array_equal(kv[ov], kw[ow])
    np.testing.assert_array_equal(xv[ov], xw[ow])
    np.testing.assert_array_equal(v.table.export("score")[1][ov], w.table.export("score")[1][ow])
    assert int(w.size) == 16 and set(range(100, 106)) <= set(kw.tolist())


def test_hybrid_filter_ratio_admits_new_ids_at_random():
    """filter_ratio (HKV's random admission): a training lookup gives a new id a row
    with that probability, by numbaemb's RandomFilter seeded by the variable's name, so
    two variables of one name admit the same ids; an id left out reads its initial
    row and may get in at a later step."""
    def make():
        return sok.DynamicVariable(dimension=2, initializer="1", var_type="hybrid",
                                   filter_ratio=0.25, name="sok_hkv_ratio")
    v, w = make(), make()
    f = v.table.admit
    assert isinstance(f, ne_admission.RandomFilter) and f.p == 0.25
    ids = tf.range(4000, dtype=tf.int64)
    for var in (v, w):
        rows = tf.nn.embedding_lookup(var, ids)
        assert np.all(rows.numpy() == 1.0)
    assert abs(int(v.size) / 4000 - 0.25) < 0.03
    assert sorted(sok.export(v)[0].numpy().tolist()) == sorted(sok.export(w)[0].numpy().tolist())
    first = int(v.size)
    tf.nn.embedding_lookup(v, ids)
    assert int(v.size) > first + 500           # a fresh coin for the ids left out
