"""``numbaemb.initializers`` and how a Variable uses them.

Initial values are a pure function of (seed, key, column): the same whatever
the shard count, batch order, batch composition or key dtype.  Configs round
trip through ``get_config`` / ``from_config``; bad configs raise.
"""
import math
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numbaemb as ne
from numbaemb import initializers as I

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
INT32_MIN, INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)

ALL = [I.Zeros(), I.Constant(0.5), I.Constant([1.0, -2.0, 3.5]),
       I.RandomUniform(-1.0, 2.0, seed=3), I.RandomUniform(),
       I.RandomNormal(0.5, 2.0, seed=-7), I.RandomNormal(),
       I.TruncatedNormal(mean=1.0, stddev=0.25, seed=INT64_MAX), I.TruncatedNormal()]
RANDOM = [I.RandomUniform(-1.0, 2.0, seed=3), I.RandomNormal(0.5, 2.0, seed=-7),
          I.TruncatedNormal(mean=1.0, stddev=0.25, seed=11)]


# ---- config round trip --------------------------------------------------------------

@pytest.mark.parametrize("init", ALL, ids=lambda i: repr(i))
def test_config_round_trip(init):
    cfg = init.get_config()
    assert cfg["class_name"] == type(init).__name__
    back = I.from_config(cfg)
    assert type(back) is type(init) and back == init
    assert back.get_config() == cfg
    assert back.params(3, 5)[0] == init.params(3, 5)[0] == init.kind
    np.testing.assert_array_equal(back.params(3, 5)[4], init.params(3, 5)[4])


def test_config_distinguishes_classes():
    n, t = I.RandomNormal(0.0, 1.0, seed=1), I.TruncatedNormal(0.0, 1.0, seed=1)
    assert n != t
    assert type(I.from_config(t.get_config())) is I.TruncatedNormal


@pytest.mark.parametrize("cfg", [None, "Zeros", {}, {"class_name": "Nope"},
                                 {"class_name": "Initializer"}, ["RandomNormal"]])
def test_from_config_unknown_raises(cfg):
    with pytest.raises(ValueError, match="initializer"):
        I.from_config(cfg)


def test_from_config_bad_fields_raise():
    with pytest.raises(TypeError):
        I.from_config({"class_name": "RandomNormal", "config": {"bogus": 1}})
    with pytest.raises(ValueError, match="stddev"):
        I.from_config({"class_name": "RandomNormal", "config": {"stddev": -1.0}})


@pytest.mark.parametrize("make, match", [
    (lambda: I.RandomNormal(stddev=-0.1), "stddev"),
    (lambda: I.RandomNormal(stddev=float("nan")), "stddev"),
    (lambda: I.TruncatedNormal(stddev=-1.0), "stddev"),
    (lambda: I.RandomUniform(minval=1.0, maxval=0.0), "minval"),
    (lambda: I.RandomUniform(minval=float("nan")), "minval"),
    (lambda: I.Constant([[1.0, 2.0]]), "shape"),
])
def test_bad_parameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_frozen():
    init = I.RandomNormal(seed=1)
    with pytest.raises(Exception):
        init.stddev = 3.0
    assert init.stddev == 0.05


# ---- get() ------------------------------------------------------------------------------

def test_get():
    assert I.get(None) == I.Zeros()
    assert I.get(0.25) == I.Constant(0.25)
    assert I.get(3) == I.Constant(3.0)
    assert I.get([1, 2]) == I.Constant((1.0, 2.0))
    assert I.get(np.array([1.5, 2.5])) == I.Constant((1.5, 2.5))
    n = I.RandomNormal(seed=4)
    assert I.get(n) is n
    for bad in ("zeros", True, object(), {"class_name": "Zeros"}):
        with pytest.raises(TypeError, match="initializer"):
            I.get(bad)


# ---- Constant -------------------------------------------------------------------------

