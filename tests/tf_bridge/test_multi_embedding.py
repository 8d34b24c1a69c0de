"""de.keras.layers.MultiEmbedding and tf_bridge.lookup.lookup_many: many tables in one op,
equal bit for bit to separate Embedding layers (fit, predict, optimizer slots), saving,
dict / list structure, errors."""
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_bridge as de
from tf_bridge.lookup import lookup_many

pytestmark = pytest.mark.usefixtures("one_numba_thread")   # tests/tf_bridge/conftest.py

_names = itertools.count()
DIMS = [4, 3, 5]


def name():
    return f"memb{next(_names)}"


def data(n=64, seed=0):
    """Three features (n, 2) each; ids with repeats, negatives and int64's extremes."""
    rng = np.random.default_rng(seed)
    extremes = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0], np.int64)
    x = [rng.integers(-10, 30, (n, 2)).astype(np.int64) for _ in DIMS]
    x[1][:4, 0] = extremes
    y = sum(f.sum(1, keepdims=True) % 7 for f in x).astype(np.float32)
    return x, y


def separate_model(prefix, sizes, **kw):
    """The same model from one Embedding layer per feature, named as MultiEmbedding
    names its tables (so their initial rows are the same)."""
    inps = [keras.Input((2,), dtype="int64") for _ in sizes]
    embs = [de.keras.layers.Embedding(d, name=f"{prefix}_{t}", **kw)(i)
            for t, (d, i) in enumerate(zip(sizes, inps))]
    return _head(inps, embs, kw)


def multi_model(prefix, sizes, **kw):
    inps = [keras.Input((2,), dtype="int64") for _ in sizes]
    layer = de.keras.layers.MultiEmbedding(sizes, name=prefix, **kw)
    return _head(inps, layer(inps), kw), layer


def _head(inps, embs, kw):
    flat = [e if kw.get("combiner") else keras.layers.Flatten()(e) for e in embs]
    out = keras.layers.Dense(1, kernel_initializer="ones")(keras.layers.Concatenate()(flat))
    return keras.Model(inps, out)


def tables_of(model):
    out = {}
    for layer in model.layers:
        for t in getattr(layer, "tables", [layer]):
            if isinstance(t, de.keras.layers.Embedding):
                keys, vals = t.params.export()
                order = np.argsort(keys.numpy())
                out[t.name] = keys.numpy()[order], vals.numpy()[order]
    return out


