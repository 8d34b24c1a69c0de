"""Bad input: a clear ``TypeError`` / ``ValueError`` naming the argument, and nothing applied.

Every failing call is made on a table with contents; afterwards its size and
export must be exactly what they were.  Also: NaN values are stored as is,
empty key arrays work for every method, and ``get_variable`` returns the same
object for the same configuration and refuses a clashing one.
"""
import contextlib
import itertools

import numpy as np
import pytest

import numbaemb as ne
from numbaemb import initializers as I

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
INT32_MIN, INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
DIM = 3
_names = itertools.count()


def snapshot(v):
    keys, vals = v.export()
    order = np.argsort(keys, kind="stable")
    return (v.size(), [v.size(i) for i in range(v.num_shards)], keys[order].tolist(),
            vals[order].view(np.uint8).tobytes())


@contextlib.contextmanager
def unchanged(v):
    before = snapshot(v)
    yield
    assert snapshot(v) == before, "a failed call changed the table"


def filled(num_shards=1, key_dtype=np.int64, partitioner=None):
    v = ne.Variable(dim=DIM, num_shards=num_shards, key_dtype=key_dtype,
                    partitioner=partitioner, initializer=I.Constant(-1.0))
    info = np.iinfo(key_dtype)
    keys = np.array([info.min, info.max, -1, 0, 1, 2, 3, 10, 11], key_dtype)
    v.upsert(keys, np.arange(keys.size * DIM, dtype=np.float32).reshape(-1, DIM))
    return v, keys


def mutations(v, keys, vals=None, exists=None, old=None):
    """Every mutating call with the given arguments (defaults valid for ``keys``)."""
    shape = np.shape(keys)
    vals = np.ones(shape + (DIM,), np.float32) if vals is None else vals
    old = np.zeros(shape + (DIM,), np.float32) if old is None else old
    exists = np.zeros(shape, np.bool_) if exists is None else exists
    return {
        "upsert": lambda: v.upsert(keys, vals),
        "find_or_insert": lambda: v.find_or_insert(keys),
        "accum": lambda: v.accum(keys, old, vals, exists),
        "remove": lambda: v.remove(keys),
        "lookup": lambda: v.lookup(keys),
    }


def assert_every_call_rejects(v, keys, error, match):
    """Each of :func:`mutations` (and ``lookup``) with ``keys`` raises ``error`` matching
    ``match`` and leaves ``v`` unchanged."""
    for name, call in mutations(v, keys).items():
        with unchanged(v), pytest.raises(error, match=match):
            call()


SHARDS = [1, 3]


# ---- keys -----------------------------------------------------------------------------

@pytest.mark.parametrize("num_shards", SHARDS)
@pytest.mark.parametrize("bad", [np.array([1.0, 2.0]), np.array([1.5]), [0.5, 1.0],
                                 np.array([True, False]), np.array(["1", "2"]),
                                 np.array([1 + 2j]), np.array([1, 2], object), None, "12",
                                 np.empty(0, np.float64)])
def test_non_integer_keys_raise_type_error(num_shards, bad):
    v, _ = filled(num_shards)
    assert_every_call_rejects(v, bad, TypeError, "keys")


@pytest.mark.parametrize("num_shards", SHARDS)
@pytest.mark.parametrize("bad", [np.array([0, INT32_MAX + 1]), np.array([INT32_MIN - 1, 5]),
                                 np.array([INT64_MIN]), np.array([[1], [INT64_MAX]]),
                                 np.array([INT32_MAX + 1], np.uint32),
                                 np.array([2 ** 63], np.uint64)])
def test_int32_table_rejects_out_of_range_keys(num_shards, bad):
    v, _ = filled(num_shards, np.int32)
    assert_every_call_rejects(v, bad, ValueError, "keys.*int32")


@pytest.mark.parametrize("num_shards", SHARDS)
@pytest.mark.parametrize("bad", [np.array([2 ** 63], np.uint64),
                                 np.array([1, 2 ** 64 - 1], np.uint64), [2 ** 63, 2 ** 63 + 5],
                                 [2 ** 64], [-1, 2 ** 63], [[1], [-2 ** 63 - 1]]])