def test_constant_vector_of_shape_dim():
    v = ne.Variable(dim=3, initializer=I.Constant([1.0, -2.0, 0.5]))
    out = v.lookup(np.array([[INT64_MIN, 0], [INT64_MAX, -1]]))
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out, np.broadcast_to(np.float32([1.0, -2.0, 0.5]), (2, 2, 3)))
    w = ne.Variable(dim=3, initializer=np.array([4.0, 5.0, 6.0]))
    np.testing.assert_array_equal(w.find_or_insert(np.array([9]))[0], [4.0, 5.0, 6.0])
    assert w.size() == 1


def test_constant_scalar_fills_rows():
    v = ne.Variable(dim=5, initializer=-1.5, value_dtype=np.float64)
    np.testing.assert_array_equal(v.lookup(np.array([1, 2])), np.full((2, 5), -1.5))


@pytest.mark.parametrize("value", [[1.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
def test_constant_vector_wrong_length_raises(value):
    with pytest.raises(ValueError, match="dim"):
        ne.Variable(dim=3, initializer=I.Constant(value))


@pytest.mark.parametrize("value", [np.array([-1.0]), [2.5], -1])
def test_one_element_constant_fills_the_row(value):
    """TFRA's default value forms: a scalar or a one-element array fill the row."""
    v = ne.Variable(dim=8, initializer=value)
    want = float(np.asarray(value).reshape(-1)[0])
    np.testing.assert_array_equal(v.lookup(np.array([INT64_MIN, 0, INT64_MAX])),
                                  np.full((3, 8), want, np.float32))


# ---- seeds ------------------------------------------------------------------------------

def test_own_seed_beats_variable_seed():
    keys = np.array([INT64_MIN, -1, 0, 12, INT64_MAX])
    a = ne.Variable(dim=4, initializer=I.RandomNormal(seed=9), seed=1).lookup(keys)
    b = ne.Variable(dim=4, initializer=I.RandomNormal(seed=9), seed=2).lookup(keys)
    c = ne.Variable(dim=4, initializer=I.RandomNormal(), seed=9).lookup(keys)
    d = ne.Variable(dim=4, initializer=I.RandomNormal(), seed=10).lookup(keys)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert not np.isin(c, d).any()


def test_default_seed_comes_from_name():
    keys = np.arange(-5, 5)
    init = I.RandomUniform(-1.0, 1.0)
    a = ne.Variable(dim=3, initializer=init, name="users").lookup(keys)
    b = ne.Variable(dim=3, initializer=init, name="users").lookup(keys)
    c = ne.Variable(dim=3, initializer=init, name="items").lookup(keys)
    d = ne.Variable(dim=3, initializer=init, seed=zlib.crc32(b"users")).lookup(keys)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, d)
    assert not np.isin(a, c).any()


def test_seed_wraps_to_64_bits():
    keys = np.array([1, 2, 3])
    init = I.RandomNormal(stddev=1.0)
    a = ne.Variable(dim=2, initializer=init, seed=-1).lookup(keys)
    b = ne.Variable(dim=2, initializer=init, seed=2 ** 64 - 1).lookup(keys)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", [1.5, "7", True])
def test_bad_seed_raises(seed):
    with pytest.raises(TypeError, match="seed"):
        ne.Variable(dim=2, initializer=I.RandomNormal(), seed=seed)
    with pytest.raises(TypeError, match="seed"):
        ne.Variable(dim=2, initializer=I.RandomNormal(seed=seed))


# ---- determinism through a Variable ------------------------------------------------

@pytest.mark.parametrize("init", RANDOM, ids=lambda i: type(i).__name__)
@given(keys=st.lists(st.one_of(st.sampled_from([INT64_MIN, INT64_MAX, -1, 0]),
                               st.integers(INT64_MIN, INT64_MAX)), min_size=1, max_size=40),
       perm_seed=st.integers(0, 2 ** 32 - 1))
def test_same_values_for_any_shard_count_and_order(init, keys, perm_seed):
    keys = np.array(keys, np.int64)
    perm = np.random.default_rng(perm_seed).permutation(keys.shape[0])
    ref = ne.Variable(dim=6, initializer=init).lookup(keys)
    for shards in (2, 7):
        v = ne.Variable(dim=6, initializer=init, num_shards=shards)
        np.testing.assert_array_equal(v.lookup(keys[perm]), ref[perm])
        got = v.find_or_insert(keys[::-1])       # inserted rows keep their initial values
        np.testing.assert_array_equal(got, ref[::-1])
        ex_keys, ex_vals = v.export()
        where = {int(x): i for i, x in enumerate(keys)}
        assert sorted(ex_keys.tolist()) == sorted(where)
        np.testing.assert_array_equal(ex_vals, ref[[where[x] for x in ex_keys.tolist()]])


def test_same_values_for_int32_and_int64_tables():
    keys = np.array([INT32_MIN, -1, 0, 1, INT32_MAX], np.int64)
    init = I.TruncatedNormal(0.0, 1.0, seed=5)
    a = ne.Variable(dim=4, initializer=init).lookup(keys)
    b = ne.Variable(dim=4, initializer=init, key_dtype=np.int32,
                    num_shards=3).lookup(keys.astype(np.int32))
    np.testing.assert_array_equal(a, b)


def test_values_do_not_depend_on_dim_or_value_dtype():
    keys = np.array([INT64_MIN, 3, INT64_MAX])
    init = I.RandomNormal(0.0, 1.0, seed=8)
    wide = ne.Variable(dim=8, initializer=init, value_dtype=np.float64).lookup(keys)
    narrow = ne.Variable(dim=3, initializer=init, value_dtype=np.float64).lookup(keys)
    f32 = ne.Variable(dim=3, initializer=init).lookup(keys)
    np.testing.assert_array_equal(wide[:, :3], narrow)
    np.testing.assert_array_equal(f32, narrow.astype(np.float32))


def test_table_state_does_not_change_initial_values():
    """Absent keys look the same before and after other keys are inserted and removed."""
    init = I.RandomUniform(-1.0, 1.0, seed=2)
    v = ne.Variable(dim=3, initializer=init, num_shards=2)
    probe = np.array([INT64_MIN, 77, INT64_MAX])
    before = v.lookup(probe)
    v.find_or_insert(np.arange(5000))
    v.remove(np.arange(0, 5000, 2))
    np.testing.assert_array_equal(v.lookup(probe), before)
    v.find_or_insert(probe)
    v.remove(probe)                               # rows go to the free list
    v.find_or_insert(np.array([10 ** 12, 10 ** 12 + 1, 10 ** 12 + 2]))   # reuse them
    np.testing.assert_array_equal(v.lookup(probe), before)
    np.testing.assert_array_equal(v.find_or_insert(probe), before)


# ---- distributions through a Variable ----------------------------------------------

def test_distributions_through_variable():
    keys = np.arange(60_000, dtype=np.int64) * 104729 - 17
    n = ne.Variable(dim=5, initializer=I.RandomNormal(1.0, 3.0, seed=1),
                    value_dtype=np.float64).lookup(keys).ravel()
    assert abs(n.mean() - 1.0) < 5 * 3.0 / math.sqrt(n.size)
    assert abs(n.std() / 3.0 - 1) < 0.01
    t = ne.Variable(dim=5, initializer=I.TruncatedNormal(1.0, 3.0, seed=1),
                    value_dtype=np.float64).lookup(keys).ravel()
    assert np.abs(t - 1.0).max() <= 6.0 * (1 + 1e-8)
    assert abs(t.std() / 3.0 - 0.8796) < 0.005
    u = ne.Variable(dim=5, initializer=I.RandomUniform(-2.0, 4.0, seed=1)).lookup(keys).ravel()
    assert u.min() >= -2.0 and u.max() <= 4.0
    assert abs(u.mean() - 1.0) < 0.02
    assert abs(u.std() - 6.0 / math.sqrt(12)) < 0.01
