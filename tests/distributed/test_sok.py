"""``de.sok.All2AllDenseEmbedding`` under mpiexec: SOK's shapes, rows on rank
``id mod size``, the key-range and capacity limits raised on every rank, and
training equal to one process fed the global batch."""
import numpy as np
import pytest

from .conftest import COMM, RANK, WORLD, agree, multi_rank

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
de = pytest.importorskip("tf_bridge")
hvd = de.distributed

pytestmark = multi_rank


def test_shapes_and_owners():
    layer = de.sok.All2AllDenseEmbedding(50, 3, slot_num=2, nnz_per_slot=4,
                                         embedding_initializer="zeros")
    ids = tf.constant(np.arange(16).reshape(2, 2, 4) * (RANK + 1), tf.int64)
    agree(layer(ids).shape == (2, 2, 4, 3))
    dyn = de.sok.All2AllDenseEmbedding(50, 3, dynamic_input=True)
    agree(dyn(tf.constant([RANK, 7, 7], tf.int64)).shape == (3, 3))
    with pytest.raises(ValueError, match="slot_num"):
        layer(tf.zeros([2, 3, 4], tf.int64))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids, training=True))
    tape = hvd.DistributedGradientTape(tape)
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_weights),
                            layer.trainable_weights))
    keys = np.asarray(layer.params.export()[0])
    agree(keys.size > 0 and (keys % WORLD == RANK).all(), f"rank {RANK} holds {keys}")


def test_keys_out_of_range_raise_on_every_rank():
    layer = de.sok.All2AllDenseEmbedding(4, 2, dynamic_input=True, use_hashtable=False)
    agree(layer.params.key_range == (0, 4 * WORLD))
    bad = 4 * WORLD if RANK == WORLD - 1 else 0       # only the last rank's input is bad
    with pytest.raises(ValueError, match=rf"rank {WORLD - 1} of {WORLD}: keys must be in"):
        layer(tf.constant([0, bad], tf.int64))
    agree(layer(tf.constant([0, 4 * WORLD - 1], tf.int64)).shape == (2, 2))   # still in step


def test_capacity_per_rank_raises_on_every_rank_and_applies_nothing():
    layer = de.sok.All2AllDenseEmbedding(2, 2, dynamic_input=True)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant(ids, tf.int64), training=True))
        opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_weights),
                                layer.trainable_weights))

    step([WORLD * j for j in range(2)] if RANK == 0 else [])     # rank 0 owns 2 keys: full
    agree(int(layer.params.size()) == 2)
    with pytest.raises(ValueError, match="capacity of 2 keys per rank"):
        step([WORLD * 2] if RANK == WORLD - 1 else [])           # a third key for rank 0
    agree(int(layer.params.size()) == 2)
    step([WORLD * j + 1 for j in range(2)] if RANK == 0 else [])  # rank 1 has room
    agree(int(layer.params.size()) == 4)


def test_training_matches_one_process():
    G, K = 6, 3
    rng = np.random.default_rng(3)
    ids = rng.integers(-20, 20, (G * K, 2, 3))
    ids[0, 0] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1]
    target = rng.normal(size=(G * K, 2, 3, 4)).astype(np.float32)

    layer = de.sok.All2AllDenseEmbedding(100, 4, 2, 3, name="sok_twin",
                                         embedding_initializer="random_uniform")
    ref = de.keras.layers.Embedding(4, name="sok_twin",       # one process, the same rows
                                    initializer=keras.initializers.RandomUniform(-0.05, 0.05))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.2))
    ref_opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.2))

    def train(lay, o, x, y, distributed):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(lay(x, training=True) - y))
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        o.apply_gradients(zip(tape.gradient(loss, lay.trainable_weights), lay.trainable_weights))

    n = G // WORLD
    for k in range(K):
        sl = slice(k * G + RANK * n, k * G + (RANK + 1) * n)
        train(layer, opt, tf.constant(ids[sl]), tf.constant(target[sl]), True)
        train(ref, ref_opt, tf.constant(ids[k * G:(k + 1) * G]),
              tf.constant(target[k * G:(k + 1) * G]), False)
    every = COMM.allgather(tuple(np.asarray(a) for a in layer.params.export()))
    got = {int(k): r for ks, rs in every for k, r in zip(ks, rs)}
    want = dict(zip(np.asarray(ref.params.export()[0]).tolist(),
                    np.asarray(ref.params.export()[1])))
    agree(got.keys() == want.keys(), "keys differ")
    agree(all(np.allclose(got[k], want[k], atol=1e-5) for k in want), "rows differ")


