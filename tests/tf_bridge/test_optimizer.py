"""de.DynamicEmbeddingOptimizer: Keras 3 agreement on dense twins (TFRA's optimizer test),
schedules, mixed dense + dynamic variables, TFRA step semantics, bp_v2, bad input."""
import itertools
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import numbaemb as ne
import tf_bridge as de
from tf_bridge.optimizer import translate

_names = itertools.count()


pytestmark = pytest.mark.usefixtures("one_numba_thread")   # tests/tf_bridge/conftest.py

CONFIGS = {
    "sgd": ("SGD", dict(learning_rate=0.1)),
    "sgd_momentum": ("SGD", dict(learning_rate=0.05, momentum=0.9)),
    "sgd_nesterov": ("SGD", dict(learning_rate=0.05, momentum=0.8, nesterov=True)),
    "adagrad": ("Adagrad", dict(learning_rate=0.1, initial_accumulator_value=0.2, epsilon=1e-6)),
    "adam": ("Adam", dict(learning_rate=0.05, beta_1=0.8, beta_2=0.99, epsilon=1e-6)),
    "adam_amsgrad": ("Adam", dict(learning_rate=0.05, amsgrad=True)),
    "ftrl": ("Ftrl", dict(learning_rate=0.1)),
    "ftrl_reg": ("Ftrl", dict(learning_rate=0.2, learning_rate_power=-0.6,
                              initial_accumulator_value=0.3, l1_regularization_strength=0.01,
                              l2_regularization_strength=0.05,
                              l2_shrinkage_regularization_strength=0.02, beta=0.1)),
    "rmsprop": ("RMSprop", dict(learning_rate=0.01, rho=0.8)),
    "rmsprop_centered": ("RMSprop", dict(learning_rate=0.01, momentum=0.3, centered=True)),
}


def keras_opt(name, **over):
    cls, kw = CONFIGS[name]
    return getattr(keras.optimizers, cls)(**{**kw, **over})


def var(dim=4, **kw):
    kw.setdefault("name", f"topt{next(_names)}")
    kw.setdefault("initializer", tf.keras.initializers.RandomNormal(stddev=0.5, seed=3))
    return de.Variable(dim=dim, **kw)


def batch(rng):
    """(4, 3) ids with duplicates and extreme keys; every distinct id occurs every step."""
    pool = np.array([0, -1, 2**63 - 1, -2**63, 17, 123456789], np.int64)
    ids = np.concatenate([pool, rng.choice(pool, 6)])
    return tf.constant(rng.permutation(ids).reshape(4, 3)), np.unique(pool)


def loss_of(emb, w):
    return tf.reduce_sum(emb * w) + 0.5 * tf.reduce_sum(emb * emb * emb)