def test_uint64_keys_above_int64_max_raise(num_shards, bad):
    v, _ = filled(num_shards)
    assert_every_call_rejects(v, bad, ValueError, "keys.*int64")


@pytest.mark.parametrize("num_shards", SHARDS)
def test_in_range_keys_of_other_int_dtypes_are_accepted(num_shards):
    v, _ = filled(num_shards, np.int32)
    v.upsert(np.array([INT32_MAX, INT32_MIN], np.int64), np.full((2, DIM), 7.0))
    v.upsert(np.array([5], np.uint64), np.full((1, DIM), 8.0))
    v.upsert(np.array([6], np.int8), np.full((1, DIM), 9.0))
    got = v.lookup(np.array([INT32_MAX, INT32_MIN, 5, 6], np.int64))
    np.testing.assert_array_equal(got[:, 0], [7.0, 7.0, 8.0, 9.0])
    w, _ = filled(num_shards)
    w.upsert(np.array([INT64_MAX], np.uint64), np.full((1, DIM), 4.0))
    assert w.lookup(np.array([INT64_MAX]))[0, 0] == 4.0
    assert w.export()[0].dtype == np.int64 and v.export()[0].dtype == np.int32


# ---- values / exists ------------------------------------------------------------------

_BAD_VALUES = ([(ValueError, (4,) + shape, np.float32)
                for shape in [(), (DIM + 1,), (DIM - 1,), (1,), (DIM, 1)]]
               + [(ValueError, shape, np.float32)
                  for shape in [(3, DIM), (5, DIM), (1, DIM), (2, 2, DIM), ()]]
               + [(TypeError, (4, DIM), dt)
                  for dt in [np.bool_, np.complex64, np.complex128, object, "U3"]])


@pytest.mark.parametrize("num_shards", SHARDS)
@pytest.mark.parametrize("error,vals_shape,dtype", _BAD_VALUES)
def test_values_of_wrong_shape_or_dtype_raise(num_shards, error, vals_shape, dtype):
    """Values of the wrong shape (ValueError) or a non-real dtype (TypeError), as
    ``upsert`` values and as either side of ``accum``: nothing is applied."""
    v, _ = filled(num_shards)
    keys = np.array([0, 5, INT64_MIN, 99])
    bad = np.ones(vals_shape).astype(dtype)
    good = np.ones((4, DIM), np.float32)
    ex = np.array([True, False, True, False])
    with unchanged(v), pytest.raises(error, match="values"):
        v.upsert(keys, bad)
    with unchanged(v), pytest.raises(error, match="new_values"):
        v.accum(keys, good, bad, ex)
    with unchanged(v), pytest.raises(error, match="old_values"):
        v.accum(keys, bad, good, ex)


@pytest.mark.parametrize("num_shards", SHARDS)
def test_exists_of_wrong_shape_or_dtype_raise(num_shards):
    v, _ = filled(num_shards)
    keys = np.array([[0, 5], [99, INT64_MAX]])
    vals = np.ones((2, 2, DIM), np.float32)
    for bad in (np.ones(4, bool), np.ones((2, 3), bool), np.ones((2, 2, 1), bool), True):
        with unchanged(v), pytest.raises(ValueError, match="exists"):
            v.accum(keys, vals, vals, bad)
    for bad in (np.ones((2, 2), np.int64), np.ones((2, 2), np.float32),
                np.zeros((2, 2), np.uint8), [[1, 0], [0, 1]]):
        with unchanged(v), pytest.raises(TypeError, match="exists"):
            v.accum(keys, vals, vals, bad)


