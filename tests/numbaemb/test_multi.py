"""numbaemb.multi.lookup_many (several tables, one kernel call) against the per-table
oracle: Variable.lookup and unique_inverse, table by table; extreme keys, empty
batches, mixed dtypes, bounded tables; errors; concurrent writers."""
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import numbaemb as ne
from jit_kernels.segment import unique_inverse
from numbaemb import initializers as I
from numbaemb.multi import apply_many, fits, lookup_many
from tests.sizing import examples

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
EXTREMES = [INT64_MIN, INT64_MAX, -1, 0]


def check_against_oracle(tables, keys, unique):
    got = lookup_many(tables, keys, unique=unique)
    assert len(got) == len(tables)
    for table, k, res in zip(tables, keys, got):
        rows, exists = table.lookup(k, return_exists=True)
        np.testing.assert_array_equal(res.rows, rows.reshape(-1, table.dim))
        np.testing.assert_array_equal(res.exists, exists.reshape(-1))
        assert res.rows.dtype == table.value_dtype
        if not unique:
            assert res.uniq is None and res.absent is None
            continue
        uniq, inverse = unique_inverse(np.asarray(k, np.int64).reshape(-1))
        np.testing.assert_array_equal(res.uniq, uniq)
        np.testing.assert_array_equal(res.inverse, inverse)
        missing = ~table.lookup(uniq, return_exists=True)[1]
        if not missing.any():
            assert res.absent is None
            continue
        valid, kept = res.absent
        np.testing.assert_array_equal(valid, missing)
        np.testing.assert_array_equal(kept[missing], table.lookup(uniq[missing]))


def tables_with_rows(seed):
    rng = np.random.default_rng(seed)
    tables = [ne.Variable(dim=4, initializer=I.RandomNormal(stddev=0.1), seed=1),
              ne.Variable(dim=3, value_dtype=np.float64, initializer=I.RandomUniform(-1, 1), seed=2),
              ne.Variable(dim=5, initializer=1.5),
              ne.Variable(dim=2, max_capacity=64, evict="lfu", initializer=I.RandomNormal()),
              ne.Variable(dim=3, max_capacity=64, evict="lru", evict_window="bucket",
                          initializer=I.RandomUniform(-1, 1), seed=3)]    # (a kernel of its own)
    for t in tables:
        k = np.concatenate([EXTREMES[::2], rng.integers(-50, 50, 40)])
        t.upsert(k, rng.standard_normal((k.size, t.dim)))
    return tables


@pytest.mark.parametrize("unique", [True, False])
def test_equals_each_table_alone_with_extreme_keys_and_an_empty_batch(unique):
    tables = tables_with_rows(0)
    rng = np.random.default_rng(1)
    keys = [np.concatenate([EXTREMES, rng.integers(-80, 80, 300)]),
            np.array(EXTREMES * 3).reshape(3, 4),                 # any shape: flattened
            np.empty(0, np.int64),
            rng.integers(-80, 80, 200).astype(np.int32),
            np.concatenate([EXTREMES, rng.integers(-80, 80, 100)])]
    check_against_oracle(tables, keys, unique)
    assert [t.size() for t in tables] == [t.size() for t in tables_with_rows(0)]  # no insert


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.lists(st.one_of(st.sampled_from(EXTREMES), st.integers(-60, 60)),
                         max_size=40), min_size=5, max_size=5), st.booleans())
def test_random_batches_equal_the_oracle(batches, unique):
    check_against_oracle(TABLES, [np.array(b, np.int64) for b in batches], unique)


TABLES = tables_with_rows(5)


def test_outs_are_written_and_checked():
    a, b = tables_with_rows(2)[:2]
    outs = [np.empty((3, 4), np.float32), np.empty((2, 3), np.float64)]
    got = lookup_many([a, b], [np.array([1, 2, 3]), np.array([0, 9])], outs=outs)
    assert np.shares_memory(got[0].rows, outs[0]) and np.shares_memory(got[1].rows, outs[1])
    np.testing.assert_array_equal(outs[1], b.lookup(np.array([0, 9])))
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array"):
        lookup_many([a, b], [np.array([1]), np.array([0])],
                    outs=[np.empty((1, 3), np.float32), np.empty((1, 3), np.float64)])


