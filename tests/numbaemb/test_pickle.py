"""Pickling and copying a table (``Variable.__reduce__``, ``checkpoint.to_bytes`` /
``from_bytes``): the copy is an independent table whose state is the original's, so
the same later calls give both the same results (bounded clocks and scores, filter
counts, optimizer slots and steps carried over)."""
import copy
import pickle

import numpy as np
import pytest

import numbaemb as ne
from numbaemb import checkpoint
from tests.cuda_support import needs_cuda

I64 = np.iinfo(np.int64)
EXTREME = np.array([I64.min, I64.max, -1, 0])


def by_sign(keys, n):
    """A custom partitioner (module-level, so it pickles with the table)."""
    return (np.asarray(keys) < 0).astype(np.int64) % n


def plain():
    return ne.Variable(3, num_shards=3, value_dtype=np.float16, partitioner=by_sign), \
        lambda i: np.concatenate([EXTREME, np.arange(40) * 7919 - 100 * i])


def int32_keys():
    return ne.Variable(3, key_dtype=np.int32, num_shards=2), \
        lambda i: np.arange(-20, 20, dtype=np.int32) * (i + 1)


def bounded():
    return ne.Variable(3, max_capacity=50, evict="lfu"), \
        lambda i: np.concatenate([EXTREME, np.arange(30) + 13 * i])


def admitted():
    return ne.Variable(3, admit=ne.admission.CounterFilter(min_count=2), steps_to_live=2), \
        lambda i: np.concatenate([EXTREME, np.arange(20) + 5 * i])


def strings():
    return ne.Variable(3, key_dtype="string"), \
        lambda i: np.array([f"id-{j * (i + 1)}" for j in range(25)] + ["", "\x00x"], object)


COPIES = {"pickle": lambda v: pickle.loads(pickle.dumps(v)), "copy": copy.copy,
          "deepcopy": copy.deepcopy,
          "bytes": lambda v: checkpoint.from_bytes(checkpoint.to_bytes(v),
                                                   partitioner=v.partitioner)}


def step(v, keys, t):
    """One round of what a training loop does: a lookup, an Adam step, an insert."""
    out = [host(v.lookup(keys)).astype(np.float32)]
    ids = v.ids(keys, insert=True) if is_str(v) else keys
    ne.optimizers.apply_gradients(v, ne.optimizers.Adam(0.1), ids,
                                  np.full((len(keys), v.dim), 0.5 * t, np.float32), step=t)
    r = v.find_or_insert(keys, return_exists=True)
    return out + [host(r[0]).astype(np.float32), host(r[1])]


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def is_str(v):
    return v.key_dtype == np.dtype(object)         # a string-keyed table


def state(v):
    cols = sorted({c for s in v.shards for c in s.columns})
    out = {}
    for c in cols:
        keys, vals = v.export(c)
        keys = host(keys).astype(object if is_str(v) else np.int64)
        order = np.argsort(keys.astype(bytes) if is_str(v) else keys, kind="stable")
        out[c] = (keys[order].tolist(), host(vals)[order].astype(np.float64))
    return out


def assert_same_state(a, b):
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys()
    for c in sa:
        assert sa[c][0] == sb[c][0], c
        np.testing.assert_array_equal(sa[c][1], sb[c][1], err_msg=c)


@pytest.mark.parametrize("make", [plain, int32_keys, bounded, admitted, strings])
@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_copy_is_an_independent_table_that_goes_on_as_the_original(make, how):
    v, batch = make()
    for t in range(1, 4):
        step(v, batch(t), t)
    w = COPIES[how](v)
    assert w is not v and type(w) is type(v)
    assert (w.dim, w.key_dtype, w.value_dtype, w.num_shards, w.name, w.seed,
            w.partitioner, w.max_capacity, w.evict, w.steps_to_live) == \
        (v.dim, v.key_dtype, v.value_dtype, v.num_shards, v.name, v.seed,
         v.partitioner, v.max_capacity, v.evict, v.steps_to_live)
    assert_same_state(v, w)
    for t in range(4, 7):                   # the same calls: the same results on both
        for x, y in zip(step(v, batch(t), t), step(w, batch(t), t)):
            np.testing.assert_array_equal(x, y)
    assert_same_state(v, w)
    if v.steps_to_live:
        assert ne.expiry.expire(v) == ne.expiry.expire(w) > 0
    size = v.size()
    w.find_or_insert(batch(99))               # independent: the original does not change
    assert v.size() == size


def test_limits_travel_and_split_tables_refuse():
    v = ne.Variable(2)
    v.key_range, v.max_keys = (-5, 5), 7
    w = pickle.loads(pickle.dumps(v))
    assert (w.key_range, w.max_keys) == ((-5, 5), 7)
    with pytest.raises(ValueError, match="key"):
        w.find_or_insert(np.array([9]))
    v.comm = object()                        # what a table split across ranks has
    for copier in (pickle.dumps, copy.copy, checkpoint.to_bytes):
        with pytest.raises(TypeError, match="split across MPI ranks cannot be pickled"):
            copier(v)
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError), match="lambda"):
        pickle.dumps(ne.Variable(2, num_shards=2, partitioner=lambda k, n: k % n))


def test_from_bytes_refuses_what_is_not_a_checkpoint():
    v = ne.Variable(2)
    v.find_or_insert(EXTREME)
    data = checkpoint.to_bytes(v)
    with pytest.raises(TypeError, match="data must be bytes"):
        checkpoint.from_bytes("not bytes")
    for bad in (b"", b"PK\x03\x04 nothing", data[: len(data) // 2], data[:-1]):
        with pytest.raises(ValueError, match="corrupt/truncated"):
            checkpoint.from_bytes(bad)
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF                 # inside an array or a header
    try:
        w = checkpoint.from_bytes(flipped)
    except ValueError as e:
        assert "corrupt" in str(e)
    else:
        assert_same_state(v, w)
    with pytest.raises(ValueError, match="num_shards must be >= 1"):
        checkpoint.from_bytes(data, num_shards=0)
    assert checkpoint.from_bytes(memoryview(data), num_shards=4).size() == 4


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("kw", [dict(num_shards=2), dict(max_capacity=20, evict="lru")])
def test_gpu_tables_pickle_onto_the_gpu(kw):
    v = ne.Variable(3, device="cuda", **kw)
    for t in range(1, 4):
        step(v, np.arange(30) * t - 40, t)
    w = pickle.loads(pickle.dumps(v))
    assert w.device == v.device and w.size() == v.size()
    assert_same_state(v, w)
    for x, y in zip(step(v, np.arange(50) - 7, 4), step(w, np.arange(50) - 7, 4)):
        np.testing.assert_array_equal(x, y)
    assert_same_state(v, w)