@pytest.mark.parametrize("num_shards", SHARDS)
def test_value_casts_and_layouts_are_accepted(num_shards):
    v = ne.Variable(dim=DIM, num_shards=num_shards)
    keys = np.array([1, 2, 3])
    v.upsert(keys, np.arange(9, dtype=np.int64).reshape(3, 3))               # ints cast
    np.testing.assert_array_equal(v.lookup(keys), np.arange(9).reshape(3, 3))
    v.upsert(keys, np.arange(9, dtype=np.float64).reshape(3, 3).T)           # not contiguous
    np.testing.assert_array_equal(v.lookup(keys), np.arange(9).reshape(3, 3).T)
    v.upsert(keys[::-1].copy()[::-1], np.zeros((3, 3)))                      # strided keys
    assert (v.lookup(keys) == 0).all()


# ---- NaN and special floats ------------------------------------------------------------

@pytest.mark.parametrize("num_shards", SHARDS)
@pytest.mark.parametrize("value_dtype, uint", [(np.float32, np.uint32), (np.float64, np.uint64),
                                               (np.float16, np.uint16)])
def test_nan_inf_and_signed_zero_are_stored_bit_exact(num_shards, value_dtype, uint):
    v = ne.Variable(dim=4, num_shards=num_shards, value_dtype=value_dtype)
    payload = {np.uint16: 0x7E23, np.uint32: 0x7FC00123, np.uint64: 0x7FF8000000000123}[uint]
    payload_nan = np.array([payload], uint).view(value_dtype)[0]
    row = np.array([np.nan, -np.inf, -0.0, payload_nan], value_dtype)
    keys = np.array([INT64_MIN, -1, INT64_MAX])
    v.upsert(keys, np.tile(row, (3, 1)))
    got = v.lookup(keys)
    assert got.view(uint).tolist() == np.tile(row, (3, 1)).view(uint).tolist()
    ek, ev = v.export()
    assert ev.view(uint).tolist() == np.tile(row, (3, 1)).view(uint).tolist()
    assert np.isnan(v.find_or_insert(keys)[:, 0]).all()
    # accum on a NaN row stays NaN; other columns accumulate normally
    v.accum(keys[:1], np.zeros((1, 4), value_dtype), np.ones((1, 4), value_dtype), np.array([True]))
    r = v.lookup(keys[:1])[0]
    assert np.isnan(r[0]) and r[1] == -np.inf and r[2] == 1.0


# ---- empty keys -------------------------------------------------------------------------