def train_pair(name, v, steps, rng, graph=False, **over):
    """``steps`` steps on dynamic ``v`` and on its dense twin (same rows, same ids, a
    cubic loss); yields after each step."""
    ids, uniq = batch(rng)
    pos = tf.constant(np.searchsorted(uniq, ids.numpy()))
    dense = tf.Variable(v.lookup(uniq))
    opt = de.DynamicEmbeddingOptimizer(keras_opt(name, **over))
    ref = keras_opt(name, **over)

    def step(w):
        with tf.GradientTape() as tape:
            loss = loss_of(de.embedding_lookup(v, ids), w)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        with tf.GradientTape() as tape:
            loss = loss_of(tf.gather(dense, pos), w)
        # dense: Keras squares IndexedSlices values before summing duplicates (Adagrad, ...)
        ref.apply_gradients([(tf.convert_to_tensor(tape.gradient(loss, dense)), dense)])

    step = tf.function(step) if graph else step
    for i in range(steps):
        step(tf.constant(rng.standard_normal(ids.shape + (v.dim,)), v.value_dtype))
        yield i, uniq, dense, opt, ref


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("dim", [1, 10])
def test_ten_steps_equal_keras_on_a_dense_variable(name, num_shards, dim):
    v = var(dim, num_shards=num_shards)
    for i, uniq, dense, opt, _ in train_pair(name, v, 10, np.random.default_rng(dim + num_shards)):
        np.testing.assert_allclose(v.lookup(uniq).numpy(), dense.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: step {i + 1}")
    assert int(v.size()) == uniq.shape[0] and int(opt.iterations) == 10


@pytest.mark.parametrize("name", ["adam", "ftrl_reg", "sgd_nesterov"])
def test_inside_tf_function_float64_and_int32_keys(name):
    v = var(3, num_shards=2, value_dtype=tf.float64)
    for i, uniq, dense, _, _ in train_pair(name, v, 4, np.random.default_rng(1), graph=True):
        # (Keras rounds some float64 Adam / FTRL constants to float32: the updates are
        # ~1e-7 apart, relative to the update, so a value near 0 needs an absolute bound)
        np.testing.assert_allclose(v.lookup(uniq).numpy(), dense.numpy(), rtol=1e-6, atol=1e-7)
    w = var(2, key_dtype=tf.int32)
    opt = de.DynamicEmbeddingOptimizer(keras_opt(name))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(de.embedding_lookup(w, ids) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))

    step(tf.constant([[5, -7], [5, 2**31 - 1]], tf.int32))
    assert sorted(w.export()[0].numpy().tolist()) == [-7, 5, 2**31 - 1]


def test_learning_rate_schedule_and_assigned_learning_rate():
    sched = dict(learning_rate=keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5))
    v = var(3)
    pairs = train_pair("adam", v, 6, np.random.default_rng(2), **sched)
    for i, uniq, dense, opt, _ in pairs:
        np.testing.assert_allclose(v.lookup(uniq).numpy(), dense.numpy(), rtol=1e-5, atol=1e-6)
    assert float(opt.learning_rate) == pytest.approx(0.1 * 0.5 ** 3)
    v = var(3)
    for i, uniq, dense, opt, ref in train_pair("sgd_momentum", v, 4, np.random.default_rng(3)):
        if i == 1:     # a float learning rate is a variable: assigning it takes effect
            opt.learning_rate = ref.learning_rate = 0.5
        np.testing.assert_allclose(v.lookup(uniq).numpy(), dense.numpy(), rtol=1e-5, atol=1e-6)
    assert float(opt.inner_optimizer.learning_rate) == 0.5


def test_mixed_dense_and_dynamic_variables_share_step_and_learning_rate():
    rng = np.random.default_rng(4)
    v = var(2)
    ids = tf.constant([[3, 9], [9, 4]], tf.int64)
    uniq = np.array([3, 4, 9])
    pos = tf.constant(np.searchsorted(uniq, ids.numpy()))
    kernel = tf.Variable(rng.standard_normal((2, 1)), dtype=tf.float32)
    twin_rows, twin_kernel = tf.Variable(v.lookup(uniq)), tf.Variable(kernel)
    sched = keras.optimizers.schedules.PiecewiseConstantDecay([2], [0.1, 0.01])
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(sched))
    ref = keras.optimizers.Adam(sched)
    for _ in range(4):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.reshape(de.embedding_lookup(v, ids), [-1, 2]),
                                           kernel) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [kernel, v]), [kernel, v]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.reshape(tf.gather(twin_rows, pos), [-1, 2]),
                                           twin_kernel) ** 2)
        gk, gr = tape.gradient(loss, [twin_kernel, twin_rows])
        ref.apply_gradients([(gk, twin_kernel), (tf.convert_to_tensor(gr), twin_rows)])
        np.testing.assert_allclose(kernel.numpy(), twin_kernel.numpy(), rtol=1e-5)
        np.testing.assert_allclose(v.lookup(uniq).numpy(), twin_rows.numpy(), rtol=1e-5)
    assert int(opt.iterations) == int(opt.inner_optimizer.iterations) == 4
    # only the dense variable got Keras slots; the table holds the dynamic ones
    assert [tuple(x.shape) for x in opt.inner_optimizer.variables if len(x.shape)] == [(2, 1)] * 2
    assert opt.get_slot(v, "m", uniq).shape == (3, 2)


