"""numbaemb.optimizers: Keras 3 agreement, TFRA step semantics, argument checking."""
import subprocess
import sys

import numpy as np
import pytest

import numbaemb as ne
from numbaemb.optimizers import (SGD, Adagrad, Adam, Ftrl, RMSprop, apply_gradients,
                                 slot_values)

CONFIGS = {
    "sgd": dict(learning_rate=0.1),
    "sgd_momentum": dict(learning_rate=0.05, momentum=0.9),
    "sgd_nesterov": dict(learning_rate=0.05, momentum=0.8, nesterov=True),
    "adagrad": dict(learning_rate=0.1, initial_accumulator_value=0.2),
    "adam": dict(learning_rate=0.05, beta_1=0.8, beta_2=0.99),
    "adam_amsgrad": dict(learning_rate=0.05, amsgrad=True),
    "ftrl": dict(learning_rate=0.1),
    "ftrl_reg": dict(learning_rate=0.2, learning_rate_power=-0.6, initial_accumulator_value=0.3,
                     l1_regularization_strength=0.01, l2_regularization_strength=0.05,
                     l2_shrinkage_regularization_strength=0.02, beta=0.1),
    "rmsprop": dict(learning_rate=0.01, rho=0.8),
    "rmsprop_momentum": dict(learning_rate=0.01, momentum=0.5),
    "rmsprop_centered": dict(learning_rate=0.01, momentum=0.3, centered=True),
}
CLASSES = {"sgd": SGD, "adagrad": Adagrad, "adam": Adam, "ftrl": Ftrl, "rmsprop": RMSprop}


def _ours(name):
    return CLASSES[name.split("_")[0]](**CONFIGS[name])


