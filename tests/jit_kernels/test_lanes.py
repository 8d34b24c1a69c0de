"""``jit_kernels.lanes``: the vector search against numpy's argmin, the vector compare
against a loop."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import errors, njit

from jit_kernels.lanes import WIDTH, ctz, eq32, even_eq32, low32, vectors
from tests.sizing import examples

I64 = np.iinfo(np.int64)


@njit(cache=False)
def _low(a, o):
    return low32(a, o)


@given(st.data())
@settings(max_examples=examples(200), deadline=None)
def test_low32_is_the_first_lowest(data):
    """The lowest of ``a[o:o + 32]`` and its first place (numpy's ``argmin``), values
    from a few (ties common), the int64 extremes among them, at every offset."""
    n = data.draw(st.integers(WIDTH, 3 * WIDTH))
    pool = np.array(data.draw(st.lists(
        st.sampled_from([I64.min, I64.min + 1, -1, 0, 1, 7, I64.max - 1, I64.max]) |
        st.integers(I64.min, I64.max), min_size=1, max_size=5)), np.int64)
    seed = data.draw(st.integers(0, 2 ** 32 - 1))
    a = np.random.default_rng(seed).choice(pool, n)
    for o in range(n - WIDTH + 1):
        w = a[o:o + WIDTH]
        want = (int(w.min()), int(np.argmin(w)))
        low, t = _low(a, o)
        assert (int(low), int(t)) == want, (o, w)


def test_low32_reads_only_its_32_values():
    """Values around the 32 do not count (a lower one just before and after)."""
    a = np.full(3 * WIDTH, 5, np.int64)
    a[WIDTH - 1] = a[2 * WIDTH] = -9
    a[WIDTH + 17] = 4
    assert tuple(int(x) for x in _low(a, WIDTH)) == (4, 17)
    a[WIDTH + 17] = 5
    assert tuple(int(x) for x in _low(a, WIDTH)) == (5, 0)


def test_vectors_is_true_on_the_cpu():
    """(The PTX test compiles the bounded kernels, with their vectors() False, for a GPU.)"""
    assert njit(cache=False)(lambda: vectors())() is True


@njit(cache=False)
def _eq(a, o, d):
    return eq32(a, o, d)


@given(st.data())
@settings(max_examples=examples(200), deadline=None)
def test_eq32_marks_every_equal_byte(data):
    """Bit t set exactly where ``a[o + t] == d``, bytes from a few values (matches
    common), 0 and 255 among them, at every offset."""
    n = data.draw(st.integers(WIDTH, 3 * WIDTH))
    pool = np.array(data.draw(st.lists(st.sampled_from([0, 1, 127, 128, 254, 255]) |
                                       st.integers(0, 255), min_size=1, max_size=4)), np.uint8)
    a = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1))).choice(pool, n)
    d = np.uint8(data.draw(st.sampled_from(pool.tolist())))
    for o in range(n - WIDTH + 1):
        want = sum(1 << t for t in range(WIDTH) if a[o + t] == d)
        assert int(_eq(a, o, d)) == want, (o, a[o:o + WIDTH], d)


@njit(cache=False)
def _even(a, o, d):
    return even_eq32(a, o, d)


@given(st.data())
@settings(max_examples=examples(200), deadline=None)
def test_even_eq32_marks_the_equal_bytes_of_the_even_words(data):
    """Bit 8 g + b set exactly where byte b of ``a[o + 2 g]`` is ``d`` (g < 4): the odd
    words between never count, even when they hold ``d`` in every byte."""
    n = data.draw(st.integers(8, 24))
    pool = data.draw(st.lists(st.sampled_from([0, 1, 127, 128, 255]) | st.integers(0, 255),
                              min_size=1, max_size=3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    raw = rng.choice(np.array(pool, np.uint8), 8 * n)
    a = raw.view(np.int64).copy()
    d = int(data.draw(st.sampled_from(pool)))
    a[1::2] = np.int64(-1) if d == 255 else a[1::2]      # (EMPTY odd words: all 255)
    by = a.view(np.uint8)
    for o in range(n - 7):
        want = sum(1 << (8 * g + b) for g in range(4) for b in range(8)
                   if by[8 * (o + 2 * g) + b] == d)
        assert int(_even(a, o, d)) == want, (o, d)


def test_ctz_counts_trailing_zeros():
    """The lowest set bit's place, with any bits above it (the sign bit too)."""
    f = njit(cache=False)(lambda m: ctz(m))
    for t in range(64):
        for above in (0, (1 << 64) - 1, 0x5555 << 40):
            word = ((1 << t) | (above << (t + 1))) & ((1 << 64) - 1)
            m = np.array([word], np.uint64).view(np.int64)[0]
            assert f(m) == t, (t, hex(word))


def test_vector_reads_refuse_arrays_not_side_by_side():
    """A strided view (its items not next to each other) or another dtype is a typing
    error, never a read of the wrong bytes."""
    a, b = np.zeros(2 * WIDTH + 2, np.int64), np.zeros(2 * WIDTH + 2, np.uint8)
    for fn, arg in ((_low, (a[::2], 0)), (_eq, (b[::2], 0, np.uint8(0))),
                    (_eq, (a, 0, 0)), (_low, (b, 0))):
        with pytest.raises(errors.TypingError):
            fn(*arg)