def test_every_id_of_the_batch_exists_in_the_table_and_its_slots_after_a_step():
    v = var(3, num_shards=2)
    v.upsert(tf.constant([100], tf.int64), tf.ones([1, 3]))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    ids = tf.constant([[7, -7], [7, 2**62]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(v, ids) ** 2)
    grads = tape.gradient(loss, [v])
    assert int(v.size()) == 1                        # the lookup inserted nothing
    opt.apply_gradients(zip(grads, [v]))
    batch_ids = tf.constant([7, -7, 2**62], tf.int64)
    assert v.lookup(batch_ids, return_exists=True)[1].numpy().all()
    assert sorted(v.export()[0].numpy().tolist()) == [-7, 7, 100, 2**62]
    for slot in ("m", "v"):
        assert np.all(opt.get_slot(v, slot, batch_ids).numpy() != 0)
        assert np.all(opt.get_slot(v, slot, [100]).numpy() == 0)        # not in the batch
    np.testing.assert_array_equal(v.lookup([100]).numpy(), np.ones((1, 3)))
    for shard in v.table.shards:                     # row-aligned slot columns, every shard
        assert {"Adam/m", "Adam/v"} <= set(shard.columns)


def test_callable_initializer_trains_the_rows_the_loss_saw():
    v = var(2, initializer=lambda shape, dtype=None: np.random.default_rng().random(shape))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    ids = tf.constant([1, 2], tf.int64)
    with tf.GradientTape() as tape:
        e = de.embedding_lookup(v, ids)
        loss = tf.reduce_sum(e)
    seen = e.numpy()
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    np.testing.assert_allclose(v.lookup(ids).numpy(), seen - 1.0, rtol=1e-6)


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "adam_amsgrad", "ftrl_reg",
                                  "rmsprop_centered", "adagrad"])
def test_bp_v2_matches_in_place_updates_and_goes_through_accum(name, monkeypatch):
    rng = np.random.default_rng(6)
    a, b = var(3, num_shards=2, bp_v2=True), var(3, num_shards=2)
    opt_a = de.DynamicEmbeddingOptimizer(keras_opt(name))
    opt_b = de.DynamicEmbeddingOptimizer(keras_opt(name))
    calls = []
    accum = a.table.accum
    monkeypatch.setattr(a.table, "accum", lambda *args: (calls.append(1), accum(*args))[1])
    monkeypatch.setattr(ne.optimizers, "apply_gradients", _forbid_for(a, ne.optimizers.apply_gradients))
    for step in range(4):
        ids = tf.constant(rng.integers(-3, 4, (3, 4)))
        w = tf.constant(rng.standard_normal((3, 4, 3)), tf.float32)
        for v, opt in ((a, opt_a), (b, opt_b)):
            with tf.GradientTape() as tape:
                loss = loss_of(de.embedding_lookup(v, ids), w)
            opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    keys = tf.range(-3, 4, dtype=tf.int64)
    assert len(calls) == 4 and int(a.size()) == int(b.size())
    np.testing.assert_allclose(a.lookup(keys).numpy(), b.lookup(keys).numpy(), rtol=1e-6)
    for slot, _ in opt_a.rule.slots():
        np.testing.assert_allclose(opt_a.get_slot(a, slot, keys).numpy(),
                                   opt_b.get_slot(b, slot, keys).numpy(), rtol=1e-6)


def _forbid_for(v, fn):
    def apply(variable, *args, **kwargs):
        assert variable is not v.table or kwargs.get("delta"), \
            "bp_v2 must not write rows in place"
        return fn(variable, *args, **kwargs)
    return apply


