"""16-bit float conversions (``jit_kernels.halfs``) against NumPy's float16 and
``ml_dtypes.bfloat16`` casts: every 16-bit pattern widened, and millions of float32
values (random bits, the rounding boundaries, subnormals, specials) narrowed."""
import numpy as np
import pytest

from jit_kernels import halfs as H


def same(a, b):
    """Equal float arrays, NaN where both are NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def float32_cases():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2 ** 32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    halfway = (np.arange(65536, dtype=np.uint32) << 13) | 0x1000       # f16 ties (normals)
    bf_ties = (np.arange(65536, dtype=np.uint32) << 16) | 0x8000        # bf16 ties
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.996, 65520, -65520,
                        2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -14,
                        2.0 ** -14 * (1 - 2.0 ** -11), 3.4e38, 1e-45], np.float32)
    return np.concatenate([random_bits.view(np.float32), halfway.view(np.float32),
                           (halfway - 1).view(np.float32), bf_ties.view(np.float32),
                           special, rng.standard_normal(200_000).astype(np.float32) * 1e-6])


def test_float16_every_pattern_widens_as_numpy():
    bits = np.arange(65536, dtype=np.uint16)
    out = np.empty(65536, np.float32)
    H.widen(bits, out)
    assert same(out, bits.view(np.float16).astype(np.float32))


def test_float16_narrowing_rounds_as_numpy():
    x = float32_cases()
    out = np.empty(x.shape[0], np.uint16)
    H.narrow(x, out)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert same(out.view(np.float16), want)
    nan = np.isnan(x)
    assert np.isnan(out[nan].view(np.float16)).all() and (out[~nan] == want[~nan].view(np.uint16)).all()


def test_bfloat16_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = np.arange(65536, dtype=np.uint16).view(np.int16)
    out = np.empty(65536, np.float32)
    H.widen(bits, out)
    assert same(out, bits.view(ml_dtypes.bfloat16).astype(np.float32))
    x = float32_cases()
    got = np.empty(x.shape[0], np.int16)
    H.narrow(x, got)
    want = x.astype(ml_dtypes.bfloat16).view(np.int16)
    nan = np.isnan(x)
    assert (got[~nan] == want[~nan]).all()
    assert np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()


def test_python_fallbacks_agree_with_the_kernels():
    """The plain-Python ``load`` / ``store`` (run by the CUDA simulator) give the
    compiled bits."""
    for store in (np.uint16, np.int16):
        row = np.zeros(4, store)
        vals = np.array([1.5, -0.0, 65519.99, 3e-8], np.float32)
        for c, v in enumerate(vals):
            H.store(row, c, v)
        want = np.empty(4, store)
        H.narrow(vals, want)
        assert (row == want).all()
        assert [float(H.load(row, c)) for c in range(4)] == [float(H.load(want, c))
                                                            for c in range(4)]
    assert H.compute_cast(np.zeros(1, np.uint16), 0.1) == np.float32(0.1)
    assert H.sixteen(np.zeros(1, np.int16)) and not H.sixteen(np.zeros(1, np.float32))