@pytest.mark.parametrize("num_shards", SHARDS)
@pytest.mark.parametrize("key_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3)])
def test_empty_keys_work_for_every_method(num_shards, key_dtype, shape):
    v, _ = filled(num_shards, key_dtype)
    keys = np.empty(shape, key_dtype)
    vals = np.empty(shape + (DIM,), np.float32)
    with unchanged(v):
        out = v.lookup(keys)
        assert out.shape == shape + (DIM,) and out.dtype == np.float32
        out, ex = v.lookup(keys, return_exists=True)
        assert out.shape == shape + (DIM,) and ex.shape == shape and ex.dtype == np.bool_
        out, ex = v.find_or_insert(keys, return_exists=True)
        assert out.shape == shape + (DIM,) and ex.shape == shape
        assert v.find_or_insert(keys).shape == shape + (DIM,)
        v.upsert(keys, vals)
        v.accum(keys, vals, vals, np.empty(shape, np.bool_))
        v.remove(keys)
    v.remove([])
    assert v.lookup([]).shape == (0, DIM)
    v.clear()
    k, x = v.export()
    assert k.shape == (0,) and k.dtype == key_dtype and x.shape == (0, DIM)
    assert v.size() == 0 and all(v.size(i) == 0 for i in range(num_shards))
    assert v.lookup(keys).shape == shape + (DIM,)


def test_empty_list_keys_with_other_empty_args():
    v, _ = filled()
    with unchanged(v):
        v.upsert([], np.empty((0, DIM)))
        v.accum([], np.empty((0, DIM)), np.empty((0, DIM)), np.empty(0, bool))
        assert v.find_or_insert([]).shape == (0, DIM)


# ---- constructor arguments ---------------------------------------------------------------

@pytest.mark.parametrize("kwargs, err, match", [
    (dict(dim=0), ValueError, "dim"),
    (dict(dim=-3), ValueError, "dim"),
    (dict(dim=2.0), TypeError, "dim"),
    (dict(dim="4"), TypeError, "dim"),
    (dict(dim=True), TypeError, "dim"),
    (dict(dim=None), TypeError, "dim"),
    (dict(dim=4, num_shards=0), ValueError, "num_shards"),
    (dict(dim=4, num_shards=-1), ValueError, "num_shards"),
    (dict(dim=4, num_shards=2.5), TypeError, "num_shards"),
    (dict(dim=4, num_shards=None), TypeError, "num_shards"),
    (dict(dim=4, key_dtype=np.uint64), TypeError, "key_dtype"),
    (dict(dim=4, key_dtype=np.int16), TypeError, "key_dtype"),
    (dict(dim=4, key_dtype=np.float64), TypeError, "key_dtype"),
    (dict(dim=4, key_dtype="not-a-dtype"), TypeError, "key_dtype"),
    (dict(dim=4, key_dtype=object()), TypeError, "key_dtype"),
    (dict(dim=4, value_dtype=np.uint16), TypeError, "value_dtype"),
    (dict(dim=4, value_dtype=np.uint32), TypeError, "value_dtype"),
    (dict(dim=4, value_dtype=np.complex64), TypeError, "value_dtype"),
    (dict(dim=4, value_dtype="nope"), TypeError, "value_dtype"),
    (dict(dim=4, partitioner=3), TypeError, "partitioner"),
    (dict(dim=4, partitioner="mod"), TypeError, "partitioner"),
    (dict(dim=4, initializer="zeros"), TypeError, "initializer"),
    (dict(dim=4, initializer=True), TypeError, "initializer"),
    (dict(dim=4, initializer=object()), TypeError, "initializer"),
    (dict(dim=4, initializer=[1.0, 2.0]), ValueError, "dim"),
    (dict(dim=4, initializer=np.zeros((4, 1))), ValueError, "shape"),
    (dict(dim=4, init_size=-1), ValueError, "init_size"),
    (dict(dim=4, init_size=1.5), TypeError, "init_size"),
    (dict(dim=4, name=5), TypeError, "name"),
    (dict(dim=4, seed=0.5), TypeError, "seed"),
])
def test_bad_constructor_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        ne.Variable(**kwargs)


def test_good_constructor_variants():
    v = ne.Variable(np.int64(4), num_shards=np.int32(2), key_dtype="int32",
                    value_dtype="float64", init_size=100)
    assert (v.dim, v.num_shards, v.key_dtype, v.value_dtype) == (4, 2, np.int32, np.float64)
    assert v.lookup(np.array([1])).dtype == np.float64 and v.size() == 0


# ---- partitioner -----------------------------------------------------------------------

BAD_PARTITIONERS = {
    "too_big": lambda keys, n: np.full(keys.shape, n),
    "negative": lambda keys, n: np.full(keys.shape, -1),
    "float": lambda keys, n: np.zeros(keys.shape, np.float64),
    "short": lambda keys, n: np.zeros(keys.shape[0] - 1 if keys.shape[0] else 1, np.int64),
    "2d": lambda keys, n: np.zeros((keys.shape[0], 1), np.int64),
    "scalar": lambda keys, n: 0,
    "one_bad": lambda keys, n: np.where(np.arange(keys.shape[0]) == keys.shape[0] - 1, n + 5,
                                        0),
    "bool": lambda keys, n: np.zeros(keys.shape, bool),
}


@pytest.mark.parametrize("which", sorted(BAD_PARTITIONERS))
def test_bad_partitioner_output_raises_and_applies_nothing(which):
    good, keys = filled(3)
    v = ne.Variable(dim=DIM, num_shards=3, partitioner=BAD_PARTITIONERS[which],
                    initializer=I.Constant(-1.0))
    # fill through the internal shards so the table has contents to protect
    kk, vv = good.export()
    for s in range(3):
        sel = (kk.view(np.uint64) % np.uint64(3)).astype(int) == s
        v.shards[s].upsert(kk[sel].astype(np.int64), np.ascontiguousarray(vv[sel]))
    assert v.size() == keys.size
    batch = np.array([0, 1, 2, 3, 4, 5, INT64_MIN, INT64_MAX, 10, 11])
    assert_every_call_rejects(v, batch, ValueError, "partitioner")


def test_partitioner_that_raises_applies_nothing():
    calls = []

    def part(keys, n):
        calls.append(keys.copy())
        if len(calls) > 1:
            raise RuntimeError("boom")
        return np.zeros(keys.shape, np.int64)

    v = ne.Variable(dim=DIM, num_shards=2, partitioner=part)
    v.upsert(np.array([1, 2, 3]), np.ones((3, DIM)))
    assert v.size(0) == 3 and v.size(1) == 0
    for call in mutations(v, np.array([4, 5, 1])).values():
        with unchanged(v), pytest.raises(RuntimeError, match="boom"):
            call()


def test_custom_partitioner_routes_keys():
    v = ne.Variable(dim=DIM, num_shards=4, partitioner=lambda k, n: np.full(k.shape, 2))
    v.upsert(np.array([INT64_MIN, -1, 0, INT64_MAX]), np.ones((4, DIM)))
    assert [v.size(i) for i in range(4)] == [0, 0, 4, 0]
    assert v.lookup(np.array([-1]), return_exists=True)[1].tolist() == [True]


# ---- size(index) --------------------------------------------------------------------------

@pytest.mark.parametrize("num_shards", SHARDS)
def test_size_index_out_of_range(num_shards):
    v, keys = filled(num_shards)
    assert sum(v.size(i) for i in range(num_shards)) == v.size() == keys.size
    assert v.size(np.int64(num_shards - 1)) == v.size(num_shards - 1)
    for bad in (num_shards, num_shards + 10, -1, INT64_MIN):
        with pytest.raises(ValueError, match="index"):
            v.size(bad)
    for bad in (0.0, "0", True, [0]):
        with pytest.raises(TypeError, match="index"):
            v.size(bad)


@pytest.mark.parametrize("num_shards", SHARDS)
def test_export_of_an_unknown_column(num_shards):
    """A ValueError that lists the columns there are (not a KeyError from inside)."""
    v, keys = filled(num_shards)
    ne.optimizers.apply_gradients(v, ne.optimizers.Adam(0.1), keys[:2],
                                  np.ones((2, DIM), np.float32), step=1)
    assert v.export("Adam/m")[1].shape == (keys.size, DIM)
    for bad in ("nope", "m", 0, None):
        with pytest.raises(ValueError, match=r"column must be one of .*'Adam/m'.*'values'"):
            v.export(bad)
    s = ne.Variable(DIM, key_dtype="string")
    s.find_or_insert(np.array(["a"]))
    with pytest.raises(ValueError, match="column"):
        s.export("nope")


def test_arguments_past_the_constructor_name_themselves(tmp_path):
    """Paths, thresholds and seeds of the other entry points: TypeErrors and
    ValueErrors that name the argument, not Python's or Numba's own messages."""
    v, keys = filled(1)
    for bad in (123, None, 1.5):
        with pytest.raises(TypeError, match="path must be a str, bytes or os.PathLike"):
            v.save(bad)
        with pytest.raises(TypeError, match="path must be a str, bytes or os.PathLike"):
            ne.Variable.load(bad)
    v.save(str(tmp_path / "v.nbe").encode())          # bytes paths are paths
    assert ne.Variable.load(tmp_path / "v.nbe").size() == v.size()
    for bad in ("a", None, [1.0], True):
        with pytest.raises(TypeError, match="min_norm must be a number"):
            ne.expiry.prune_small(v, bad)
    with pytest.raises(ValueError, match=r"seed must be < 2\*\*64"):
        ne.admission.RandomFilter(0.5, seed=1 << 70)      # (Numba could not type it)
    assert v.size() == keys.size


@pytest.mark.parametrize("kind", ["plain", "shards", "bounded", "filtered", "float16"])
def test_find_or_insert_into_out_is_the_call_without_it(kind):
    """``out=`` (as ``lookup``'s): the same rows, exists and table, written into the
    caller's buffer and returned as its view; a bad ``out`` raises before any insert."""
    def make():
        return {"plain": lambda: ne.Variable(DIM),
                "shards": lambda: ne.Variable(DIM, num_shards=3),
                "bounded": lambda: ne.Variable(DIM, max_capacity=6, evict="lru"),
                "filtered": lambda: ne.Variable(
                    DIM, admit=ne.admission.CounterFilter(min_count=2)),
                "float16": lambda: ne.Variable(DIM, value_dtype=np.float16)}[kind]()
    a, b = make(), make()
    dt = a.value_dtype
    info = np.iinfo(np.int64)
    keys = np.array([[info.min, 5, -1], [0, 5, info.max]])
    for t in range(3):
        k = keys + t * (t % 2)
        want, want_e = a.find_or_insert(k, return_exists=True)
        buf = np.full((k.size, DIM), 7, dt)
        got, got_e = b.find_or_insert(k, return_exists=True, out=buf)
        assert np.shares_memory(got, buf) and got.shape == k.shape + (DIM,)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_e, want_e)
    assert a.size() == b.size()
    size = b.size()
    for bad, err in [(np.zeros((5, DIM), dt), ValueError),             # rows
                     (np.zeros((6, DIM + 1), dt), ValueError),          # width
                     (np.zeros((6, DIM), np.float64 if dt != np.float64 else np.float32),
                      ValueError),                                      # dtype
                     (np.zeros((DIM, 6), dt).T, ValueError),            # not C-contiguous
                     ([[0.0] * DIM] * 6, TypeError)]:                   # not an array
        with pytest.raises(err, match="out must be"):
            b.find_or_insert(keys + 1000, out=bad)
        assert b.size() == size