def test_bp_v2_adds_the_change_to_rows_written_meanwhile_and_resets_slots_of_new_ids():
    v = var(2, bp_v2=True, initializer=0.0)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5, momentum=0.5))
    ids = tf.constant([1, 2], tf.int64)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(de.embedding_lookup(v, ids))
        g = tape.gradient(loss, [v])
        opt.apply_gradients(zip(g, [v]))
    # momentum after two unit-gradient steps: -0.5 then -0.75; weights -1.25
    np.testing.assert_allclose(v.lookup(ids).numpy(), np.full((2, 2), -1.25))
    v.remove(tf.constant([2], tf.int64))              # 2 comes back with fresh slots
    opt.apply_gradients(zip(g, [v]))
    np.testing.assert_allclose(v.lookup(ids).numpy(), [[-1.25 - 0.875] * 2, [-0.5] * 2])
    np.testing.assert_allclose(opt.get_slot(v, "momentum", ids).numpy(), [[-0.875] * 2, [-0.5] * 2])


def test_optimizer_bp_v2_argument_overrides_the_variable(monkeypatch):
    v = var(2)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1), bp_v2=True)
    calls = []
    accum = v.table.accum
    monkeypatch.setattr(v.table, "accum", lambda *args: (calls.append(1), accum(*args))[1])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(v, tf.constant([4], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    assert calls == [1]
    assert {"Adam/m", "Adam/v"} <= set(v.table.shards[0].columns)     # slots: table columns
    assert np.all(opt.get_slot(v, "m", [4]).numpy() != 0)


@pytest.mark.parametrize("name", ["adam_amsgrad", "ftrl_reg", "sgd_momentum"])
def test_bp_v2_slots_round_trip_through_a_tf_checkpoint(name, tmp_path):
    """bp_v2 slots are columns of the variable's table, so tf.train.Checkpoint saves them:
    a restored copy (other shard count, fresh optimizer) continues exactly as the original."""
    rng = np.random.default_rng(8)
    a = var(3, bp_v2=True, num_shards=2)
    opt_a = de.DynamicEmbeddingOptimizer(keras_opt(name))
    batches = [(tf.constant(rng.integers(-4, 5, (3, 4))),
                tf.constant(rng.standard_normal((3, 4, 3)), tf.float32)) for _ in range(4)]

    def train(v, opt, ids, w):
        with tf.GradientTape() as tape:
            loss = loss_of(de.embedding_lookup(v, ids), w)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    for ids, w in batches[:3]:
        train(a, opt_a, ids, w)
    path = tf.train.Checkpoint(emb=a, opt=opt_a.inner_optimizer).save(str(tmp_path / "ck"))
    b = var(3, bp_v2=True, num_shards=3, name=f"topt{next(_names)}")
    opt_b = de.DynamicEmbeddingOptimizer(keras_opt(name))
    tf.train.Checkpoint(emb=b, opt=opt_b.inner_optimizer).restore(path)
    keys = tf.range(-4, 5, dtype=tf.int64)
    for slot, _ in opt_a.rule.slots():
        assert np.any(opt_a.get_slot(a, slot, keys).numpy() != dict(opt_a.rule.slots())[slot])
        np.testing.assert_array_equal(opt_b.get_slot(b, slot, keys).numpy(),
                                      opt_a.get_slot(a, slot, keys).numpy(), err_msg=slot)
    assert int(opt_b.iterations) == 3
    train(a, opt_a, *batches[3])
    train(b, opt_b, *batches[3])
    np.testing.assert_allclose(b.lookup(keys).numpy(), a.lookup(keys).numpy(), rtol=1e-6)
    for slot, _ in opt_a.rule.slots():
        np.testing.assert_allclose(opt_b.get_slot(b, slot, keys).numpy(),
                                   opt_a.get_slot(a, slot, keys).numpy(), rtol=1e-6)


def test_distinct_gradient_keys_skip_the_unique_pass(monkeypatch):
    """The lookup's gradient keys are distinct: the wrapper applies them with
    assume_unique=True; gradients concatenated from two lookups are not distinct."""
    seen = {}
    apply = ne.optimizers.apply_gradients

    def spy(variable, optimizer, ids, grads, **kw):
        seen[variable] = kw["assume_unique"]
        return apply(variable, optimizer, ids, grads, **kw)

    monkeypatch.setattr(ne.optimizers, "apply_gradients", spy)
    v, w = var(2, initializer=0.0), var(2, initializer=0.0)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    ids = tf.constant([[3, 4], [4, 4]], tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            once = tf.reduce_sum(de.embedding_lookup(v, ids))
            twice = tf.reduce_sum(de.embedding_lookup(w, ids)) + tf.reduce_sum(
                de.embedding_lookup(w, ids + 1))
            loss = once + twice
        opt.apply_gradients(zip(tape.gradient(loss, [v, w]), [v, w]))

    step()
    assert seen == {v.table: True, w.table: False}
    np.testing.assert_array_equal(v.lookup(tf.constant([3, 4], tf.int64)).numpy(),
                                  [[-1, -1], [-3, -3]])
    np.testing.assert_array_equal(w.lookup(tf.constant([3, 4, 5], tf.int64)).numpy(),
                                  [[-1, -1], [-4, -4], [-3, -3]])


def test_translate_reads_hyper_parameters_and_config_round_trips():
    k = keras.optimizers.Ftrl(0.5, learning_rate_power=-0.6, beta=0.1, l1_regularization_strength=0.01)
    assert translate(k) == ne.optimizers.Ftrl(0.5, learning_rate_power=-0.6, beta=0.1,
                                              l1_regularization_strength=0.01)
    assert translate(keras.optimizers.RMSprop(0.25, momentum=0.3, centered=True)) == \
        ne.optimizers.RMSprop(0.25, momentum=0.3, centered=True)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01, beta_1=0.7), bp_v2=True)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(again, de.DynamicEmbeddingOptimizer) and again.rule == opt.rule
    assert again.get_config()["bp_v2"] is True


@pytest.mark.parametrize("bad, exc, word", [
    ("adam", TypeError, "Keras 3 optimizer"),
    (keras.optimizers.Nadam(), TypeError, "Nadam"),
    (keras.optimizers.AdamW(), TypeError, "AdamW"),
    (tf.keras.optimizers.Adamax(), TypeError, "Adamax"),
    (keras.optimizers.Adam(weight_decay=0.1), ValueError, "weight_decay"),
    (keras.optimizers.SGD(use_ema=True), ValueError, "use_ema"),
    (keras.optimizers.SGD(global_clipnorm=1.0), ValueError, "global_clipnorm"),
    (keras.optimizers.SGD(gradient_accumulation_steps=2), ValueError, "gradient_accumulation"),
])
def test_unsupported_optimizers_raise_naming_them(bad, exc, word):
    with pytest.raises(exc, match=word):
        de.DynamicEmbeddingOptimizer(bad)


def test_bad_arguments_raise_and_apply_nothing():
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam())
    with pytest.raises(TypeError, match="already"):
        de.DynamicEmbeddingOptimizer(opt)
    with pytest.raises(TypeError, match="bp_v2"):
        de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(), bp_v2="yes")
    v = var(2)
    with pytest.raises(TypeError, match="IndexedSlices"):
        opt.apply_gradients([(tf.ones([1, 2]), v)])
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        opt.apply_gradients([(tf.IndexedSlices(tf.ones([1, 3]), tf.constant([1], tf.int64)), v)])
    with pytest.raises(ValueError, match="No gradients"):
        opt.apply_gradients([(None, v)])
    with pytest.raises(ValueError, match="2 gradients for 1"):
        opt.apply([None, None], [v])
    assert int(v.size()) == 0 and int(opt.iterations) == 0
    ftrl = de.DynamicEmbeddingOptimizer(keras.optimizers.Ftrl(0.1))
    ftrl.learning_rate = 0.0
    with pytest.raises(ValueError, match="learning_rate"):
        ftrl.apply_gradients([(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), v)])
    assert int(v.size()) == 0


