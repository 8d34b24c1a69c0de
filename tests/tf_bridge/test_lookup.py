"""embedding_lookup family: values and gradients against TF on a dense table of the same rows."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import numbaemb as ne
import tf_bridge as de

V, D = 12, 4                      # sparse tests: ids in [0, V), dense table = rows of 0..V-1
# safe lookups: every id is a key, negative ones too (TFRA), where tf.nn prunes ids < 0; the
# TF twin therefore holds keys -K..V-1 at rows 0..V+K-1 and is fed the ids shifted by K
K = 4
TWIN_KEYS = list(range(-K, V))
_names = itertools.count()


def var(**kw):
    kw.setdefault("name", f"tl{next(_names)}")
    kw.setdefault("initializer", tf.keras.initializers.RandomNormal(seed=5))
    return de.Variable(dim=D, **kw)


@pytest.fixture
def train_mode():
    yield
    de.enable_train_mode()


def grad_dict(g):
    """{key: summed row} of an IndexedSlices (keys may repeat)."""
    out = {}
    for k, row in zip(g.indices.numpy().tolist(), g.values.numpy()):
        out[k] = out.get(k, 0) + row
    return out


def shift(sp):
    """A SparseTensor / RaggedTensor of ids shifted by K (rows of the twin), or None."""
    if sp is None or isinstance(sp, tf.RaggedTensor):
        return None if sp is None else sp.with_flat_values(sp.flat_values + K)
    return tf.SparseTensor(sp.indices, sp.values + K, sp.dense_shape)


def dense_grads(v, keys, loss_of_table):
    """Reference: a dense tf.Variable holding the rows of ``keys``; returns {key: grad row}."""
    table = tf.Variable(v.table.lookup(np.asarray(keys)))
    with tf.GradientTape() as tape:
        loss = loss_of_table(table)
    g = tf.convert_to_tensor(tape.gradient(loss, table)).numpy()
    return dict(zip(list(keys), g))


def assert_grads_equal(ours, ref):
    for k in set(ours) | set(ref):
        np.testing.assert_allclose(ours.get(k, 0), ref.get(k, 0), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 2, 3)])
def test_lookup_equals_numbaemb(graph, shape):
    v = var()
    ids = np.random.default_rng(1).integers(-50, 50, shape)
    f = tf.function(de.embedding_lookup) if graph else de.embedding_lookup
    np.testing.assert_array_equal(f(v, tf.constant(ids, tf.int64)).numpy(), v.table.lookup(ids))
    u = tf.function(de.embedding_lookup_unique) if graph else de.embedding_lookup_unique
    np.testing.assert_array_equal(u(v, tf.constant(ids, tf.int64)).numpy(), v.table.lookup(ids))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_gradient_of_several_lookups_with_duplicates(graph):
    """The issue's snippet: tape.gradient(loss, [user]) -> [IndexedSlices of keys]."""
    user = var(value_dtype=tf.float64)
    a = np.array([[1, 2, 2], [-7, 1, 2**62]])
    b = np.array([2, 9, 9, 1])
    y = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    keys = np.unique(np.concatenate([a.ravel(), b]))

    def loss_fn(lookup):
        e = lookup(a)
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(e, -1) - y))
        return loss + tf.reduce_sum(tf.sin(lookup(b))) + tf.reduce_sum(lookup(b[:1]) ** 2)

    def ours():
        with tf.GradientTape() as tape:
            loss = loss_fn(lambda i: de.embedding_lookup(user, tf.constant(i, tf.int64)))
        return tape.gradient(loss, [user])

    g, = (tf.function(ours) if graph else ours)()
    assert isinstance(g, tf.IndexedSlices) and g.indices.dtype == tf.int64
    pos = {k: i for i, k in enumerate(keys)}
    ref = dense_grads(user, keys, lambda t: loss_fn(
        lambda i: tf.nn.embedding_lookup(t, np.vectorize(pos.get)(i))))
    assert_grads_equal(grad_dict(g), ref)
    assert len(set(g.indices.numpy().tolist())) == len(keys)


