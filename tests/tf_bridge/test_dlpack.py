"""DLPack hand-off: zero-copy when aligned, and nothing unaligned ever reaches TF."""
import numpy as np
import pytest
import tensorflow as tf

import numbaemb as ne
import tf_bridge as de
from tf_bridge import dlpack


def ptr(x):
    """Data pointer of a numpy array or (zero-copy view of) an eager tensor."""
    return (x if isinstance(x, np.ndarray) else np.from_dlpack(x)).ctypes.data


def unaligned(shape, dtype, offset):
    """A C-contiguous array whose pointer is ``offset`` mod 64."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = ne.aligned_empty(n + 64, np.uint8)
    arr = raw[offset:offset + n].view(dtype).reshape(shape)
    arr[...] = np.arange(arr.size).reshape(shape)
    assert arr.ctypes.data % 64 == offset
    return arr


@pytest.fixture
def spy(monkeypatch):
    """Records the pointer of every buffer that reaches tf.experimental.dlpack.from_dlpack."""
    seen = []
    real = dlpack._tf_from_dlpack

    def checked(capsule):
        t = real(capsule)
        seen.append(ptr(t))
        return t

    monkeypatch.setattr(dlpack, "_tf_from_dlpack", checked)
    return seen


def test_aligned_array_is_shared_not_copied(spy):
    a = ne.aligned_empty((5, 7), np.float32)
    a[...] = 3.0
    dlpack.reset_stats()
    t = dlpack.to_tf(a)
    assert spy == [a.ctypes.data] and ptr(t) == a.ctypes.data
    assert dlpack.STATS.to_tf_copies == 0
    np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("offset", [4, 8, 16, 32, 48])
def test_unaligned_array_never_reaches_tf_unaligned(spy, offset):
    a = unaligned((6, 5), np.float32, offset)
    dlpack.reset_stats()
    t = dlpack.to_tf(a)
    assert len(spy) == 1 and spy[0] % 64 == 0 and spy[0] != a.ctypes.data
    assert dlpack.STATS.to_tf_copies == 1
    np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("make", [
    lambda: ne.aligned_empty((4, 6), np.float64)[:, ::2],         # strided
    lambda: np.asfortranarray(np.ones((3, 4), np.float32)),       # Fortran order
    lambda: np.frombuffer(bytes(64 * 4), np.float32).reshape(4, 16),   # read-only
])
def test_strided_fortran_readonly_are_copied_aligned(spy, make):
    a = make()
    a_values = np.array(a)
    t = dlpack.to_tf(a)
    assert spy[0] % 64 == 0
    np.testing.assert_array_equal(t.numpy(), a_values)


def test_empty_and_scalar(spy):
    assert dlpack.to_tf(np.empty((0, 3), np.float32)).shape == (0, 3)
    assert int(dlpack.to_tf(np.array(7, np.int64))) == 7
    assert all(p % 64 == 0 for p in spy)


def test_from_tf_is_a_read_only_view():
    t = tf.constant(np.arange(12, dtype=np.int64).reshape(3, 4))
    a = dlpack.from_tf(t)
    assert ptr(t) == a.ctypes.data and not a.flags.writeable
    assert a.dtype == np.int64 and a.shape == (3, 4)


def test_graph_numpy_call_keeps_aligned_outputs_without_copy():
    seen = {}

    def fn(x):
        out = ne.aligned_empty(x.shape, np.float32)
        out[...] = x
        seen["ptr"] = out.ctypes.data
        return (out,)

    f = tf.function(lambda x: dlpack.numpy_call(fn, [x], [tf.float32])[0])
    r = f(tf.ones([8, 4]))
    assert ptr(r) == seen["ptr"]


def test_graph_numpy_call_aligns_unaligned_outputs():
    f = tf.function(lambda x: dlpack.numpy_call(lambda a: (unaligned((3, 4), np.float32, 8),),
                                                [x], [tf.float32])[0])
    dlpack.reset_stats()
    r = f(tf.ones([1]))
    assert dlpack.STATS.to_tf_copies == 1 and ptr(r) % 64 == 0
    np.testing.assert_array_equal(r.numpy(), np.arange(12).reshape(3, 4))


def test_lookup_hands_rows_to_tf_without_copy(monkeypatch):
    """Copy count per lookup: 0 for the ids (TF -> numpy) and 0 for the rows (numpy -> TF),
    eagerly and inside tf.function."""
    v = de.Variable(dim=8, name="copy_count")
    rows = {}
    real = v.table.lookup

    def spy_lookup(keys, return_exists=False, **kw):      # kw: out=, a pooled buffer
        out = real(keys, return_exists, **kw)
        rows["ptr"], rows["keys"] = out[0].ctypes.data, keys.ctypes.data
        return out

    monkeypatch.setattr(v.table, "lookup", spy_lookup)
    ids = tf.constant(np.arange(64).reshape(16, 4), tf.int64)
    dlpack.reset_stats()
    e = de.embedding_lookup(v, ids)
    assert ptr(e) == rows["ptr"] and rows["keys"] == ptr(ids)
    assert dlpack.STATS.as_dict() == dict(to_tf=1, to_tf_copies=0, from_tf=1, from_tf_copies=0)
    g = tf.function(lambda i: de.embedding_lookup(v, i))(ids)
    assert ptr(g) == rows["ptr"] and rows["keys"] == ptr(ids)
    assert dlpack.STATS.to_tf_copies == 0


def test_unaligned_rows_from_the_table_are_aligned_before_tf(monkeypatch, spy):
    v = de.Variable(dim=4, name="unaligned_rows")
    monkeypatch.setattr(v.table, "lookup",
                        lambda keys, return_exists=False, **kw: (unaligned((2, 4), np.float32, 16),
                                                           np.zeros(2, bool)))
    e = v.lookup(tf.constant([1, 2], tf.int64))
    assert spy and all(p % 64 == 0 for p in spy)
    np.testing.assert_array_equal(e.numpy(), np.arange(8).reshape(2, 4))
