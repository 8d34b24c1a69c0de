"""de.TimestampRestrictPolicy / FrequencyRestrictPolicy and Variable.restrict: a dict oracle
for the kept keys; evicted keys leave the table and every optimizer slot."""
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de

_names = itertools.count()


pytestmark = pytest.mark.usefixtures("one_numba_thread")   # tests/tf_bridge/conftest.py


def var(policy, **kw):
    return de.Variable(dim=2, name=f"trs{next(_names)}", restrict_policy=policy,
                       initializer=0.5, **kw)


def train(v, opt, ids):
    ids = tf.constant(ids, tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(v, ids) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))


STEPS = [[1, 2, 3, 4], [2, 5], [5, 6, 6], [1, 5], [7, 2, 2, 2]]


def oracle(kind, steps, num_reserved):
    """Keys kept: the best ``num_reserved`` scores (a step counts once per distinct id);
    the cut must not split a tie."""
    score = {}
    for t, ids in enumerate(steps, 1):
        for k in set(ids):
            score[k] = score.get(k, 0) + 1 if kind == "frequency" else t
    ranked = sorted(score, key=lambda k: -score[k])
    assert score[ranked[num_reserved - 1]] != score[ranked[num_reserved]]
    return set(ranked[:num_reserved])


@pytest.mark.parametrize("policy, kind, n", [(de.TimestampRestrictPolicy, "timestamp", 4),
                                             (de.FrequencyRestrictPolicy, "frequency", 3)])
@pytest.mark.parametrize("num_shards", [1, 2])
def test_restrict_keeps_the_best_keys_and_drops_their_slots(policy, kind, n, num_shards):
    v = var(policy, num_shards=num_shards)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    for ids in STEPS:
        train(v, opt, ids)
    keep = oracle(kind, STEPS, n)
    assert int(v.restrict(n)) == 7 - n
    assert set(v.export()[0].numpy().tolist()) == keep
    gone = np.array(sorted({1, 2, 3, 4, 5, 6, 7} - keep))
    for slot in ("m", "v"):
        assert np.all(opt.get_slot(v, slot, gone).numpy() == 0)       # slot rows went too
        assert np.all(opt.get_slot(v, slot, np.array(sorted(keep))).numpy() != 0)
    # an evicted key comes back as new: initial value 0.5, fresh slots (m = v = 0), step 6
    train(v, opt, gone[:1])
    g, t = 1.0, 6
    want = 0.5 - 0.1 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * 0.1 * g / (np.sqrt(0.001) * g + 1e-7)
    np.testing.assert_allclose(v.lookup(gone[:1]).numpy(), [[want, want]], rtol=1e-5)


def test_trigger_delays_restriction_and_no_policy_returns_none():
    v = var(de.TimestampRestrictPolicy)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    train(v, opt, [1, 2, 3])
    assert int(v.restrict(1, trigger=3)) == 0 and int(v.size()) == 3
    train(v, opt, [4])
    assert int(v.restrict(1, trigger=3)) == 3
    assert v.export()[0].numpy().tolist() == [4]
    assert var(None).restrict(1) is None


def test_restrict_inside_tf_function_and_apply_update():
    v = var(de.FrequencyRestrictPolicy)
    v.upsert(tf.constant([10, 20, 30], tf.int64), tf.ones([3, 2]))
    v.restrict_policy.apply_update(tf.constant([[30, 30], [20, 10]], tf.int64))
    v.restrict_policy.apply_update(tf.constant([30], tf.int64))
    removed = tf.function(lambda: v.restrict(1))()
    assert int(removed) == 2 and v.export()[0].numpy().tolist() == [30]


def test_keras_layer_with_a_policy_and_bp_v2_slots_are_dropped_too():
    layer = de.keras.layers.Embedding(2, name=f"trs{next(_names)}", bp_v2=True,
                                      restrict_policy=de.TimestampRestrictPolicy)
    x = np.array([[1, 2, 3], [1, 2, 3], [4, 5, 6], [4, 5, 6]], np.int64)
    inp = keras.Input((3,), dtype="int64")
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(layer(inp))))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
    model.compile(opt, "mse")
    model.fit(x, np.ones((4, 1)), batch_size=2, shuffle=False, verbose=0)
    v = layer.params
    assert int(v.restrict(3)) == 3
    assert sorted(v.export()[0].numpy().tolist()) == [4, 5, 6]
    from tf_bridge.optimizer import _slot_table
    assert sorted(_slot_table(v, opt.rule).export()[0].tolist()) == [4, 5, 6]


def test_bad_arguments():
    with pytest.raises(TypeError, match="restrict_policy"):
        var("timestamp")
    with pytest.raises(TypeError, match="abstract"):
        var(de.RestrictPolicy)
    with pytest.raises(TypeError, match="tf_bridge.Variable"):
        de.TimestampRestrictPolicy(object())
    v = var(de.TimestampRestrictPolicy)
    with pytest.raises(ValueError, match="num_reserved"):
        v.restrict(-1)
    with pytest.raises(TypeError, match="num_reserved"):
        v.restrict(True)
    with pytest.raises(ValueError, match="trigger"):
        v.restrict(5, trigger=4)
    with pytest.raises(TypeError, match="trigger"):
        v.restrict(5, trigger=6.0)