def _batch(rng, n_unique, dim):
    """Ids with duplicates (Zipf-like) and extreme values, plus gradients."""
    pool = np.array([0, -1, 2**63 - 1, -2**63] + list(rng.integers(-10**6, 10**6, n_unique - 4)))
    ids = pool[np.minimum(rng.zipf(1.5, (10, 8)), n_unique) - 1]
    ids.flat[:n_unique] = pool                  # every row gets a gradient every step
    return ids, rng.standard_normal(ids.shape + (dim,)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("dim", [1, 10])
def test_ten_steps_match_keras_on_a_dense_variable(name, num_shards, dim):
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(len(name) * 100 + dim)
    ids, _ = _batch(rng, 12, dim)
    uniq, inverse = np.unique(ids, return_inverse=True)
    v = ne.Variable(dim, num_shards=num_shards, seed=3,
                    initializer=ne.initializers.RandomNormal(stddev=0.5))
    dense = tf.Variable(v.lookup(uniq))
    kopt = getattr(keras.optimizers, type(_ours(name)).__name__)(**CONFIGS[name])
    for step in range(1, 11):
        grads = rng.standard_normal(ids.shape + (dim,)).astype(np.float32)
        apply_gradients(v, _ours(name), ids, grads, step=step)
        dense_grad = np.zeros((uniq.shape[0], dim), np.float32)
        np.add.at(dense_grad, inverse.reshape(-1), grads.reshape(-1, dim))
        kopt.apply_gradients([(tf.convert_to_tensor(dense_grad), dense)])
        np.testing.assert_allclose(v.lookup(uniq), dense.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"step {step}")
    assert v.size() == uniq.shape[0]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_result_does_not_depend_on_shard_count(name):
    rng = np.random.default_rng(5)
    ids, grads = _batch(rng, 40, 3)
    out = []
    for n in (1, 3):
        v = ne.Variable(3, num_shards=n, initializer=ne.initializers.RandomUniform(seed=1))
        for step in (1, 2, 3):
            apply_gradients(v, _ours(name), ids, grads * step, step=step)
        out.append((v.lookup(ids), [slot_values(v, _ours(name), s, ids)
                                    for s, _ in _ours(name).slots()]))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    for a, b in zip(out[0][1], out[1][1]):
        np.testing.assert_array_equal(a, b)


def test_step_inserts_batch_ids_and_leaves_others_alone():
    v = ne.Variable(2, num_shards=2, key_dtype=np.int32, initializer=ne.initializers.Constant(1.0))
    v.upsert(np.array([7, 8]), np.full((2, 2), 5.0, np.float32))
    opt = Adagrad(learning_rate=0.5, initial_accumulator_value=0.25)
    apply_gradients(v, opt, np.array([[7, 9], [9, 9]], np.int32), np.ones((2, 2, 2)), step=1)
    assert v.size() == 3
    # 8 predates the slot column: it got the initial accumulator and was not updated
    np.testing.assert_array_equal(v.lookup(np.array([8])), [[5.0, 5.0]])
    np.testing.assert_allclose(slot_values(v, opt, "accumulator", np.array([8, 7, 9, 123])),
                               [[0.25] * 2, [1.25] * 2, [9.25] * 2, [0.25] * 2])
    np.testing.assert_allclose(v.lookup(np.array([7, 9])),
                               [[5 - 0.5 / np.sqrt(1.25)] * 2, [1 - 1.5 / np.sqrt(9.25)] * 2],
                               rtol=1e-6)
    assert {"Adagrad/accumulator"} <= set(v.shards[0].columns) & set(v.shards[1].columns)


def test_learning_rate_override_and_adam_step():
    a, b = ne.Variable(1), ne.Variable(1)
    ids, g = np.array([1]), np.array([[2.0]])
    apply_gradients(a, Adam(learning_rate=0.5), ids, g, step=1)
    apply_gradients(b, Adam(learning_rate=0.001), ids, g, step=1, learning_rate=np.float32(0.5))
    np.testing.assert_allclose(a.lookup(ids), [[-0.5]], rtol=1e-5)   # first Adam step: -lr sign(g)
    np.testing.assert_array_equal(a.lookup(ids), b.lookup(ids))
    apply_gradients(a, SGD(), np.empty((0, 3), np.int64), np.empty((0, 3, 1)), step=1)


@pytest.mark.parametrize("kwargs, exc, word", [
    (dict(ids=np.array([1.5])), TypeError, "ids"),
    (dict(ids=np.array([2**40])), ValueError, "ids"),
    (dict(grads=np.ones((2, 3))), ValueError, "grads"),
    (dict(grads=np.array([["a"] * 2] * 2)), TypeError, "grads"),
    (dict(step=0), ValueError, "step"),
    (dict(step=1.0), TypeError, "step"),
    (dict(learning_rate="x"), TypeError, "learning_rate"),
    (dict(learning_rate=float("nan")), ValueError, "learning_rate"),
    (dict(optimizer="adam"), TypeError, "optimizer"),
    (dict(variable=np.zeros(3)), TypeError, "variable"),
])
def test_bad_arguments_raise_and_apply_nothing(kwargs, exc, word):
    v = ne.Variable(2, key_dtype=np.int32, num_shards=2)
    args = dict(variable=v, optimizer=Adam(), ids=np.array([1, 2]), grads=np.ones((2, 2)),
                step=1) | kwargs
    with pytest.raises(exc, match=word):
        apply_gradients(args.pop("variable"), args.pop("optimizer"), args.pop("ids"),
                        args.pop("grads"), **args)
    assert v.size() == 0 and all(list(s.columns) == ["values"] for s in v.shards)


def test_bad_partitioner_applies_nothing():
    v = ne.Variable(2, num_shards=2, partitioner=lambda k, n: np.full(k.shape, 5))
    with pytest.raises(ValueError, match="partitioner"):
        apply_gradients(v, SGD(), np.array([1]), np.ones((1, 2)), step=1)
    assert all(list(s.columns) == ["values"] for s in v.shards)


def test_config_validation_and_slots():
    with pytest.raises(ValueError, match="momentum"):
        SGD(momentum=1.5)
    with pytest.raises(TypeError, match="nesterov"):
        SGD(nesterov="yes")
    with pytest.raises(ValueError, match="learning_rate_power"):
        Ftrl(learning_rate_power=0.5)
    with pytest.raises(ValueError, match="learning_rate"):
        Ftrl(learning_rate=0.0)
    with pytest.raises(ValueError, match="beta"):
        Adam(beta_2=1.0)
    with pytest.raises(AttributeError):
        Adam().learning_rate = 1.0
    with pytest.raises(ValueError, match="slot_name"):
        slot_values(ne.Variable(1), Adam(), "velocity", np.array([1]))
    assert Adam(amsgrad=True).slots() == (("m", 0.0), ("v", 0.0), ("vhat", 0.0))
    assert SGD().slots() == () and Adam().column("m") == "Adam/m"
    assert [s for s, _ in RMSprop(momentum=0.1, centered=True).slots()] == [
        "velocity", "momentum", "average_gradient"]
    assert isinstance(SGD(learning_rate=1).learning_rate, float)


def test_numbaemb_does_not_import_tensorflow():
    code = "import sys, numbaemb, jit_kernels.optimizers, jit_kernels.segment; " \
           "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _trained(name, steps=3, num_shards=2, **kwargs):
    """A table after ``steps`` steps of ``apply_gradients(**kwargs)`` on batches with
    duplicates (summed per id first when ``kwargs`` assume distinct ids)."""
    rng = np.random.default_rng(11)
    v = ne.Variable(3, num_shards=num_shards, initializer=ne.initializers.RandomNormal(seed=2))
    ids, grads = _batch(rng, 30, 3)
    if kwargs.get("assume_unique"):
        uniq, inverse = np.unique(ids, return_inverse=True)
        sums = np.zeros((uniq.shape[0], 3), np.float32)
        np.add.at(sums, inverse.reshape(-1), grads.reshape(-1, 3))   # in position order
        ids, grads = uniq, sums
    for step in range(1, steps + 1):
        apply_gradients(v, _ours(name), ids, grads * step, step=step, **kwargs)
    return v, np.unique(ids)


def _state(v, name, keys):
    return [v.lookup(keys)] + [slot_values(v, _ours(name), s, keys) for s, _ in _ours(name).slots()]


@pytest.mark.parametrize("name", ["adam_amsgrad", "ftrl_reg", "rmsprop_centered", "sgd_nesterov"])
def test_assume_unique_delta_and_parallel_kernels_give_the_same_table(name, monkeypatch):
    """assume_unique on summed gradients, delta=True (bp_v2) and the parallel drivers
    (PARALLEL_MIN=0) all match the default serial in-place step, bit for bit."""
    from jit_kernels import segment
    ref, keys = _trained(name)
    want = _state(ref, name, keys)
    for kwargs in (dict(assume_unique=True), dict(delta=True),
                   dict(assume_unique=True, delta=True)):
        got = _state(_trained(name, **kwargs)[0], name, keys)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7, err_msg=str(kwargs))
    monkeypatch.setattr(segment, "PARALLEL_MIN", 0)
    for a, b in zip(_state(_trained(name)[0], name, keys), want):
        np.testing.assert_array_equal(a, b)