def test_gradient_sources_and_unique_lookup():
    v = var()
    ids = tf.constant([[3, 4, 3], [4, 4, 8]], tf.int64)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(de.embedding_lookup_unique(v, ids) ** 2)
    by_var, = tape.gradient(loss, [v])
    by_handle, = tape.gradient(loss, v.trainable_variables)
    assert grad_dict(by_var).keys() == grad_dict(by_handle).keys() == {3, 4, 8}
    assert de.owner_of(v.trainable_variables[0]) is v and de.owner_of(v) is v
    assert de.owner_of(tf.Variable(1.0)) is None
    ref = dense_grads(v, [3, 4, 8], lambda t: tf.reduce_sum(
        tf.nn.embedding_lookup(t, tf.constant([[0, 1, 0], [1, 1, 2]])) ** 2))
    assert_grads_equal(grad_dict(by_var), ref)


def test_max_norm_matches_tf():
    v = var(initializer=tf.keras.initializers.RandomNormal(stddev=3.0, seed=1))
    ids = np.array([0, 1, 1, 5])
    dense = v.table.lookup(np.arange(V))
    np.testing.assert_allclose(de.embedding_lookup(v, ids, max_norm=1.0).numpy(),
                               tf.nn.embedding_lookup(dense, ids, max_norm=1.0).numpy(), rtol=1e-6)


def sparse_case(ragged, weights, safe):
    rng = np.random.default_rng(3)
    rows = [rng.integers(-2 if safe else 0, V, rng.integers(0, 4)).tolist() for _ in range(6)]
    rows[0], rows[-1] = [], [1, 1, 2]
    w = [(rng.uniform(-0.5 if safe else 0.1, 2.0, len(r))).tolist() for r in rows]
    if ragged:
        return (tf.ragged.constant(rows, tf.int64, row_splits_dtype=tf.int64),
                tf.ragged.constant(w, tf.float32, row_splits_dtype=tf.int64) if weights else None)
    idx = [[i, j] for i, r in enumerate(rows) for j in range(len(r))]
    shape = [len(rows), 4]
    ids = tf.SparseTensor(idx, sum(rows, []), shape)
    return ids, (tf.SparseTensor(idx, sum(w, []), shape) if weights else None)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("ragged", [False, True], ids=["sparse", "ragged"])
@pytest.mark.parametrize("safe", [False, True], ids=["plain", "safe"])
def test_sparse_lookups_match_tf(combiner, weights, ragged, safe):
    v = var()
    sp_ids, sp_w = sparse_case(ragged, weights, safe)
    if safe:
        ours = lambda p: de.safe_embedding_lookup_sparse(p, sp_ids, sp_w, combiner, default_id=3)
        ref = lambda t: tf.nn.safe_embedding_lookup_sparse(t, shift(sp_ids), sp_w, combiner,
                                                           default_id=3 + K)
    else:
        ours = lambda p: de.embedding_lookup_sparse(p, sp_ids, sp_w, combiner=combiner)
        ref = lambda t: tf.nn.embedding_lookup_sparse(t, sp_ids, sp_w, combiner=combiner)
    dy = tf.constant(np.random.default_rng(4).normal(size=(6, D)), tf.float32)
    with tf.GradientTape() as tape:
        out = ours(v)
        loss = tf.reduce_sum(out * dy[:out.shape[0]])
    g, = tape.gradient(loss, [v])
    keys = TWIN_KEYS if safe else list(range(V))
    dense = v.table.lookup(np.asarray(keys))
    np.testing.assert_allclose(out.numpy(), ref(dense).numpy(), rtol=1e-5, atol=1e-6)
    want = dense_grads(v, keys, lambda t: tf.reduce_sum(ref(t) * dy[:out.shape[0]]))
    assert_grads_equal(grad_dict(g), want)
    if safe and not (weights and combiner != "sum"):     # negative ids are looked up, trained
        assert min(grad_dict(g)) < 0


def test_safe_lookup_default_none_rank3_and_tf_function():
    v = var()
    ids = tf.SparseTensor([[0, 0, 0], [0, 1, 1], [1, 0, 0]], tf.constant([4, -1, 7], tf.int64),
                          [2, 2, 3])
    dense = v.table.lookup(np.asarray(TWIN_KEYS))
    want = tf.nn.safe_embedding_lookup_sparse(dense, shift(ids), None, "sum").numpy()
    assert want.shape == (2, 2, D)
    assert np.allclose(want[0, 1], v.lookup(tf.constant([-1], tf.int64))[0])   # -1: a key
    np.testing.assert_allclose(de.safe_embedding_lookup_sparse(v, ids, None, "sum").numpy(), want,
                               rtol=1e-6)
    f = tf.function(lambda: de.safe_embedding_lookup_sparse(v, ids, None, "sum"))
    np.testing.assert_allclose(f().numpy(), want, rtol=1e-6)
    rt = tf.ragged.constant([[4, 4], [], [7]], tf.int64)
    g = tf.function(lambda: de.embedding_lookup_sparse(v, rt, None, combiner="sqrtn"))
    np.testing.assert_allclose(g().numpy(), tf.nn.embedding_lookup_sparse(
        dense, shift(rt), None, combiner="sqrtn").numpy(), rtol=1e-6)
    empty = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [3, 2])
    np.testing.assert_array_equal(de.safe_embedding_lookup_sparse(v, empty).numpy(), np.zeros((3, D)))