def test_tables_that_do_not_fit_and_bad_keys_raise_naming_them():
    plain = ne.Variable(dim=2)
    others = [ne.Variable(dim=2, num_shards=2), ne.Variable(dim=2, value_dtype=np.float16),
              ne.Variable(dim=2, key_dtype=str)]
    ranged = ne.Variable(dim=2)
    ranged.key_range = (0, 10)
    for other in others + [ranged]:
        assert not fits(other)
        with pytest.raises(ValueError, match=r"tables\[1\] cannot be looked up with others"):
            lookup_many([plain, other], [np.array([1]), np.array([1])])
    assert fits(plain)
    with pytest.raises(ValueError, match="one array per table"):
        lookup_many([plain, plain], [np.array([1])])
    with pytest.raises(TypeError, match="keys"):
        lookup_many([plain], [np.array([1.5])])


def test_rows_are_never_torn_by_concurrent_writers():
    """Writers fill whole rows with one number; a lookup must see each row whole."""
    dim = 16
    tables = [ne.Variable(dim=dim, initializer=-7.0) for _ in range(3)]
    keys = [np.arange(t * 100, t * 100 + 400) for t in range(3)]
    lookup_many(tables, keys, unique=True)                  # compile before the threads
    stop, errors = threading.Event(), []

    def write(table, base):
        try:
            for gen in range(60):
                k = np.arange(base, base + 400)
                table.upsert(k, np.full((400, dim), float(gen), np.float32))
                if gen % 20 == 19:
                    table.remove(k[::3])
        except Exception as e:          # pragma: no cover (reported below)
            errors.append(e)

    def read():
        try:
            while not stop.is_set():
                for res in lookup_many(tables, keys, unique=True):
                    assert (res.rows == res.rows[:, :1]).all(), "a torn row"
        except Exception as e:
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(t, i * 100)) for i, t in enumerate(tables)]
    for th in readers + writers:
        th.start()
    for th in writers:
        th.join(60)
    stop.set()
    for th in readers:
        th.join(60)
    assert not errors, errors[0]


# ---- apply_many: one optimizer step on several tables -----------------------------------------
OPTIMIZERS = [ne.optimizers.SGD(0.1), ne.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
              ne.optimizers.Adagrad(0.2, initial_accumulator_value=0.3),
              ne.optimizers.Adam(0.05), ne.optimizers.Adam(0.05, amsgrad=True),
              ne.optimizers.Ftrl(0.1, l1_regularization_strength=0.01, beta=0.5),
              ne.optimizers.RMSprop(0.02, momentum=0.5, centered=True)]


def training_tables():
    return [ne.Variable(dim=4, initializer=I.RandomNormal(stddev=0.1), seed=3),
            ne.Variable(dim=3, value_dtype=np.float64, initializer=I.RandomUniform(-1, 1), seed=4),
            ne.Variable(dim=2, initializer=0.25)]


def batch(rng, t, with_rows):
    """Distinct keys (extremes first), a position -> key map and per-position rows; with
    ``with_rows`` the initial rows a lookup would have drawn for some of the keys."""
    keys = np.unique(np.concatenate([EXTREMES, rng.integers(-40, 40, 30)]))
    keys = np.concatenate([EXTREMES, keys[~np.isin(keys, EXTREMES)]])
    rng.shuffle(keys[4:])
    inverse = rng.integers(0, keys.size, 3 * keys.size)
    inverse[:keys.size] = np.arange(keys.size)                 # every key has a position
    grads = rng.standard_normal((inverse.size, [4, 3, 2][t])).astype([np.float32, np.float64,
                                                                       np.float32][t])
    rows = None
    if with_rows:
        valid = rng.random(keys.size) < 0.5
        rows = (rng.standard_normal((keys.size, grads.shape[1])).astype(grads.dtype), valid)
    return keys, inverse, grads, rows