def test_initial_rows_are_inserted_for_valid_absent_ids_only():
    init = ne.initializers.RandomNormal(seed=4)
    v, w = ne.Variable(2, num_shards=2, initializer=init), ne.Variable(2, num_shards=2,
                                                                       initializer=init)
    for t in (v, w):
        t.upsert(np.array([5]), np.full((1, 2), 3.0, np.float32))
    ids = np.array([5, 6, 7, -8])
    given = np.arange(8, dtype=np.float32).reshape(4, 2) + 100
    valid = np.array([True, True, False, True])
    g = np.ones((4, 2), np.float32)
    apply_gradients(v, SGD(0.5), ids, g, step=1, assume_unique=True, initial_rows=(given, valid))
    apply_gradients(w, SGD(0.5), ids, g, step=1, assume_unique=True)
    # 5 was present (its row is kept), 7 is not valid (initializer), 6 and -8 take the given rows
    np.testing.assert_array_equal(v.lookup(ids), [[2.5, 2.5], given[1] - 0.5,
                                                  w.lookup(np.array([7]))[0], given[3] - 0.5])
    assert slot_values(v, Adam(), "m", ids).shape == (4, 2)
    with pytest.raises(ValueError, match="initial_rows"):
        apply_gradients(v, SGD(), ids, g, step=1, assume_unique=True,
                        initial_rows=(given[:2], valid))
    with pytest.raises(TypeError, match="initial_rows"):
        apply_gradients(v, SGD(), ids, g, step=1, assume_unique=True,
                        initial_rows=(given, valid.astype(int)))


def test_delta_adds_the_change_to_rows_written_meanwhile():
    """delta=True (bp_v2) reads the rows, computes, then adds new - old through accum: a
    write between the read and the accum is kept (in-place would overwrite it)."""
    v = ne.Variable(2, initializer=ne.initializers.Constant(1.0))
    v.upsert(np.array([1]), np.ones((1, 2), np.float32))
    real = v.accum

    def accum(keys, old, new, exists):
        v.upsert(np.array([1]), np.full((1, 2), 10.0, np.float32))   # another writer
        return real(keys, old, new, exists)

    v.accum = accum
    apply_gradients(v, SGD(0.5, momentum=0.5), np.array([1, 2]), np.ones((2, 2)), step=1,
                    delta=True)
    np.testing.assert_array_equal(v.lookup(np.array([1, 2])), [[9.5, 9.5], [0.5, 0.5]])
    np.testing.assert_array_equal(slot_values(v, SGD(0.5, momentum=0.5), "momentum",
                                              np.array([1, 2])), [[-0.5, -0.5]] * 2)


