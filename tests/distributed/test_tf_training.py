"""Distributed training in TensorFlow under mpiexec: N ranks, each fed its part of the
global batch, train what one process trained on the whole global batch does.

Each rank also trains the one-process reference itself (plain tables, the whole
batch), so the comparison needs no files: the distributed tables are exported on
every rank, gathered and merged, and compared with the reference's tables; the
dense weights (kept equal by the averaged gradients) with the reference's.
"""
import numpy as np
import pytest

from .conftest import COMM, RANK, WORLD, agree, multi_rank

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
de = pytest.importorskip("tf_bridge")
hvd = de.distributed

pytestmark = multi_rank

G, K, DIM = 12, 3, 4            # global batch (divisible by 2 and 3), steps, row width
EXTREME = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0], np.int64)
OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.5),
              "adagrad": lambda: keras.optimizers.Adagrad(0.1),
              "adam": lambda: keras.optimizers.Adam(0.01)}


def data():
    """K global batches: user ids (G*K, 1), item ids (G*K, 3), labels; the same on
    every rank.  Ids repeat within and across ranks' shares; extreme keys included."""
    rng = np.random.default_rng(7)
    pool = np.concatenate([EXTREME, rng.integers(-50, 50, 12)])
    users = rng.choice(pool, (G * K, 1))
    items = rng.choice(pool, (G * K, 3))
    labels = rng.normal(size=(G * K, 1)).astype(np.float32)
    return users, items, labels


def local_part(*arrays):
    """Rank RANK's share of each global batch, batches kept in order."""
    n = G // WORLD
    idx = np.concatenate([np.arange(k * G + RANK * n, k * G + (RANK + 1) * n) for k in range(K)])
    return [a[idx] for a in arrays]


def build(distributed):
    keras.utils.set_random_seed(11)
    user = keras.Input((1,), dtype="int64")
    items = keras.Input((3,), dtype="int64")
    u = de.keras.layers.Embedding(DIM, name="user_emb", distributed=distributed,
                                  initializer=keras.initializers.RandomNormal(0.0, 0.1, seed=1))
    i = de.keras.layers.Embedding(DIM, name="item_emb", combiner="mean", distributed=distributed,
                                  initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=2))
    x = keras.layers.Concatenate()([keras.layers.Flatten()(u(user)), i(items)])
    x = keras.layers.Dense(8, activation="tanh")(x)
    return keras.Model([user, items], keras.layers.Dense(1)(x)), (u, i)


def tables_equal(tables, ref_tables):
    """Every rank's rows of each distributed table, merged, equal the reference's."""
    for t, r in zip(tables, ref_tables):
        keys, rows = (np.asarray(a) for a in t.params.export())
        every = COMM.allgather((keys, rows))
        got = {int(k): row for ks, rs in every for k, row in zip(ks, rs)}
        assert sum(len(ks) for ks, _ in every) == len(got)        # each key on one rank only
        rk, rr = (np.asarray(a) for a in r.params.export())
        want = {int(k): row for k, row in zip(rk, rr)}
        agree(got.keys() == want.keys(), f"{t.name}: keys differ")
        err = max(float(np.abs(got[k] - want[k]).max()) for k in want)
        agree(err <= 1e-5, f"{t.name}: rows differ by {err}")


def dense_equal(model, ref):
    for w, rw in zip(model.trainable_weights, ref.trainable_weights):
        err = float(np.abs(np.asarray(w) - np.asarray(rw)).max())
        agree(err <= 1e-5, f"{w.path}: differs by {err}")