def test_lookup_does_not_insert_and_an_optimizer_step_inserts_every_id():
    v = var()
    ids = tf.constant([[5, 6], [6, -3]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(v, ids)) + tf.reduce_sum(
            tf.function(de.embedding_lookup)(v, ids + 1))
        v.lookup(ids)
    g, = tape.gradient(loss, [v])
    assert int(v.size()) == 0
    opt = ne.optimizers.Adam(learning_rate=0.1)
    ne.optimizers.apply_gradients(v.table, opt, g.indices.numpy(), g.values.numpy(), step=1)
    want = {-3, 5, 6, -2, 7}
    assert sorted(v.export()[0].numpy().tolist()) == sorted(want)
    assert np.all(ne.optimizers.slot_values(v.table, opt, "m", np.array(sorted(want))) != 0)


def test_inference_mode_and_untrainable_have_no_gradient(train_mode):
    v = var()
    frozen = var(trainable=False)
    ids = tf.constant([1, 2, 2], tf.int64)
    train_rows = de.embedding_lookup(v, ids).numpy()
    de.enable_inference_mode()
    assert de.get_model_mode() == de.ModelMode.INFERENCE
    with tf.GradientTape() as tape:
        e = de.embedding_lookup(v, ids)
        loss = tf.reduce_sum(e)
    assert tape.gradient(loss, [v]) == [None]
    np.testing.assert_array_equal(e.numpy(), train_rows)
    de.enable_train_mode()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(frozen, ids))
    assert tape.gradient(loss, [frozen]) == [None] and frozen.trainable_variables == []


def test_bad_input_raises_naming_the_argument():
    v = var()
    sp = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])
    with pytest.raises(TypeError, match="ids"):
        de.embedding_lookup(v, tf.constant([1.0, 2.0]))
    with pytest.raises(TypeError, match="ids"):
        de.embedding_lookup(v, tf.constant(["1"]))
    with pytest.raises(TypeError, match="ids"):
        de.embedding_lookup(v, sp)
    with pytest.raises(TypeError, match="params"):
        de.embedding_lookup(tf.Variable(tf.zeros([3, 4])), [1])
    with pytest.raises(TypeError, match="sp_ids"):
        de.embedding_lookup_sparse(v, tf.SparseTensor([[0, 0]], [1.0], [1, 1]), None)
    with pytest.raises(TypeError, match="sp_ids"):
        de.embedding_lookup_sparse(v, tf.constant([[1]], tf.int64), None)
    with pytest.raises(ValueError, match="combiner"):
        de.embedding_lookup_sparse(v, sp, None, combiner="max")
    with pytest.raises(ValueError, match="sp_weights"):
        de.embedding_lookup_sparse(v, sp, tf.SparseTensor([[0, 0], [0, 1]], [1.0, 2.0], [1, 2]))
    with pytest.raises(TypeError, match="sp_weights"):
        de.embedding_lookup_sparse(v, sp, tf.ragged.constant([[1.0]]))
    with pytest.raises(TypeError, match="ids"):
        tf.function(lambda x: de.embedding_lookup(v, x))(tf.constant([1.5]))
    assert int(v.size()) == 0


