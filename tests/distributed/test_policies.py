"""Restrict policies on tables split across ranks, under mpiexec: owners score what
the ranks sent (as one process fed the ranks' ids in rank order); a restriction keeps
each rank's share of ``num_reserved``, its best-scored keys (TFRA's per-partition
rule); TF training updates the scores as one process trained on the global batch."""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb import policies

from .conftest import COMM, RANK, WORLD, agree, multi_rank

pytestmark = multi_rank
EXTREME = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]


def owned(keys):
    return keys.view(np.uint64) % np.uint64(WORLD) == RANK


def scores_of(v, column):
    keys, cols = v.export(column)
    return dict(zip(keys.tolist(), cols[:, 0].tolist()))


@pytest.mark.parametrize("kind", ["TimestampRestrictPolicy", "FrequencyRestrictPolicy"])
@pytest.mark.parametrize("once", [False, True])
def test_scores_are_one_process_fed_the_ranks_ids(kind, once):
    cls = getattr(policies, kind)
    v = ne.Variable(2, comm=COMM, name=f"pol_{kind}_{once}")
    ref = ne.Variable(2, name="ref")
    p, q = cls(v), cls(ref)
    rng = np.random.default_rng(RANK)
    for step in range(5):
        ids = np.concatenate([rng.integers(-20, 20, 6 + RANK), EXTREME[step % 4:][:2]])
        every = np.concatenate(COMM.allgather(ids))
        v.find_or_insert(ids)
        ref.find_or_insert(every)
        p.update(ids[:-1], once=once)         # (the last id of each rank: never scored)
        q.update(np.concatenate([a[:-1] for a in COMM.allgather(ids)]), once=once)
    want = {k: s for k, s in scores_of(ref, p.column).items() if owned(np.array([k]))[0]}
    agree(scores_of(v, p.column) == want, f"{scores_of(v, p.column)} != {want}")
    assert all(COMM.allgather(getattr(p, "clock", 0) == getattr(q, "clock", 0)))


def test_restriction_keeps_each_ranks_share_of_its_best_keys():
    v = ne.Variable(2, comm=COMM, name="pol_restrict")
    p = policies.FrequencyRestrictPolicy(v)
    keys = np.arange(60, dtype=np.int64) * WORLD + RANK       # 60 keys owned by each rank
    keys[:2] = [EXTREME[RANK % 4], EXTREME[(RANK + 2) % 4]]
    keys = keys[owned(keys)]
    v.find_or_insert(keys)
    for r in range(5):
        p.update(np.repeat(keys, np.arange(keys.shape[0]) % 7 + r))
    size = v.size()
    agree(p.apply_restriction(10, trigger=size) == 0 and v.size() == size)
    before = scores_of(v, p.column)
    removed = p.apply_restriction(10)
    share = 10 // WORLD + (RANK < 10 % WORLD)
    after = scores_of(v, p.column)
    agree(removed == size - 10 and v.size() == 10 and len(after) == share, (removed, after))
    dropped = set(before) - set(after)
    agree(min(after.values()) >= max(before[k] for k in dropped), (after, dropped))
    gone = v.local.lookup(np.array(sorted(dropped), np.int64), return_exists=True)[1]
    assert all(COMM.allgather(len(dropped) > 0 and not gone.any()))


@pytest.mark.parametrize("policy", ["TimestampRestrictPolicy", "FrequencyRestrictPolicy"])
def test_tf_training_scores_as_one_process_on_the_global_batch(policy):
    """de.Variable(distributed=True, restrict_policy=...) trained in a tf.function
    (each rank its share of the global batch, Sum of gradients): the owners' scores are
    those of one process trained on the global batch; ``restrict`` keeps each rank's
    share of its best keys, on every rank alike."""
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    de = pytest.importorskip("tf_bridge")
    hvd = de.distributed
    cls = getattr(de, policy)
    v = de.Variable(dim=2, name=f"pol_tf_{policy}", initializer=0.5, distributed=True,
                    restrict_policy=cls)
    ref = de.Variable(dim=2, name=f"pol_tf_ref_{policy}", initializer=0.5, restrict_policy=cls)
    opt, ref_opt = (de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)) for _ in "ab")

    def stepper(var, o, tape_wrap):
        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(de.embedding_lookup(var, ids))
            o.apply_gradients(zip(tape_wrap(tape).gradient(loss, [var]), [var]))
        return step

    step = stepper(v, opt, lambda t: hvd.DistributedGradientTape(t, op=hvd.Sum))
    ref_step = stepper(ref, ref_opt, lambda t: t)
    rng = np.random.default_rng(9)
    for s in range(6):
        batch = np.concatenate([rng.integers(0, 30 + 5 * s, 4 * WORLD), EXTREME])
        batch = rng.permutation(batch)
        share = np.array_split(batch, WORLD)[RANK]
        step(tf.constant(share))
        ref_step(tf.constant(batch))
    column = v.restrict_policy.policy.column
    want = {k: s for k, s in scores_of(ref.table, column).items() if owned(np.array([k]))[0]}
    agree(scores_of(v.table, column) == want, f"{scores_of(v.table, column)} != {want}")
    size = v.size().numpy()
    removed = [int(v.restrict(6).numpy())]
    gathered = COMM.allgather(removed)                 # the same on every rank
    assert gathered == [[size - 6]] * WORLD and int(v.size().numpy()) == 6, gathered