def test_clipping_and_loss_scale_apply_to_summed_rows():
    v = var(2, initializer=0.0)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0, clipnorm=1.0,
                                                            loss_scale_factor=4.0))
    g = tf.IndexedSlices(tf.constant([[12.0, 16.0]]), tf.constant([5], tf.int64))
    opt.apply_gradients([(g, v)])                    # unscaled [3, 4], clipped to norm 1
    np.testing.assert_allclose(v.lookup([5]).numpy(), [[-0.6, -0.8]], rtol=1e-6)
    assert float(opt.scale_loss(tf.constant(1.0))) == 4.0


@pytest.mark.parametrize("graph", [False, True])
def test_initial_rows_of_the_lookup_are_inserted_bit_for_bit(graph, monkeypatch):
    """The step inserts absent ids with the initial rows the lookup computed (not drawn
    again): the table equals a twin whose step draws them, bit for bit; an id that was
    present at the lookup and removed before the step gets its initial value."""
    from tf_bridge import lookup
    init = tf.keras.initializers.RandomNormal(stddev=0.5, seed=5)
    a, b = var(3, initializer=init, name="fresh_a", seed=9), var(3, initializer=init,
                                                                name="fresh_b", seed=9)
    ids = tf.constant([[7, -7, 7], [2**40, 1, 1]], tf.int64)
    for v in (a, b):
        v.upsert(tf.constant([1], tf.int64), tf.fill([1, 3], 4.0))
    drawn = []
    take = lookup.take_fresh

    def take_fresh(params, keys):
        got = take(params, keys)
        drawn.append(got is not None)
        return None if params is b else got

    monkeypatch.setattr(sys.modules["tf_bridge.optimizer"], "take_fresh", take_fresh)
    opts = {a: de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)),
            b: de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))}

    def step(v, remove):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(de.embedding_lookup(v, ids) ** 2)
        if remove:
            v.remove(tf.constant([1], tf.int64))
        opts[v].apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step = tf.function(step) if graph else step
    for v in (a, b):
        step(v, True)
        step(v, False)
    assert drawn == [True, False, True, False]       # the second steps have no absent id
    keys = tf.constant([7, -7, 2**40, 1], tf.int64)
    np.testing.assert_array_equal(a.lookup(keys).numpy(), b.lookup(keys).numpy())
    for slot in ("m", "v"):
        np.testing.assert_array_equal(opts[a].get_slot(a, slot, keys).numpy(),
                                      opts[b].get_slot(b, slot, keys).numpy())
    assert np.all(a.lookup(keys).numpy()[3] != 4.0)      # 1 came back from its initial value