def twins():
    model, tables = build(True)
    ref, ref_tables = build(False)
    model.set_weights(ref.get_weights())
    hvd.broadcast_variables(model.variables, root_rank=0)
    return model, tables, ref, ref_tables


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_custom_loop_matches_one_process(name):
    users, items, labels = data()
    model, tables, ref, ref_tables = twins()
    opt = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())
    ref_opt = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())

    def step_fn(m, o, distributed):
        @tf.function
        def step(u, i, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m([u, i], training=True) - y))
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, m.trainable_variables)
            o.apply_gradients(zip(grads, m.trainable_variables))
            return loss
        return step

    step, ref_step = step_fn(model, opt, True), step_fn(ref, ref_opt, False)
    mine = local_part(users, items, labels)
    ds = tf.data.Dataset.from_tensor_slices(tuple(mine)).batch(G // WORLD).prefetch(2)
    for u, i, y in ds:                       # tf.data prefetching runs beside the steps
        step(u, i, y)
    for k in range(K):
        ref_step(*(tf.constant(a[k * G:(k + 1) * G]) for a in (users, items, labels)))
    tables_equal(tables, ref_tables)
    dense_equal(model, ref)
    agree(int(opt.iterations) == K)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_model_fit_matches_one_process(name):
    users, items, labels = data()
    model, tables, ref, ref_tables = twins()
    model.compile(hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())),
                  loss="mse")
    ref.compile(de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]()), loss="mse")
    u, i, y = local_part(users, items, labels)
    hist = model.fit([u, i], y, batch_size=G // WORLD, epochs=1, shuffle=False, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                hvd.callbacks.MetricAverageCallback()])
    ref.fit([users, items], labels, batch_size=G, epochs=1, shuffle=False, verbose=0)
    tables_equal(tables, ref_tables)
    dense_equal(model, ref)
    losses = COMM.allgather(hist.history["loss"][-1])
    agree(np.allclose(losses, losses[0]), f"MetricAverageCallback left {losses}")


def test_several_tables_one_step_in_program_order():
    """Four tables looked up side by side (independent ops TF could run in any order)
    and a dense allreduce in one tf.function step: every rank runs the collectives in
    the order the program created them (each waits on the previous one)."""
    tables = [de.Variable(dim=2, name=f"order{j}", initializer=float(j), distributed=True)
              for j in range(4)]
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    dense = tf.Variable(tf.ones([3]))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(de.embedding_lookup(t, ids + j))
                             for j, t in enumerate(tables)]) + tf.reduce_sum(dense)
        tape = hvd.DistributedGradientTape(tape)
        variables = tables + [dense]
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    ds = tf.data.Dataset.range(6).map(lambda s: tf.stack([s, s + RANK])).prefetch(3)
    for ids in ds:
        step(ids)
    graph = step.get_concrete_function(tf.TensorSpec([2], tf.int64)).graph
    chain = [op for op in graph.get_operations() if op.type == "PyFunc"
             and "sum_by_key" not in op.name]        # the backward's local sums are not collective
    assert len(chain) == 4 + 1 + 4               # lookups, the fused allreduce, steps
    for prev, op in zip(chain, chain[1:]):
        assert prev in op.control_inputs, (prev.name, op.name)
    for j, t in enumerate(tables):
        keys, rows = (np.asarray(a) for a in t.export())
        every = COMM.allgather(dict(zip(keys.tolist(), rows[:, 0].tolist())))
        merged = {k: v for d in every for k, v in d.items()}
        want = {}
        for s in range(6):          # SGD(1): each position takes 1 / WORLD off its key's row
            for r in range(WORLD):
                for k in (s + j, s + r + j):
                    want[k] = want.get(k, float(j)) - 1.0 / WORLD
        agree(merged.keys() == want.keys() and all(
            abs(merged[k] - want[k]) < 1e-5 for k in want), f"table {j}: {merged} != {want}")
    agree(np.allclose(dense.numpy(), 1 - 6), "dense variable: averaged gradient 1 per step")


def test_bounded_filtered_layer_trains_within_each_ranks_capacity():
    """A Keras layer split across ranks with max_capacity (per rank) and an admission
    filter trains: every rank's table stays within its capacity and every rank's filter
    counted the ids it owns."""
    from numbaemb.admission import CounterFilter
    keras.utils.set_random_seed(3)
    ids = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(DIM, name="bounded_split", combiner="sum",
                                    distributed=True, max_capacity=20, evict="lru",
                                    admit=CounterFilter(min_count=2))
    model = keras.Model(ids, keras.layers.Dense(1)(emb(ids)))
    model.compile(hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(
        keras.optimizers.SGD(0.1))), loss="mse")
    rng = np.random.default_rng(RANK)
    x = rng.integers(0, 200, (64, 2))
    model.fit(x, np.ones((64, 1)), batch_size=2, epochs=1, shuffle=False, verbose=0)
    table = emb.params.table
    agree(table.local_size() <= 20 and table.size() <= 20 * WORLD, table.local_size())
    stats = COMM.allgather(table.admit.counts.size())
    agree(all(s > 0 for s in stats), stats)