def state(table, optimizer):
    keys, vals = table.export()
    order = np.argsort(keys)
    slots = [ne.optimizers.slot_values(table, optimizer, name, keys[order])
             for name, _ in optimizer.slots()]
    return keys[order], vals[order], slots


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=repr)
def test_apply_many_equals_apply_gradients_table_by_table(optimizer):
    together, alone = training_tables(), training_tables()
    rng = np.random.default_rng(7)
    for step in range(1, 5):
        batches = [batch(rng, t, with_rows=step % 2 == 0) for t in range(3)]
        if step == 3:                       # free rows are reused
            for tables in (together, alone):
                tables[0].remove(batches[0][0][::4])
        apply_many(together, optimizer, [b[0] for b in batches], [b[2] for b in batches],
                   [b[1] for b in batches], [b[3] for b in batches], step=step)
        for table, (k, inv, g, rows) in zip(alone, batches):
            ne.optimizers.apply_gradients(table, optimizer, k, g, step=step, inverse=inv,
                                          initial_rows=rows)
    for a, b in zip(together, alone):
        ka, va, sa = state(a, optimizer)
        kb, vb, sb = state(b, optimizer)
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(va, vb)
        for x, y in zip(sa, sb):
            np.testing.assert_array_equal(x, y)


def test_apply_many_checks_everything_before_applying():
    tables = training_tables()[:2]
    k, g, inv = [np.array([1, 2])] * 2, [np.ones((2, 4), np.float32), np.ones((2, 3))], \
        [np.array([0, 1])] * 2
    adam = ne.optimizers.Adam(0.1)
    bad = [
        (dict(inverse=[np.array([0, 2]), np.array([0, 1])]), ValueError, r"inverse\[0\]"),
        (dict(grads=[np.ones((2, 4), np.float32), np.ones((2, 5))]), ValueError, r"grads\[1\]"),
        (dict(keys=[np.array([1.5, 2])] * 2), TypeError, r"keys\[0\]"),
        (dict(initial_rows=[None, (np.ones((2, 3)), np.ones(3, bool))]), ValueError,
         r"initial_rows\[1\]\[1\]"),
        (dict(keys=k[:1]), ValueError, "keys must have one entry per table"),
    ]
    for change, error, match in bad:
        args = {**dict(keys=k, grads=g, inverse=inv, initial_rows=[None, None]), **change}
        with pytest.raises(error, match=match):
            apply_many(tables, adam, args["keys"], args["grads"], args["inverse"],
                       args["initial_rows"], step=1)
        assert [t.size() for t in tables] == [0, 0]
    with pytest.raises(ValueError, match=r"step must be"):
        apply_many(tables, adam, k, g, inv, [None, None], step=0)
    with pytest.raises(ValueError, match=r"tables\[1\] is tables\[0\]"):
        apply_many([tables[0], tables[0]], adam, [k[0], k[0]], [g[0], g[0]], inv,
                   [None, None], step=1)
    bounded = ne.Variable(dim=3, max_capacity=10)
    with pytest.raises(ValueError, match=r"tables\[1\] cannot be trained with others"):
        apply_many([tables[0], bounded], adam, k, g, inv, [None, None], step=1)
    assert [t.size() for t in tables] == [0, 0]


def test_nine_tables_of_three_widths_equal_the_oracle():
    """Nine tables of three widths in one call (arrays reach the kernel as addresses:
    any number of tables, one compile); lookups and an Adam step equal the oracle."""
    n = 9
    rng = np.random.default_rng(11)
    tables = [ne.Variable(dim=1 + t % 3, initializer=I.RandomNormal(), seed=t) for t in range(n)]
    twins = [ne.Variable(dim=1 + t % 3, initializer=I.RandomNormal(), seed=t) for t in range(n)]
    keys = [np.concatenate([EXTREMES, rng.integers(-9, 9, 20)]) for _ in range(n)]
    check_against_oracle(tables, keys, unique=True)
    res = lookup_many(tables, keys, unique=True)
    grads = [rng.standard_normal((k.size, t.dim)).astype(np.float32) for k, t in zip(keys, tables)]
    rows = [None if r.absent is None else (r.absent[1], r.absent[0]) for r in res]
    apply_many(tables, ne.optimizers.Adam(0.1), [r.uniq for r in res], grads,
               [r.inverse for r in res], rows, step=1)
    for twin, r, g, ir in zip(twins, res, grads, rows):
        ne.optimizers.apply_gradients(twin, ne.optimizers.Adam(0.1), r.uniq, g, step=1,
                                      inverse=r.inverse, initial_rows=ir)
    for a, b in zip(tables, twins):
        np.testing.assert_array_equal(state(a, ne.optimizers.Adam(0.1))[1],
                                      state(b, ne.optimizers.Adam(0.1))[1])
    check_against_oracle(tables, keys, unique=False)