@pytest.mark.parametrize("splits", [tf.int64, tf.int32])
@pytest.mark.parametrize("weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_safe_lookup_rank2_ragged_with_int32_or_int64_row_splits(splits, weights, graph):
    """Rank-2 ragged ids: any row-splits dtype (TF's own ragged path takes int64 only),
    empty rows, negative ids (keys), pruned weights; values and gradients as TF's on the
    int64-splits twin."""
    v = var()
    rows = [[1, 5, 5], [], [-1, 7], [11], [-3]]
    w = [[0.5, 2.0, 1.0], [], [1.0, -1.0], [3.0], [1.0]]
    ids = tf.ragged.constant(rows, tf.int64, row_splits_dtype=splits)
    wts = tf.ragged.constant(w, tf.float32, row_splits_dtype=splits) if weights else None
    ids64 = ids.with_row_splits_dtype(tf.int64)
    wts64 = None if wts is None else wts.with_row_splits_dtype(tf.int64)
    dy = tf.constant(np.random.default_rng(6).normal(size=(len(rows), D)), tf.float32)

    def ours(*inputs):                  # (ids,) or (ids, weights)
        with tf.GradientTape() as tape:
            out = de.safe_embedding_lookup_sparse(v, inputs[0], inputs[1] if weights else None,
                                                  "mean")
            loss = tf.reduce_sum(out * dy)
        return out, tape.gradient(loss, [v])[0]

    inputs = (ids, wts) if weights else (ids,)
    if graph:      # static shapes unknown, as in a served or Keras-traced function
        specs = [tf.RaggedTensorSpec([None, None], t.dtype, ragged_rank=1, row_splits_dtype=splits)
                 for t in inputs]
        ours = tf.function(ours, input_signature=specs)
    out, g = ours(*inputs)
    dense = v.table.lookup(np.asarray(TWIN_KEYS))
    ref = lambda t: tf.nn.safe_embedding_lookup_sparse(t, shift(ids64), wts64, "mean")
    np.testing.assert_allclose(out.numpy(), ref(dense).numpy(), rtol=1e-5, atol=1e-6)
    assert out.shape == (len(rows), D) and not out.numpy()[1].any()   # empty row: zeros
    want = dense_grads(v, TWIN_KEYS, lambda t: tf.reduce_sum(ref(t) * dy))
    assert_grads_equal(grad_dict(g), want)
    assert min(grad_dict(g)) == -3                       # negative ids are keys


def test_safe_lookup_ragged_zero_rows_and_bad_rank():
    v = var()
    none = tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), tf.constant([0], tf.int64))
    for rt in (none, none.with_row_splits_dtype(tf.int32)):
        out = de.safe_embedding_lookup_sparse(v, rt, None, "sum")
        assert out.shape == (0, D)
    all_empty = tf.ragged.constant([[], []], tf.int64)
    np.testing.assert_array_equal(de.safe_embedding_lookup_sparse(v, all_empty).numpy(),
                                  np.zeros((2, D)))
    with pytest.raises(ValueError, match="sparse_ids.*rank 2"):
        de.safe_embedding_lookup_sparse(v, tf.ragged.constant([[[1, 2]], [[3]]], tf.int64))
    assert int(v.size()) == 0


def test_pooled_outputs_are_reused_only_once_tensorflow_drops_them():
    """The training lookup's output and its gradient sums come from a buffer pool: a
    tensor still alive keeps its buffer (later steps never overwrite it); a dropped
    one's buffer serves a later step."""
    from tf_bridge.dlpack import from_tf
    v = var()
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))

    def step(ids):
        with tf.GradientTape() as tape:
            e = de.embedding_lookup(v, tf.constant(ids, tf.int64))
            loss = tf.reduce_sum(e * e)
        g = tape.gradient(loss, [v])
        opt.apply_gradients(zip(g, [v]))
        return e, g[0].values

    e1, s1 = step([[1, 2], [2, 3]])                  # repeated ids: the spread path
    kept = e1.numpy().copy(), s1.numpy().copy()
    ptrs = {from_tf(e1).ctypes.data, from_tf(s1).ctypes.data}
    later = [step([[4, 5], [5, 9]])]                # (the pool keeps 4 buffers)
    np.testing.assert_array_equal(e1.numpy(), kept[0])       # not overwritten
    np.testing.assert_array_equal(s1.numpy(), kept[1])
    assert not ptrs & {from_tf(t).ctypes.data for pair in later for t in pair}
    del e1, s1                                      # (later's buffers stay taken)
    want = v.lookup(tf.constant([[1, 7], [7, 7]], tf.int64)).numpy()
    e, s = step([[1, 7], [7, 7]])
    assert {from_tf(e).ctypes.data, from_tf(s).ctypes.data} == ptrs      # both reused
    np.testing.assert_array_equal(e.numpy(), want)
    np.testing.assert_array_equal(s.numpy(), 2 * np.stack([want[0, 0], 3 * want[0, 1]]))