def _fit_twice(name, opt, monkeypatch, fused, direct=True):
    """Table rows, slots, dense kernel and predictions after ``model.fit`` with
    ``FUSED = fused`` and ``DIRECT_FORWARD = direct``, and how often the separate
    gradient-sum op ran."""
    import tf_bridge.lookup as lk
    import tf_bridge.optimizer as top
    monkeypatch.setattr(top, "FUSED", fused)
    monkeypatch.setattr(lk, "DIRECT_FORWARD", direct)
    ran = []
    sums = lk.segment_sum_into
    monkeypatch.setattr(lk, "segment_sum_into", lambda *a: ran.append(1) or sums(*a))
    keras.utils.set_random_seed(0)
    inp = keras.Input((3,), dtype="int64")
    emb = de.keras.layers.Embedding(4, name=name, initializer=keras.initializers.RandomNormal(
        seed=1))
    out = keras.layers.Dense(1, kernel_initializer="ones")(keras.layers.Flatten()(emb(inp)))
    model = keras.Model(inp, out)
    dyn = de.DynamicEmbeddingOptimizer(opt)
    model.compile(dyn, "mse")
    rng = np.random.default_rng(0)
    x = rng.zipf(1.3, (96, 3)) % 50 - 25                  # negative ids and repeats
    x[0] = [2**63 - 1, -2**63, -1]
    y = rng.random((96, 1)).astype(np.float32)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
    keys = tf.constant(np.unique(x), tf.int64)
    slots = [dyn.get_slot(emb.params, s, keys).numpy() for s, _ in dyn.rule.slots()]
    seen = model.predict(x[:40] + 3, verbose=0)             # absent ids among them
    return ([emb.params.lookup(keys).numpy(), model.layers[-1].kernel.numpy(), seen] + slots,
            len(ran))