@pytest.mark.parametrize("opt,combiner", [("adam", None), ("ftrl", "mean"), ("sgd", "sum")])
def test_fit_and_predict_equal_separate_layers_bit_for_bit(opt, combiner, monkeypatch):
    """The separate layers' model steps table by table (one lookup op and one optimizer
    call a table: the single-table kernels), the MultiEmbedding model in one lookup op
    and one optimizer call (the multi-table kernels)."""
    import tf_bridge.optimizer as optimizer_mod
    x, y = data()
    ds = tf.data.Dataset.from_tensor_slices((tuple(x), y)).batch(16)
    make = {"adam": lambda: keras.optimizers.Adam(0.05),
            "ftrl": lambda: keras.optimizers.Ftrl(0.1),
            "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.5)}[opt]
    prefix = name()
    kw = {} if combiner is None else {"combiner": combiner}
    a = separate_model(prefix, DIMS, **kw)
    b, layer = multi_model(prefix, DIMS, **kw)
    b.set_weights(a.get_weights())       # handles (zeros) and the dense head
    for m in (a, b):
        m.compile(de.DynamicEmbeddingOptimizer(make()), "mse")
    monkeypatch.setattr(optimizer_mod, "BATCHED", False)       # read when a step is traced
    ha = a.fit(ds, epochs=3, shuffle=False, verbose=0).history["loss"]
    monkeypatch.setattr(optimizer_mod, "BATCHED", True)
    hb = b.fit(ds, epochs=3, shuffle=False, verbose=0).history["loss"]
    assert ha == hb and ha[-1] < ha[0]
    ta, tb = tables_of(a), tables_of(b)
    assert sorted(ta) == sorted(tb) == [f"{prefix}_{t}" for t in range(3)]
    for k in ta:
        np.testing.assert_array_equal(ta[k][0], tb[k][0])
        np.testing.assert_array_equal(ta[k][1], tb[k][1])
        assert ta[k][0].size == np.unique(x[int(k.rsplit("_", 1)[1])]).size
    separate = [l for l in a.layers if isinstance(l, de.keras.layers.Embedding)]
    for ea, eb in zip(separate, layer.tables):      # the tables' optimizer slots
        keys = tb[eb.name][0]
        for slot, _ in b.optimizer.rule.slots():
            np.testing.assert_array_equal(a.optimizer.get_slot(ea.params, slot, keys).numpy(),
                                          b.optimizer.get_slot(eb.params, slot, keys).numpy())
    for wa, wb in zip(a.optimizer.variables, b.optimizer.variables):   # the head's slots
        np.testing.assert_array_equal(np.asarray(wa), np.asarray(wb))
    unseen = [np.concatenate([f[:3], [[10 ** 9, -10 ** 9]]]) for f in x]
    pa, pb = a.predict(unseen, verbose=0), b.predict(unseen, verbose=0)
    np.testing.assert_array_equal(pa, pb)
    assert [int(t.params.size()) for t in layer.tables] == [np.unique(f).size for f in x]


def test_a_step_runs_one_lookup_op_and_one_optimizer_op(monkeypatch):
    """What runs a step (the numpy_function calls, counted as they run): one lookup for
    all tables and one optimizer step for all tables; the per-table sums are pruned."""
    import collections
    import tf_bridge.lookup as lookup_mod
    import tf_bridge.optimizer as optimizer_mod
    ran = collections.Counter()

    def counting(real):
        def numpy_call(fn, inputs, tout, name=None, **kw):
            def run(*arrays):
                ran[name] += 1
                return fn(*arrays)
            return real(run, inputs, tout, name=name, **kw)
        return numpy_call

    for mod in (lookup_mod, optimizer_mod):
        monkeypatch.setattr(mod, "numpy_call", counting(mod.numpy_call))
    x, y = data()
    prefix = name()
    b, layer = multi_model(prefix, DIMS)
    b.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)), "mse")
    b.fit(tf.data.Dataset.from_tensor_slices((tuple(x), y)).batch(16), verbose=0)
    assert dict(ran) == {f"{prefix}_lookup": 4, "dynamic_tables_apply": 4}, dict(ran)


def test_dict_inputs_give_dict_outputs_and_list_order_is_kept():
    prefix = name()
    layer = de.keras.layers.MultiEmbedding({"user": 4, "item": 2}, name=prefix,
                                           initializer=1.0)
    out = layer({"item": tf.constant([[1, 2, 3]], tf.int64), "user": tf.constant([7], tf.int64)})
    assert sorted(out) == ["item", "user"]
    assert out["item"].shape == (1, 3, 2) and out["user"].shape == (1, 4)
    assert [t.name for t in layer.tables] == [f"{prefix}_user", f"{prefix}_item"]
    assert layer.embedding_sizes == {"user": 4, "item": 2}
    np.testing.assert_array_equal(out["user"].numpy(), np.ones((1, 4), np.float32))


def test_lookup_many_in_a_graph_equals_per_table_lookups():
    a = de.Variable(dim=3, name=name())
    b = de.Variable(dim=2, name=name(), initializer=0.5)
    keys = np.array([5, -1, np.iinfo(np.int64).min], np.int64)
    a.upsert(tf.constant(keys), tf.constant(np.arange(9, dtype=np.float32).reshape(3, 3)))
    ids_a = tf.constant([[5, 6], [-1, 5]], tf.int64)
    ids_b = tf.constant([np.iinfo(np.int64).max, 0], tf.int64)

    @tf.function
    def both():
        return lookup_many([a, b], [ids_a, ids_b])

    ga, gb = both()
    np.testing.assert_array_equal(ga.numpy(), de.embedding_lookup(a, ids_a).numpy())
    np.testing.assert_array_equal(gb.numpy(), np.full((2, 2), 0.5, np.float32))
    assert ga.shape == (2, 2, 3) and int(b.size()) == 0      # lookups do not insert


