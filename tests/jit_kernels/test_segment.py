"""unique_inverse / segment_sum against NumPy oracles (np.unique, np.add.at)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from jit_kernels import segment
from jit_kernels.segment import gather_rows, segment_sum, unique_inverse

I64 = np.iinfo(np.int64)
EXTREMES = [I64.min, I64.max, -1, 0]
keys_st = st.lists(st.one_of(st.sampled_from(EXTREMES), st.integers(-3, 3),
                             st.integers(I64.min, I64.max)), max_size=300)


def naive_unique(keys):
    """First-occurrence-ordered unique keys and inverse, via np.unique."""
    _, first, inv_sorted = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first)               # sorted-unique index -> first-occurrence rank
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return keys[np.sort(first)], rank[inv_sorted.reshape(-1)]


def naive_segment_sum(values, inverse, n_unique):
    out = np.zeros((n_unique, values.shape[1]), values.dtype)
    np.add.at(out, inverse, values)         # unbuffered, in position order
    return out


@given(keys_st)
def test_unique_inverse_matches_np_unique(keys):
    keys = np.array(keys, np.int64)
    uniq, inverse = unique_inverse(keys)
    want_u, want_inv = naive_unique(keys)
    assert uniq.dtype == np.int64 and inverse.dtype == np.int64
    np.testing.assert_array_equal(uniq, want_u)
    np.testing.assert_array_equal(inverse, want_inv)


def test_unique_inverse_extremes_and_empty():
    uniq, inv = unique_inverse(np.array(EXTREMES * 3, np.int64))
    assert uniq.tolist() == EXTREMES and inv.tolist() == [0, 1, 2, 3] * 3
    uniq, inv = unique_inverse(np.empty(0, np.int64))
    assert uniq.shape == (0,) and inv.shape == (0,)


def test_unique_inverse_large_zipf_is_deterministic():
    keys = np.random.default_rng(1).zipf(1.3, 200_000).astype(np.int64) * -7919
    want_u, want_inv = naive_unique(keys)
    for _ in range(3):                      # race order varies, the answer must not
        uniq, inverse = unique_inverse(keys)
        np.testing.assert_array_equal(uniq, want_u)
        np.testing.assert_array_equal(inverse, want_inv)


@pytest.mark.parametrize("parallel_min", [0, 1 << 40], ids=["parallel", "serial"])
def test_unique_and_gather_paths_match_the_oracle(monkeypatch, parallel_min):
    """Both drivers (lock-free parallel + renumbering; plain serial probing), with
    extreme keys and keys that share low hash bits, and the spread that follows."""
    monkeypatch.setattr(segment, "PARALLEL_MIN", parallel_min)
    rng = np.random.default_rng(3)
    keys = np.concatenate([rng.zipf(1.2, 30_000).astype(np.int64) << 40,
                           np.array(EXTREMES * 5, np.int64), rng.integers(-9, 9, 500)])
    rng.shuffle(keys)
    uniq, inverse = unique_inverse(keys)
    want_u, want_inv = naive_unique(keys)
    np.testing.assert_array_equal(uniq, want_u)
    np.testing.assert_array_equal(inverse, want_inv)
    rows = rng.standard_normal((uniq.shape[0], 16)).astype(np.float32)
    out = gather_rows(rows, inverse, np.empty((keys.shape[0], 16), np.float32))
    np.testing.assert_array_equal(out, rows[want_inv])


@given(keys_st, st.integers(1, 5), st.sampled_from([np.float32, np.float64]),
       st.integers(1, 7), st.integers(0, 2**32 - 1))
def test_segment_sum_matches_add_at_bitwise(keys, dim, dtype, n_threads, seed):
    keys = np.array(keys, np.int64)
    values = np.random.default_rng(seed).standard_normal((keys.shape[0], dim)).astype(dtype)
    uniq, inverse = unique_inverse(keys)
    got = segment_sum(values, inverse, uniq.shape[0], n_threads)
    assert got.dtype == dtype and got.shape == (uniq.shape[0], dim)
    np.testing.assert_array_equal(got, naive_segment_sum(values, inverse, uniq.shape[0]))


def test_segment_sum_same_bits_for_any_thread_count():
    rng = np.random.default_rng(2)
    inverse = np.minimum(rng.zipf(1.2, 50_000), 1000).astype(np.int64) - 1
    values = (rng.standard_normal((50_000, 8)) * 1e3).astype(np.float32)
    ref = segment_sum(values, inverse, 1000, 1)
    for t in (2, 3, 16):
        np.testing.assert_array_equal(segment_sum(values, inverse, 1000, t), ref)
    np.testing.assert_array_equal(ref, naive_segment_sum(values, inverse, 1000))