def test_dynamic_variable_is_split_and_training_lookups_insert_on_owners():
    """sok.DynamicVariable under mpiexec (after sok.init): rows on rank id mod size; a
    training lookup inserts every rank's ids on their owners; one SGD(1) step takes
    each row down by the number of times the ranks looked it up (Sum)."""
    de.sok.init()
    v = de.sok.DynamicVariable(dimension=2, initializer="13", name="sok_dyn_split")
    agree(v.distributed)
    ids = tf.constant([RANK, 100, np.iinfo(np.int64).max, -1 - RANK], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
    every = sorted({int(k) for r in range(WORLD)
                    for k in (r, 100, np.iinfo(np.int64).max, -1 - r)})
    agree(int(v.size) == len(every), f"size {int(v.size)}, want {len(every)}")
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    grads = tape.gradient(loss, [v])
    de.sok.OptimizerWrapper(keras.optimizers.SGD(1.0)).apply_gradients(zip(grads, [v]))
    keys, rows = (np.asarray(a) for a in de.sok.export(v))
    agree((keys.view(np.uint64) % np.uint64(WORLD) == RANK).all(), f"rank {RANK}: {keys}")
    got = {k: r[0] for ks, rs in COMM.allgather((keys, rows)) for k, r in zip(ks.tolist(), rs)}
    want = {k: 13.0 - (WORLD if k in (100, np.iinfo(np.int64).max) else 1) for k in every}
    agree(got == want, f"{got} != {want}")


def test_hybrid_dynamic_variable_bounds_each_rank_as_hkv():
    """sok.DynamicVariable(var_type="hybrid", max_capacity=N) split across ranks: each
    rank's table holds at most N keys and evicts as HKV; every rank's table is the
    bounded numbaemb table fed what reaches its owner (the ranks' distinct ids in rank
    order; the training lookup's insert, then the step with the ranks' summed
    gradients)."""
    import numbaemb as ne
    de.sok.init()
    cap = 10
    v = de.sok.DynamicVariable(dimension=2, initializer="13", var_type="hybrid",
                               max_capacity=cap, name="sok_hkv_split")
    ref = ne.Variable(2, max_capacity=cap, evict="lru", initializer=13.0)
    opt = de.sok.OptimizerWrapper(keras.optimizers.SGD(1.0))
    extremes = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]
    for step in range(1, 7):
        shared = [step * 50 + j for j in range(6)] + [extremes[step % 4]]
        ids = np.array(shared + [step * 50 + 20 + RANK * 5 + j for j in range(3)], np.int64)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant(ids)))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        every = np.concatenate(COMM.allgather(ids))
        mine = every[every.view(np.uint64) % np.uint64(WORLD) == RANK]
        _, first, counts = np.unique(mine, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        keys = mine[np.sort(first)]
        ref.find_or_insert(keys)
        grads = np.repeat(counts[order], 2).reshape(-1, 2).astype(np.float32)
        ne.optimizers.apply_gradients(ref, ne.optimizers.SGD(learning_rate=1.0), keys, grads,
                                      step=step)
        k, x = (np.asarray(a) for a in de.sok.export(v))
        rk, rx = ref.export()
        o, ro = np.argsort(k), np.argsort(rk)
        agree(np.array_equal(k[o], rk[ro]) and np.array_equal(x[o], rx[ro]),
              f"rank {RANK} step {step}: {k[o]} {x[o]} != {rk[ro]} {rx[ro]}")
        agree(v.table.local_size() <= cap, v.table.local_size())
    agree(v.table.local_size() == cap and int(v.size) == cap * WORLD, int(v.size))
