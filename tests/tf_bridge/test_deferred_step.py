"""A Keras step's table update runs after the step returns (tf_bridge.optimizer.DEFERRED):
the same results bit for bit, applied when fit returns, errors raised, and the tables
whose step could fail or touch more than the table updated in place."""
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de

top = sys.modules["tf_bridge.optimizer"]


def _fit(tag, monkeypatch, deferred, epochs=2, twice=False):
    """Two tables trained by model.fit (``twice``: b looked up twice, so its gradient is
    not one lookup's and its step is not fused); returns their rows and slots, the dense
    kernel and predictions, and the deferred jobs left on the tables when fit returned."""
    monkeypatch.setattr(top, "DEFERRED", deferred)
    keras.utils.set_random_seed(0)
    inp = keras.Input((3,), dtype="int64")
    a = de.keras.layers.Embedding(4, name=f"{tag}_a",
                                  initializer=keras.initializers.RandomNormal(seed=1))
    b = de.keras.layers.Embedding(2, name=f"{tag}_b", initializer=0.1)
    cols = [keras.layers.Flatten()(a(inp[:, :2])), keras.layers.Flatten()(b(inp[:, 2:]))]
    if twice:
        cols.append(keras.layers.Flatten()(b(inp[:, :1] + 1)))
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Concatenate()(cols)))
    dyn = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05))
    model.compile(dyn, "mse")
    rng = np.random.default_rng(0)
    x = rng.zipf(1.3, (96, 3)) % 50 - 25
    x[0] = [2**63 - 1, -2**63, -1]                       # extreme keys
    model.fit(x, rng.random((96, 1)), batch_size=32, epochs=epochs, verbose=0, shuffle=False)
    pending = [e.params.table._lock.deferred for e in (a, b)]
    keys = tf.constant(np.unique(x), tf.int64)
    got = [e.params.lookup(keys).numpy() for e in (a, b)]
    got += [dyn.get_slot(e.params, s, keys).numpy() for e in (a, b) for s in ("m", "v")]
    got += [model.layers[-1].kernel.numpy(), model.predict(x[:40] + 3, verbose=0)]
    return got, pending


@pytest.mark.parametrize("twice", [False, True])
def test_deferred_steps_equal_steps_in_place(monkeypatch, twice):
    calls = []
    real = top.defer
    monkeypatch.setattr(top, "defer", lambda *a: calls.append(a[2]) or real(*a))
    deferred, pending = _fit(f"deferred{twice}", monkeypatch, True, twice=twice)
    if twice:                             # one step of the two is not fused: both in place
        assert calls == []
    else:                                 # every step, both tables in one job
        assert len(calls) == 6 and calls[-1].endswith(
            "step 6 of dynamic table(s) 'deferredFalse_a-parameter', "
            "'deferredFalse_b-parameter'")
    assert pending == [None, None]                         # fit waited for the last one
    in_place, _ = _fit(f"in_place{twice}", monkeypatch, False, twice=twice)
    assert len(calls) == (0 if twice else 6)
    for x, y in zip(deferred, in_place):
        np.testing.assert_array_equal(x, y)


def test_fit_returns_with_the_last_slow_step_applied(monkeypatch):
    """The update of each step sleeps before it runs: fit still returns with every one
    applied (finalize_variable_values waits), equal to the updates in place."""
    import time
    real = top._run_parts
    monkeypatch.setattr(top, "_run_parts", lambda *a: time.sleep(0.1) or real(*a))
    slow, pending = _fit("slow", monkeypatch, True, epochs=1)
    assert pending == [None, None]
    monkeypatch.setattr(top, "_run_parts", real)
    in_place, _ = _fit("slow_ref", monkeypatch, False, epochs=1)
    for x, y in zip(slow, in_place):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("failing_step", [2, 3])        # raised by the next lookup / by fit
def test_a_failed_deferred_step_fails_fit_naming_it(monkeypatch, failing_step):
    real = top._run_parts

    def run(rule, parts, s, r):
        if s == failing_step:
            raise MemoryError("no memory for the rows")
        return real(rule, parts, s, r)
    monkeypatch.setattr(top, "_run_parts", run)
    with pytest.raises((RuntimeError, tf.errors.OpError),
                       match=f"step {failing_step} of dynamic table.*failed after its call "
                             "returned.*no memory for the rows"):
        _fit(f"failing{failing_step}", monkeypatch, True, epochs=1)


def test_a_limit_set_after_the_step_was_traced_stops_the_deferral(monkeypatch):
    """``max_keys`` set on a trained layer's table (its step already traced): the next
    steps update in place, so a full table raises in its own step."""
    calls = []
    real = top.defer
    monkeypatch.setattr(top, "defer", lambda *a: calls.append(a[2]) or real(*a))
    monkeypatch.setattr(top, "DEFERRED", True)
    inp = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(2, name="limited_later")
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(emb(inp))))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), "mse")
    x, y = np.arange(64).reshape(32, 2), np.zeros((32, 1))
    model.fit(x, y, batch_size=16, verbose=0)
    assert len(calls) == 2
    emb.params.max_keys = 70
    with pytest.raises((ValueError, tf.errors.OpError), match="is full"):
        model.fit(x + 64, y, batch_size=16, verbose=0)     # 64 more keys: over 70
    assert len(calls) == 2 and emb.params.table.size() == 64


def test_only_plain_tables_whose_step_cannot_fail_are_deferred():
    plain = de.Variable(dim=2, name="defer_plain")
    full = de.Variable(dim=2, name="defer_full")
    full.max_keys = 100
    strings = de.Variable(key_dtype=tf.string, dim=2, name="defer_strings")
    drawn = de.Variable(dim=2, name="defer_drawn",
                        initializer=lambda shape: np.ones(shape, np.float32))
    assert top._defers(plain)
    assert not any(top._defers(v) for v in (full, strings, drawn))