def test_checkpoint_keeps_the_policy_on_the_restored_table(tmp_path_factory):
    """hvd.Checkpoint of a split table with a timestamp policy: after the restore the
    policy scores the restored table (its ids' stamps kept, later steps' above them),
    and restrict keeps the ids trained since."""
    from .conftest import shared_tmpdir
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    de = pytest.importorskip("tf_bridge")
    hvd = de.distributed
    d = shared_tmpdir(tmp_path_factory)

    def make():
        return de.Variable(dim=2, name="pol_ckpt", initializer=0.5, distributed=True,
                           restrict_policy=de.TimestampRestrictPolicy)

    def train(var, opt, ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(de.embedding_lookup(var, tf.constant(ids, tf.int64)))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))

    v = make()
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    for s in range(3):
        train(v, opt, np.arange(10 * s, 10 * s + 10) + 100 * RANK)
    column = v.restrict_policy.policy.column
    saved = scores_of(v.table, column)
    path = hvd.Checkpoint(emb=v).save(f"{d}/ckpt")
    w = make()
    hvd.Checkpoint(emb=w).restore(path)
    agree(w.restrict_policy.policy.variable is w.table, "the policy scores another table")
    agree(scores_of(w.table, column) == saved)
    new = 1000 * WORLD + np.arange(5) * WORLD + RANK       # 5 new ids owned by each rank
    train(w, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), new)
    w.restrict(5 * WORLD)
    every = sorted(k for ks in COMM.allgather(w.table.export()[0].tolist()) for k in ks)
    want = list(range(1000 * WORLD, 1005 * WORLD))
    assert every == want, f"{every} != {want}"          # (gathered: every rank alike)


def test_keras_file_keeps_the_policy_clock(tmp_path_factory):
    """hvd.save_model / hvd.load_model of a model with a split, timestamp-restricted
    layer: every rank's policy clock is past every restored stamp (all ranks'), so
    ids trained after the load outlast the restored ones."""
    from .conftest import shared_tmpdir
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    de = pytest.importorskip("tf_bridge")
    hvd = de.distributed
    d = shared_tmpdir(tmp_path_factory)

    def fit(model, ids):
        model.fit(ids.reshape(-1, 1), np.ones((ids.shape[0], 1)), batch_size=ids.shape[0],
                  verbose=0, shuffle=False)

    ids = keras.Input((1,), dtype="int64")
    emb = de.keras.layers.Embedding(2, name="pol_keras", distributed=True,
                                    restrict_policy="TimestampRestrictPolicy")
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(emb(ids))))
    model.compile(hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(
        keras.optimizers.SGD(0.1))), loss="mse")
    for s in range(3):
        fit(model, np.arange(4) + 10 * s + 100 * RANK)
    hvd.save_model(model, f"{d}/m.keras")
    loaded = hvd.load_model(f"{d}/m.keras")
    var = loaded.get_layer("pol_keras").params
    stamps = COMM.allgather(var.table.export(var.restrict_policy.policy.column)[1].max())
    agree(var.restrict_policy.policy.clock == max(stamps) == 3, (stamps,
                                                               var.restrict_policy.policy.clock))
    new = 1000 * WORLD + np.arange(2) * WORLD + RANK
    fit(loaded, new)
    var.restrict(2 * WORLD)
    every = sorted(k for ks in COMM.allgather(var.table.export()[0].tolist()) for k in ks)
    assert every == list(range(1000 * WORLD, 1002 * WORLD)), every   # (every rank alike)
