"""``tf_bridge.distributed`` (Horovod's names) under mpiexec: every collective checked
against what NumPy computes from every rank's input, eagerly and inside tf.function."""
import numpy as np
import pytest

from .conftest import COMM, RANK, WORLD, agree, multi_rank

tf = pytest.importorskip("tensorflow")
de = pytest.importorskip("tf_bridge")
hvd = de.distributed

pytestmark = multi_rank


def mine(shape=(3, 2), dtype=np.float32):
    """This rank's input: distinct per rank, so a wrong reduction shows."""
    return (np.arange(np.prod(shape)).reshape(shape) * (RANK + 1) + RANK).astype(dtype)


def every(shape=(3, 2), dtype=np.float32):
    return [(np.arange(np.prod(shape)).reshape(shape) * (r + 1) + r).astype(dtype)
            for r in range(WORLD)]


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("op,want", [
    ("Sum", lambda xs: np.sum(xs, 0)), ("Average", lambda xs: np.mean(xs, 0)),
    ("Min", lambda xs: np.min(xs, 0)), ("Max", lambda xs: np.max(xs, 0)),
    ("Product", lambda xs: np.prod(xs, 0))])
def test_allreduce_ops(op, want, graph):
    fn = lambda x: hvd.allreduce(x, op=getattr(hvd, op))    # noqa: E731
    if graph:
        fn = tf.function(fn)
    got = fn(tf.constant(mine())).numpy()
    agree(np.allclose(got, want(np.stack(every()))), f"{op}: {got}")


def test_init_rank_size():
    hvd.init()
    agree(hvd.size() == WORLD and hvd.rank() == RANK and hvd.is_initialized())
    agree(0 <= hvd.local_rank() < hvd.local_size() <= WORLD)
    agree(hvd.mpi_enabled() and hvd.comm() is not None)


def test_allreduce_dtypes_prescale_and_fp16():
    xs = every((4,), np.float64)
    got = hvd.allreduce(tf.constant(mine((4,), np.float64)), op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.5).numpy()
    agree(got.dtype == np.float64 and np.allclose(got, np.sum(xs, 0)))
    ints = hvd.allreduce(tf.constant(mine((4,), np.int64)), op=hvd.Sum).numpy()
    agree(ints.dtype == np.int64 and (ints == np.sum(every((4,), np.int64), 0)).all())
    half = hvd.allreduce(tf.constant(mine((4,))), compression=hvd.Compression.fp16)
    agree(half.dtype == tf.float32 and np.allclose(half.numpy(), np.mean(every((4,)), 0),
                                                   rtol=1e-3))
    bf = hvd.allreduce(tf.constant(mine((4,)), tf.bfloat16), op=hvd.Sum)
    agree(bf.dtype == tf.bfloat16 and np.allclose(bf.numpy().astype(np.float32),
                                                  np.sum(every((4,)), 0), rtol=1e-2))
    with pytest.raises(TypeError, match="op=Sum"):
        hvd.allreduce(tf.constant([1, 2]), op=hvd.Average)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(tf.constant([1.0]), op=hvd.Adasum)


def test_allreduce_gradient_is_the_reduced_gradient():
    x = tf.Variable(mine())
    with tf.GradientTape() as tape:
        y = hvd.allreduce(x * x, op=hvd.Sum)
        loss = tf.reduce_sum(y * (RANK + 1))
    g = tape.gradient(loss, x).numpy()
    total = sum(r + 1 for r in range(WORLD))
    agree(np.allclose(g, 2 * mine() * total), f"{g}")


def test_grouped_allreduce_is_one_collective():
    @tf.function
    def f(a, b):
        return hvd.grouped_allreduce([a, b], op=hvd.Sum)

    a, b = f(tf.constant(mine()), tf.constant(mine((5,), np.float64)))
    agree(np.allclose(a, np.sum(every(), 0)) and np.allclose(b, np.sum(every((5,), np.float64), 0)))
    graph = f.get_concrete_function(tf.TensorSpec([3, 2]), tf.TensorSpec([5], tf.float64)).graph
    agree(sum(op.type == "PyFunc" for op in graph.get_operations()) == 1)


@pytest.mark.parametrize("graph", [False, True])
def test_allgather_uneven_and_broadcast(graph):
    gather = tf.function(hvd.allgather) if graph else hvd.allgather
    got = gather(tf.fill([RANK + 1, 2], RANK)).numpy()
    want = np.concatenate([np.full((r + 1, 2), r) for r in range(WORLD)])
    agree(got.shape == want.shape and (got == want).all(), f"{got}")
    root = WORLD - 1
    b = hvd.broadcast(tf.constant(mine()), root_rank=root).numpy()
    agree((b == every()[root]).all())
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(tf.constant(1.0), root_rank=WORLD)


def test_broadcast_variables_skips_tables():
    v = tf.Variable(mine())
    w = tf.Variable(np.full(3, RANK, np.int64))
    table = de.Variable(dim=2, name="bcast_table", distributed=True)
    hvd.broadcast_variables([v, w, table, table.trainable_handle], root_rank=0)
    agree((v.numpy() == every()[0]).all() and (w.numpy() == 0).all())
    agree(hvd.broadcast_object({"r": RANK}, root_rank=1) == {"r": 1})
    agree(hvd.allgather_object(RANK) == list(range(WORLD)))


def test_mismatched_shapes_raise_on_every_rank():
    """One rank allreduces another shape: every rank raises instead of hanging."""
    from numbaemb._mpi import CollectiveMismatch
    with pytest.raises(CollectiveMismatch, match="allreduce"):
        hvd.allreduce(tf.zeros([2 + RANK]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="different collective"):
        tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum))(tf.zeros([2 + RANK]))
    agree(np.allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), WORLD))   # still in step


def test_distributed_gradient_tape_reduces_dense_and_scales_tables():
    table = de.Variable(dim=2, name="tape_table", initializer=1.0, distributed=True)
    dense = tf.Variable(tf.ones([2]))
    with tf.GradientTape() as tape:
        e = de.embedding_lookup(table, tf.constant([5, 5, RANK], tf.int64))
        loss = tf.reduce_sum(e) + tf.reduce_sum(dense) * (RANK + 1)
    tape = hvd.DistributedGradientTape(tape)
    g_table, g_dense = tape.gradient(loss, [table, dense])
    agree(np.allclose(g_dense.numpy(), np.mean([r + 1 for r in range(WORLD)])))
    vals = dict(zip(g_table.indices.numpy().tolist(), g_table.values.numpy()[:, 0].tolist()))
    want = {5: 2 / WORLD} if RANK == 5 else {5: 2 / WORLD, RANK: 1 / WORLD}
    agree(vals == pytest.approx(want), f"{vals}")
    with pytest.raises(TypeError, match="tf.GradientTape"):
        hvd.DistributedGradientTape(object())


def test_distributed_optimizer_on_plain_keras_model():
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(RANK)       # different start: the callback broadcasts rank 0's
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    agree(type(opt).__name__ == "SGD" and isinstance(opt, keras.optimizers.SGD))
    model.compile(opt, loss="mse")
    x = np.random.default_rng(RANK).normal(size=(8, 3)).astype(np.float32)
    model.fit(x, x[:, :2], batch_size=4, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ws = COMM.allgather([w.numpy() for w in model.weights])
    agree(all(np.allclose(a, b, atol=1e-6) for w in ws for a, b in zip(w, ws[0])),
          "weights diverged across ranks")