def test_save_and_load_keep_every_table(tmp_path):
    x, y = data()
    prefix = name()
    model, layer = multi_model(prefix, DIMS, combiner="sum")
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)), "mse")
    model.fit(tf.data.Dataset.from_tensor_slices((tuple(x), y)).batch(32), verbose=0)
    before = model.predict(x, verbose=0)
    model.save(tmp_path / "m.keras")
    back = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(back.predict(x, verbose=0), before)
    loaded = [l for l in back.layers if isinstance(l, de.keras.layers.MultiEmbedding)][0]
    assert loaded.embedding_sizes == DIMS and loaded.tables[0].combiner == "sum"
    assert [int(t.params.size()) for t in loaded.tables] == \
        [int(t.params.size()) for t in layer.tables]
    # tf.train.Checkpoint into a fresh model of the same names
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    fresh, fresh_layer = multi_model(prefix, DIMS, combiner="sum")
    tf.train.Checkpoint(model=fresh).restore(path)
    np.testing.assert_array_equal(fresh.predict(x, verbose=0), before)


def test_bad_structure_and_arguments_raise_naming_them():
    layer = de.keras.layers.MultiEmbedding([2, 2], name=name())
    one = tf.constant([1], tf.int64)
    with pytest.raises(ValueError, match="inputs must be a list of 2 id tensors"):
        layer([one])
    with pytest.raises(ValueError, match="inputs must be a list of 2"):
        layer(one)
    with pytest.raises(TypeError, match=r"inputs\[1\]"):
        layer([one, tf.constant([1.5])])
    named = de.keras.layers.MultiEmbedding({"a": 2}, name=name())
    with pytest.raises(ValueError, match=r"dict with keys \['a'\]"):
        named({"b": one})
    with pytest.raises(TypeError, match="embedding_sizes must be a list"):
        de.keras.layers.MultiEmbedding(4)
    with pytest.raises(ValueError, match="at least one table"):
        de.keras.layers.MultiEmbedding([])
    with pytest.raises(TypeError, match="embedding_size must be an int"):
        de.keras.layers.MultiEmbedding([2, "3"])
    v = de.Variable(dim=2, name=name())
    with pytest.raises(ValueError, match="one tensor per table"):
        lookup_many([v, v], [one])
    with pytest.raises(TypeError, match=r"params\[1\]"):
        lookup_many([v, "table"], [one, one])
    with pytest.raises(ValueError, match="handles must be None or one entry per table"):
        lookup_many([v], [one], handles=[])


def test_reloads_and_serves_without_numbaemb(tmp_path):
    """A model whose tables live in a MultiEmbedding: .keras reload and a SavedModel
    served by a process without numbaemb predict what the model predicts."""
    from .serving_helpers import reload_and_serve
    x, y = data()
    inp = keras.Input((3, 2), dtype="int64")
    feats = [keras.layers.Reshape((2,))(keras.layers.Cropping1D((f, 2 - f))(inp))
             for f in range(3)]                      # feature f: (n, 2), serializable layers
    layer = de.keras.layers.MultiEmbedding(DIMS, name=name(), combiner="mean")
    out = keras.layers.Dense(1)(keras.layers.Concatenate()(layer(feats)))
    model = keras.Model(inp, out)
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)), "mse")
    stacked = np.stack(x, axis=1)                                   # (n, 3, 2)
    model.fit(stacked, y, batch_size=16, epochs=2, verbose=0)
    query = np.concatenate([stacked[:5], np.full((1, 3, 2), 10 ** 12, np.int64)])
    want, served = reload_and_serve(model, query, tmp_path)
    np.testing.assert_allclose(served["serve"], want, rtol=1e-6)
    np.testing.assert_allclose(served["signature"], want, rtol=1e-6)