def test_repr_shows_the_settings_that_are_not_defaults():
    assert repr(ne.Variable(2, name="r")) == ("Variable(name='r', dim=2, size=0, num_shards=1, "
                                             "key_dtype=int64, value_dtype=float32)")
    text = repr(ne.Variable(2, key_dtype="string", max_capacity=9, evict="lfu", evict_window=4,
                            admit=ne.admission.CounterFilter(min_count=3), steps_to_live=5))
    for part in ("key_dtype=string", "max_capacity=9, evict='lfu', evict_window=4",
                 "admit=CounterFilter(min_count=3", "steps_to_live=5"):
        assert part in text, text


# ---- get_variable ---------------------------------------------------------------------------

def fresh_name():
    return f"test_bad_input_{next(_names)}"


def test_get_variable_same_config_same_object():
    name = fresh_name()
    init = I.RandomNormal(0.0, 1.0, seed=3)
    a = ne.get_variable(name, 4, initializer=init, num_shards=2)
    b = ne.get_variable(name, 4, initializer=I.RandomNormal(0.0, 1.0, seed=3), num_shards=2)
    assert a is b
    a.upsert(np.array([1]), np.ones((1, 4)))
    assert ne.get_variable(name, 4, initializer=init, num_shards=2).size() == 1


@pytest.mark.parametrize("change, field", [
    (dict(dim=5), "dim"),
    (dict(num_shards=3), "num_shards"),
    (dict(key_dtype=np.int32), "key_dtype"),
    (dict(value_dtype=np.float64), "value_dtype"),
    (dict(initializer=I.RandomNormal(0.0, 1.0, seed=4)), "initializer"),
    (dict(initializer=I.TruncatedNormal(0.0, 1.0, seed=3)), "initializer"),
    (dict(seed=123), "seed"),
    (dict(partitioner=lambda k, n: np.zeros(k.shape, np.int64)), "partitioner"),
])
def test_get_variable_clashing_config_raises(change, field):
    name = fresh_name()
    base = dict(dim=4, num_shards=2, initializer=I.RandomNormal(0.0, 1.0, seed=3))
    a = ne.get_variable(name, **base)
    a.upsert(np.array([7]), np.ones((1, 4)))
    with pytest.raises(ValueError, match=field):
        ne.get_variable(name, **{**base, **change})
    assert ne.get_variable(name, **base) is a and a.size() == 1