@pytest.mark.parametrize("table", [
    dict(), dict(num_shards=2), dict(value_dtype="float16"), dict(max_capacity=1000),
    dict(max_capacity=8), dict(admit="counter"), dict(delta=True), dict(parallel=True)])
@pytest.mark.parametrize("name", ["adam", "ftrl_reg", "sgd_momentum"])
def test_inverse_sums_positions_in_the_update_like_segment_sum(name, table, monkeypatch):
    """``inverse=``: per-position rows summed inside the step give the bits of
    ``segment_sum`` + ``assume_unique`` on every kind of table (a bounded one that drops
    ids of the batch: ``max_capacity=8``), with the serial and the parallel drivers."""
    from jit_kernels import segment
    from jit_kernels.segment import segment_sum, unique_inverse
    table = dict(table)
    if table.pop("parallel", False):
        monkeypatch.setattr(segment, "PARALLEL_MIN", 0)
    delta = table.pop("delta", False)
    admit = table.pop("admit", None)

    def fresh_table():
        return ne.Variable(4, initializer=ne.initializers.RandomNormal(seed=5), admit=(
            ne.admission.CounterFilter(2) if admit else None), **table)

    rng = np.random.default_rng(3)
    a, b = fresh_table(), fresh_table()
    for step in range(1, 4):
        ids, g = _batch(rng, 40, 4)
        g = (g * 10.0 ** rng.integers(-3, 4, ids.shape + (1,))).astype(np.float32)  # sums
        # then depend on the order of the additions
        uniq, inverse = unique_inverse(ids.reshape(-1))
        sums = segment_sum(g.reshape(-1, 4), inverse, uniq.shape[0], 1)
        apply_gradients(a, _ours(name), uniq, sums, step=step, assume_unique=True, delta=delta)
        apply_gradients(b, _ours(name), uniq, g.reshape(-1, 4), step=step, inverse=inverse,
                        delta=delta)
    keys = np.unique(ids)
    assert a.size() == b.size() > 0
    for x, y in zip(_state(a, name, keys), _state(b, name, keys)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_inverse_on_every_optimizer_and_a_batch_of_parallel_size(name):
    """Every configuration: 2,000 distinct ids of 64 values (the parallel update
    drivers) summed inside the step equal segment_sum + assume_unique, bit for bit."""
    from jit_kernels.segment import segment_sum, unique_inverse
    rng = np.random.default_rng(11)
    tables = [ne.Variable(64, initializer=ne.initializers.RandomNormal(seed=2))
              for _ in range(2)]
    for step in (1, 2):
        ids = np.concatenate([[0, -1, 2**63 - 1, -2**63],
                              rng.integers(0, 2000, 6000), np.arange(2000)])
        g = rng.standard_normal((ids.size, 64)).astype(np.float32)
        uniq, inverse = unique_inverse(ids)
        apply_gradients(tables[0], _ours(name), uniq, segment_sum(g, inverse, uniq.size, 1),
                        step=step, assume_unique=True)
        apply_gradients(tables[1], _ours(name), uniq, g, step=step, inverse=inverse)
    for x, y in zip(_state(tables[0], name, uniq), _state(tables[1], name, uniq)):
        np.testing.assert_array_equal(x, y)


def test_inverse_with_initial_rows_and_bad_inverse_applies_nothing():
    v = ne.Variable(2)
    ids, g = np.array([5, 7]), np.ones((3, 2), np.float32)
    for inverse, exc, word in [(np.array([0, 2, 1]), ValueError, r"\[0, 2\)"),
                               (np.array([0, -1, 1]), ValueError, "inverse"),
                               (np.array([0.0, 1.0, 1.0]), TypeError, "inverse"),
                               (np.array([0, 1]), ValueError,
                                r"grads must have shape inverse\.shape")]:
        with pytest.raises(exc, match=word):
            apply_gradients(v, Adam(), ids, g, step=1, inverse=inverse)
        assert v.size() == 0 and list(v.shards[0].columns) == ["values"]
    init = (np.array([[3.0, 3.0], [0.0, 0.0]], np.float32), np.array([True, False]))
    apply_gradients(v, SGD(1.0), ids, g, step=1, inverse=np.array([0, 1, 0]),
                    initial_rows=init)
    np.testing.assert_array_equal(v.lookup(np.array([5, 7])), [[1.0, 1.0], [-1.0, -1.0]])