@pytest.mark.parametrize("make", [lambda: keras.optimizers.Adam(0.05),
                                  lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
                                  lambda: keras.optimizers.RMSprop(0.01, momentum=0.5)],
                         ids=["adam", "ftrl", "rmsprop"])
def test_keras_step_sums_the_gradient_in_the_update_bit_for_bit(make, monkeypatch):
    """model.fit: the optimizer sums the lookup's output gradient per id in its update
    pass and the separate sum op is pruned from the step (FUSED); the forward takes every
    position's row from the table (DIRECT_FORWARD).  Tables, slots, dense weights and
    predictions equal those of the separate op and the spread of distinct rows, bit for
    bit."""
    name = type(make()).__name__
    plain, ran_plain = _fit_twice("plain_" + name, make(), monkeypatch, False, False)
    assert ran_plain == 6                                    # 3 steps x 2 epochs
    for fused, direct in [(True, False), (False, True), (True, True)]:
        got, ran = _fit_twice(f"{name}_{fused}_{direct}", make(), monkeypatch, fused, direct)
        assert ran == (0 if fused else 6)
        for a, b in zip(got, plain):
            np.testing.assert_array_equal(a, b)


def test_clipped_steps_keep_the_separate_sum(monkeypatch):
    """Clipping acts on each id's summed row, so that step sums first (the op runs)."""
    _, ran = _fit_twice("clipped", keras.optimizers.SGD(0.1, clipvalue=0.01), monkeypatch, True)
    assert ran == 6


def test_one_call_for_all_tables_equals_one_call_per_table(monkeypatch):
    """BATCHED: a step applies every table of the process in one numpy_function; the
    tables, slots and dense weights equal those of one call per table, bit for bit."""
    import tf_bridge.optimizer as top

    def fit(batched, tag):
        monkeypatch.setattr(top, "BATCHED", batched)
        keras.utils.set_random_seed(0)
        inp = keras.Input((3,), dtype="int64")
        embs = [de.keras.layers.Embedding(4, name=f"{tag}_{f}", initializer=keras.initializers
                                          .RandomNormal(seed=f)) for f in range(3)]
        cols = [keras.layers.Flatten()(e(inp[:, f:f + 1])) for f, e in enumerate(embs)]
        model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Concatenate()(cols)))
        dyn = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
        model.compile(dyn, "mse")
        rng = np.random.default_rng(1)
        x = rng.zipf(1.3, (96, 3)) % 40 - 20
        model.fit(x, rng.random((96, 1)), batch_size=32, epochs=2, verbose=0, shuffle=False)
        keys = tf.constant(np.arange(-20, 20), tf.int64)
        return [e.params.lookup(keys).numpy() for e in embs] + [
            dyn.get_slot(e.params, "accumulator", keys).numpy() for e in embs] + [
            model.layers[-1].kernel.numpy()]

    for a, b in zip(fit(True, "batched"), fit(False, "single")):
        np.testing.assert_array_equal(a, b)