def test_get_variable_bad_name():
    for bad in (None, 3, b"x"):
        with pytest.raises(TypeError, match="name"):
            ne.get_variable(bad, 4)


# ---- alignment of results, empty ones included ---------------------------------------------

class _MisalignedNumpy:
    """numpy, except that ``empty`` hands out buffers 16 bytes past a 64-byte boundary
    (what a busy small-block heap often does)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=float, *args, **kwargs):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raw = np.empty(n + 128, np.uint8)
        start = (-raw.ctypes.data) % 64 + 16
        out = raw[start:start + n]
        assert out.ctypes.data % 64 == 16 or n == 0
        return out.view(dtype).reshape(shape)


@pytest.mark.parametrize("num_shards", SHARDS)
@pytest.mark.parametrize("shape", [(0,), (2, 0), (1,), (5,), (3, 4)])
def test_results_are_aligned_even_when_the_heap_is_not(monkeypatch, num_shards, shape):
    from numbaemb import _memory
    v, _ = filled(num_shards)
    monkeypatch.setattr(_memory, "np", _MisalignedNumpy())
    keys = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    for call in (lambda: _memory.aligned_empty(shape + (DIM,), np.float32),
                 lambda: v.lookup(keys),
                 lambda: v.lookup(keys, return_exists=True)[0],
                 lambda: v.find_or_insert(keys)):
        out = call()
        assert out.shape == shape + (DIM,)
        assert ne.is_aligned(out), f"result of shape {out.shape} at offset {out.ctypes.data % 64}"


def test_key_range_and_max_keys_refuse_before_changing_anything():
    import numbaemb as ne
    v = ne.Variable(2, name="limited", num_shards=2)
    v.key_range, v.max_keys = (0, 10), 3
    with pytest.raises(ValueError, match=r"keys must be in \[0, 10\).*min -1, max 4"):
        v.upsert(np.array([4, -1]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="keys must be in"):
        v.lookup(np.array([10]))
    assert v.size() == 0
    opt = ne.optimizers.SGD(1.0)
    ne.optimizers.apply_gradients(v, opt, np.array([1, 2, 2, 3]), np.ones((4, 2)), step=1)
    with pytest.raises(ValueError, match="would put 4 keys in it, over its capacity of 3"):
        ne.optimizers.apply_gradients(v, opt, np.array([1, 4]), np.ones((2, 2)), step=2)
    assert v.size() == 3 and np.array_equal(v.lookup(np.array([1]))[0], [-1.0, -1.0])
    ne.optimizers.apply_gradients(v, opt, np.array([3, 3]), np.ones((2, 2)), step=2)
    assert np.array_equal(v.lookup(np.array([3]))[0], [-3.0, -3.0])


def test_load_on_an_instance_raises_instead_of_leaving_it_as_it_was(tmp_path):
    """``v.load(path)`` would return a new table and leave ``v`` empty: it raises, the
    table is unchanged, and the class form loads."""
    path = str(tmp_path / "t.ckpt")
    saved = ne.Variable(dim=2, name="saved")
    saved.upsert(np.array([5, -1]), np.ones((2, 2)))
    saved.save(path)
    v = ne.Variable(dim=2, name="other")
    v.upsert(np.array([7]), np.zeros((1, 2)))
    with pytest.raises(TypeError, match=r"Variable.load makes a new Variable .* "
                                        r"v = Variable.load\(\.\.\.\)"):
        v.load(path)
    assert v.size() == 1 and v.export()[0].tolist() == [7]
    loaded = ne.Variable.load(path)
    assert sorted(loaded.export()[0].tolist()) == [-1, 5]
    assert type(v).load(path).size() == 2


def test_an_empty_checkpoint_path_is_a_value_error(tmp_path):
    """(It wrote a temporary file beside the working directory, then failed the rename.)"""
    v = ne.Variable(dim=2)
    for call in (lambda: v.save(""), lambda: ne.Variable.load(b""),
                 lambda: ne.checkpoint.load("")):
        with pytest.raises(ValueError, match="path must name a file, got an empty string"):
            call()
