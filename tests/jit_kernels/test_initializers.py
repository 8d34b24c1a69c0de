"""Counter-based initial values (``jit_kernels.initializers``).

Each element is a pure function of (seed, key, column): checked here against
batch composition, order and row width; the distributions are checked on a
few hundred thousand draws (fixed seeds, so the checks are deterministic);
``normal_ppf`` is checked against ``statistics.NormalDist().inv_cdf``.
"""
import math
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import numba
from numba import njit

from jit_kernels import cpu_table
from jit_kernels.initializers import (CONSTANT, NORMAL, TRUNCATED_NORMAL, UNIFORM, ZEROS,
                                      Kind, init_row, init_value, key_stream, log32, normal_ppf,
                                      uniform01)
from jit_kernels.slots import empty_slots

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
key_st = st.one_of(st.sampled_from([INT64_MIN, INT64_MAX, -1, 0, 1]),
                   st.integers(INT64_MIN, INT64_MAX))
seed_st = st.one_of(st.sampled_from([0, -1, 1, INT64_MIN, INT64_MAX]),
                    st.integers(INT64_MIN, INT64_MAX))
RANDOM_KINDS = [(UNIFORM, -0.3, 0.7), (NORMAL, 0.25, 2.0), (TRUNCATED_NORMAL, -1.0, 0.5)]
ND = statistics.NormalDist()


@njit
def values_by_column(key, seed, kind, a, b, dim):
    """init_value column by column (compiled: the stream is a uint64)."""
    stream = key_stream(seed, key)
    out = np.empty(dim)
    for c in range(dim):
        out[c] = init_value(stream, c, kind, a, b, np.zeros(dim))
    return out


@njit
def uniform_draws(seed, n_keys, n_cols):
    out = np.empty(n_keys * n_cols)
    for x in range(n_keys):
        stream = key_stream(seed, x)
        for c in range(n_cols):
            out[x * n_cols + c] = uniform01(stream, c)
    return out


def draw(keys, kind, a, b, seed, dim, dtype=np.float64, const=None):
    """Initial rows of ``keys`` through the CPU lookup driver on an empty table."""
    keys = np.asarray(keys, np.int64)
    const = np.zeros(dim) if const is None else const
    out = np.empty((keys.shape[0], dim), dtype)
    exists = np.empty(keys.shape[0], np.bool_)
    cpu_table.lookup(empty_slots(16), 15, keys, np.empty((0, dim), dtype), out, exists,
                     kind, a, b, seed, const)
    assert not exists.any()
    return out


# ---- determinism -------------------------------------------------------------------

@given(key_st, seed_st, st.sampled_from(RANDOM_KINDS))
def test_init_row_is_pure_and_width_independent(key, seed, kab):
    kind, a, b = kab
    r8 = np.empty(8, np.float64)
    r3 = np.empty(3, np.float64)
    init_row(r8, key, kind, a, b, seed, np.zeros(8))
    init_row(r3, key, kind, a, b, seed, np.zeros(3))
    again = np.empty(8, np.float64)
    init_row(again, key, kind, a, b, seed, np.zeros(8))
    np.testing.assert_array_equal(r8, again)
    np.testing.assert_array_equal(r8[:3], r3)      # column c does not depend on dim
    np.testing.assert_array_equal(values_by_column(key, seed, kind, a, b, 8), r8)
    assert len(set(r8.tolist())) == 8              # columns differ


@given(st.lists(key_st, min_size=1, max_size=30), st.randoms(use_true_random=False),
       seed_st, st.sampled_from(RANDOM_KINDS))
def test_values_independent_of_batch_composition_and_order(keys, rnd, seed, kab):
    kind, a, b = kab
    base = draw(keys, kind, a, b, seed, 5)
    perm = list(range(len(keys)))
    rnd.shuffle(perm)
    extra = [rnd.randint(INT64_MIN, INT64_MAX) for _ in range(7)]
    shuffled = draw([keys[i] for i in perm] + extra, kind, a, b, seed, 5)
    np.testing.assert_array_equal(shuffled[:len(keys)], base[perm])
    np.testing.assert_array_equal(draw(keys[:1], kind, a, b, seed, 5)[0], base[0])
    for i, x in enumerate(keys):                    # a row alone, outside any batch
        row = np.empty(5)
        init_row(row, x, kind, a, b, seed, np.zeros(5))
        np.testing.assert_array_equal(row, base[i])


def test_seed_and_key_change_the_values():
    keys = np.array([INT64_MIN, -1, 0, 1, INT64_MAX], np.int64)
    a = draw(keys, NORMAL, 0.0, 1.0, 1, 4)
    b = draw(keys, NORMAL, 0.0, 1.0, 2, 4)
    assert not np.isin(a, b).any()
    assert len(np.unique(a)) == a.size
    # initial values are float32 numbers: float32 and float64 tables hold the same
    np.testing.assert_array_equal(draw(keys, NORMAL, 0.0, 1.0, 1, 4, np.float32), a)


@njit
def fill_rows(out, keys, kind, a, b, seed, const):
    for i in range(keys.shape[0]):
        init_row(out[i], keys[i], kind, a, b, seed, const)


@pytest.mark.parametrize("kind, a, b", [(ZEROS, 9.0, 9.0), (CONSTANT, 9.0, 9.0)] + RANDOM_KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kind_builds_only_its_initializer(kind, a, b, dtype):
    """A kernel called with a Kind compiles that kind's fill alone (not the normal draw's
    polynomials, a second of compile) and gives the bits of the all-kinds build."""
    keys = np.array([INT64_MIN, -1, 0, 5, INT64_MAX, 2 ** 40 + 3], np.int64)
    const = np.linspace(-2.0, 3.0, 67)
    rows = {}
    for k in (kind, Kind(kind)):
        rows[type(k)] = np.full((keys.size, 67), np.nan, dtype)
        fill_rows(rows[type(k)], keys, k, a, b, 7, const)
    np.testing.assert_array_equal(rows[Kind], rows[int])
    if kind in (UNIFORM, NORMAL, TRUNCATED_NORMAL):
        want = np.stack([py_init_row(int(x), kind, a, b, 7, 67) for x in keys])
        np.testing.assert_array_equal(rows[Kind], want.astype(dtype))
    else:
        assert (rows[Kind] == (0 if kind == ZEROS else const.astype(dtype))).all()
    sigs = {getattr(s[2], "literal_value", "int"): s for s in fill_rows.signatures
            if s[0].dtype == numba.from_dtype(dtype)}
    assert sigs.keys() >= {kind, "int"} and sigs["int"][2] == numba.int64
    built = fill_rows.inspect_llvm(sigs[kind])
    assert ("_init_normal" in built) == (kind in (NORMAL, TRUNCATED_NORMAL))
    assert ("_init_uniform" in built) == (kind == UNIFORM)
    generic = fill_rows.inspect_llvm(sigs["int"])
    assert "_init_normal" in generic and "_init_uniform" in generic


def test_kind_is_an_int_checked_and_pickled():
    import pickle
    assert Kind(NORMAL) == NORMAL and isinstance(Kind(ZEROS), int)
    assert pickle.loads(pickle.dumps(Kind(UNIFORM))) == UNIFORM
    assert type(pickle.loads(pickle.dumps(Kind(UNIFORM)))) is Kind
    assert np.array([Kind(NORMAL), Kind(ZEROS)]).dtype == np.int64
    for bad in (5, -1, 2.5, True):
        with pytest.raises(ValueError, match="kind must be an int from 0 to 4"):
            Kind(bad)


def test_zeros_and_constant():
    const = np.array([1.5, -2.0, 3.25])
    z = draw([INT64_MIN, 5, INT64_MAX], ZEROS, 9.0, 9.0, 7, 3)
    assert (z == 0).all()
    c = draw([INT64_MIN, 5, INT64_MAX], CONSTANT, 9.0, 9.0, 7, 3, const=const)
    np.testing.assert_array_equal(c, np.tile(const, (3, 1)))


# ---- a NumPy float32 twin of the generator ---------------------------------------------
# Written from the module's description (MurmurHash3 finaliser, golden-ratio counters, one
# mix for two columns, Giles' erfinv polynomials by Estrin's scheme, Cephes' log) with
# Python ints and NumPy float32 scalars, which round each operation as IEEE 754 says.  The
# kernels must agree bit for bit: CPU, CUDA and any faster rewrite (e.g. the vectorised
# init_row) give the same rows, so a key's initial value never depends on where or how
# it was computed.

F = np.float32
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_G = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
      -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_H = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
      -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)
_L = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
      1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)


def _py_mix64(x):
    x &= _M64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    return x ^ (x >> 33)


def _py_uniform(seed, key, col):
    stream = _py_mix64(_py_mix64((key & _M64) + _GOLDEN) ^ _py_mix64((seed & _M64) * _GOLDEN))
    bits = (_py_mix64(stream + (col // 2 + 1) * _GOLDEN) >> (32 * (col % 2))) & 0xFFFFFFFF
    return F(bits >> 9) * F(2.0 ** -23) + F(2.0 ** -24)


def _py_poly8(x, coefs):
    c8, c7, c6, c5, c4, c3, c2, c1, c0 = (F(c) for c in coefs)
    x2 = x * x
    x4 = x2 * x2
    return (((c0 + c1 * x) + (c2 + c3 * x) * x2) + ((c4 + c5 * x) + (c6 + c7 * x) * x2) * x4
            + c8 * (x4 * x4))


def _py_log(x):
    i = int(np.array(x, F).view(np.int32))
    e = (i >> 23) - 126
    m = np.array((i & 0x7FFFFF) | 0x3F000000, np.int32).view(F)[()]
    if m < F(0.70710678118654752):
        e, m = e - 1, m + m
    e = F(e)
    f = m - F(1.0)
    z = f * f
    y = f * z * _py_poly8(f, _L) + e * F(-2.12194440e-4) - F(0.5) * z
    return f + y + e * F(0.693359375)


def _py_ppf(p):
    t = min(p, F(1.0) - p)
    w = -_py_log(F(4.0) * t * (F(1.0) - t))
    v = w - F(2.5) if w < F(5.0) else np.sqrt(w) - F(3.0)
    return F(1.4142135623730951) * _py_poly8(v, _G if w < F(5.0) else _H) * (F(2.0) * p - F(1.0))


def py_init_row_z(u):
    """The truncated normal's z for a uniform u (clamped to the cut)."""
    p = F(0.022750131948179195) + F(0.9772498680518208 - 0.022750131948179195) * u
    return min(max(_py_ppf(p), F(-2.0)), F(2.0))


def py_init_row(key, kind, a, b, seed, dim):
    a, b = F(a), F(b)
    out = []
    for c in range(dim):
        u = _py_uniform(seed, key, c)
        if kind == UNIFORM:
            out.append(a + (b - a) * u)
        elif kind == TRUNCATED_NORMAL:
            out.append(a + b * py_init_row_z(u))
        else:
            out.append(a + b * _py_ppf(u))
    return np.array(out, np.float64)


@given(key_st, seed_st, st.sampled_from(RANDOM_KINDS), st.sampled_from([1, 5, 63, 64, 65, 130]))
def test_init_row_matches_numpy_float32_twin_bit_for_bit(key, seed, kab, dim):
    kind, a, b = kab
    row = np.empty(dim)
    init_row(row, key, kind, a, b, seed, np.zeros(dim))
    np.testing.assert_array_equal(row, py_init_row(key, kind, a, b, seed, dim))
    np.testing.assert_array_equal(values_by_column(key, seed, kind, a, b, dim), row)


def test_twin_covers_both_polynomials():
    """Enough draws that the far-tail polynomial (|z| > 2.93, 0.34% of draws) and the
    rows that need it are exercised, in float32 and float64 tables."""
    keys = list(range(-300, 300))
    rows = draw(keys, NORMAL, 0.0, 1.0, 17, 70)
    want = np.stack([py_init_row(x, NORMAL, 0.0, 1.0, 17, 70) for x in keys])
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(draw(keys, NORMAL, 0.0, 1.0, 17, 70, np.float32), want)
    for dtype in (np.float64, np.float32):          # the normal kind's own build
        np.testing.assert_array_equal(draw(keys, Kind(NORMAL), 0.0, 1.0, 17, 70, dtype), want)
    assert (rows < -2.94).sum() > 40 and (rows > 2.94).sum() > 40
    assert np.abs(rows).max() > 4.0


# ---- the uniform source ----------------------------------------------------------------

def test_uniform01_open_interval_and_uniform():
    u = uniform_draws(3, 20000, 3)
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean() - 0.5) < 0.005
    assert abs(u.var() - 1 / 12) < 0.002
    hist = np.bincount((u * 10).astype(int), minlength=10)
    assert hist.min() > 5600 and hist.max() < 6400     # 6000 expected per decile


def test_uniform01_grid():
    """Every value is (k + 0.5) / 2**23 for an integer k below 2**23."""
    k = uniform_draws(5, 5000, 8) * 2.0 ** 23 - 0.5
    np.testing.assert_array_equal(k, np.round(k))
    assert k.min() >= 0 and k.max() < 2 ** 23


# ---- log32 and normal_ppf -----------------------------------------------------------------

@njit
def _each(fn, x):
    """``fn`` (a compiled scalar function) applied to every element of ``x``."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = fn(x[i])
    return out


def _logs(x):
    return _each(log32, x)


def _ppfs(p):
    return _each(normal_ppf, p)


def test_log32_within_one_ulp():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.exp(rng.uniform(-87, 0, 200_000)),
                        [2.0 ** -24, 1e-30, 0.5, 0.70710677, 0.70710683, 1.0]]).astype(F)
    got = _logs(x).astype(np.float64)
    ref = np.log(x.astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(F)).astype(np.float64)
    ulp[ref == 0] = np.spacing(F(0))
    assert (np.abs(got - ref) <= ulp).all()
    assert _logs(np.array([1.0], F))[0] == 0.0
    np.testing.assert_array_equal(got, [float(_py_log(v)) for v in x])


def _ppf_bisect(p):
    """Reference inverse CDF by bisection on math.erfc (independent of NormalDist).

    Works on the lower tail (``1 - p`` is exact for p >= 0.5) to avoid cancellation."""
    if p > 0.5:
        return -_ppf_bisect(1.0 - p)
    lo, hi = -40.0, 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# the generator's p: (k + 0.5) / 2**23; every k of both tails (w >= 4), a stride elsewhere
_K = np.concatenate([np.arange(0, 40_000), np.arange(40_000, 2 ** 23 - 40_000, 97),
                     np.arange(2 ** 23 - 40_000, 2 ** 23)])
GRID = ((_K + 0.5) * 2.0 ** -23).astype(F)


def test_normal_ppf_matches_inv_cdf_on_the_generator_grid():
    z = _ppfs(GRID).astype(np.float64)
    ref = np.array([ND.inv_cdf(float(p)) for p in GRID])
    err = np.abs(z - ref) / np.maximum(np.abs(ref), 1e-3)
    assert err.max() < 1e-6, (err.max(), GRID[err.argmax()])
    assert np.abs(z).max() < 5.3


@pytest.mark.parametrize("p", [2.0 ** -24, 1e-6, 0.001, 0.00169, 0.0018, 0.02425, 0.1, 0.3,
                               0.5, 0.7, 0.97575, 0.999, 1 - 2.0 ** -24])
def test_normal_ppf_matches_erf_bisection(p):
    p = F(p)
    ref = _ppf_bisect(float(p))
    assert abs(normal_ppf(p) - ref) <= 1e-6 * max(abs(ref), 1e-3)
    assert normal_ppf(p) == _py_ppf(p)


def test_normal_ppf_odd_and_monotone():
    z = _ppfs(GRID)
    np.testing.assert_array_equal(_ppfs(F(1.0) - GRID), -z)     # 1 - p is exact on the grid
    assert (np.diff(z) > 0).all()
    assert normal_ppf(F(0.5)) == 0.0


# ---- distributions ------------------------------------------------------------------

N_KEYS = 100_000
KEYS = np.arange(-N_KEYS // 2, N_KEYS // 2, dtype=np.int64) * 7919


def test_normal_distribution():
    mean, sd = 0.25, 2.0
    x = draw(KEYS, NORMAL, mean, sd, 99, 4).ravel()
    n = x.size
    assert abs(x.mean() - mean) < 5 * sd / math.sqrt(n)
    assert abs(x.std() / sd - 1) < 0.01
    z = np.sort((x - mean) / sd)
    for q in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99):  # empirical quantiles vs Phi^-1
        assert abs(z[int(q * n)] - ND.inv_cdf(q)) < 0.02
    skew = ((z - z.mean()) ** 3).mean()
    kurt = ((z - z.mean()) ** 4).mean()
    assert abs(skew) < 0.03 and abs(kurt - 3) < 0.06
    # columns are uncorrelated with each other
    cols = draw(KEYS[:50_000], NORMAL, 0.0, 1.0, 99, 2)
    assert abs(np.corrcoef(cols[:, 0], cols[:, 1])[0, 1]) < 0.02


def test_consecutive_keys_and_seeds_are_uncorrelated():
    ks = np.arange(50_000, dtype=np.int64)
    x = draw(ks, NORMAL, 0.0, 1.0, 5, 1)[:, 0]
    assert abs(np.corrcoef(x[:-1], x[1:])[0, 1]) < 0.02
    y = draw(ks, NORMAL, 0.0, 1.0, 6, 1)[:, 0]
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.02


def test_truncated_normal_distribution():
    mean, sd = -1.0, 0.5
    x = draw(KEYS, TRUNCATED_NORMAL, mean, sd, 42, 4).ravel()
    z = (x - mean) / sd
    assert np.abs(z).max() <= 2.0 + 1e-8               # cut at 2 sd
    assert np.abs(z).max() > 1.99                      # and reaches the cut
    assert abs(z.mean()) < 0.005
    assert abs(z.std() - 0.8796) < 0.004               # sd of N(0,1) truncated at +-2
    # density ratio at the centre vs near the cut follows the normal shape
    h_center = np.mean(np.abs(z) < 0.1)
    h_edge = np.mean(np.abs(z - 1.9) < 0.1)
    assert abs(h_edge / h_center - math.exp(-1.9 ** 2 / 2)) < 0.03


def test_truncated_normal_extremes_stay_inside_the_cut():
    # the uniform source's ends, 2**-24 and 1 - 2**-24, map onto the cut's ends
    for u, sign in ((F(2.0 ** -24), -1), (F(1 - 2.0 ** -24), 1)):
        p = F(0.022750131948179195) + F(0.9772498680518208 - 0.022750131948179195) * u
        z = float(normal_ppf(p))
        assert 1.99999 < sign * z < 2.00001
        assert sign * float(py_init_row_z(u)) <= 2.0


def test_uniform_distribution():
    lo, hi = -0.3, 0.7
    x = draw(KEYS, UNIFORM, lo, hi, 3, 4).ravel()
    assert x.min() >= lo and x.max() < hi
    assert x.min() < lo + 1e-4 and x.max() > hi - 1e-4
    assert abs(x.mean() - (lo + hi) / 2) < 0.003
    assert abs(x.std() - (hi - lo) / math.sqrt(12)) < 0.002
    hist = np.bincount(((x - lo) / (hi - lo) * 20).astype(int), minlength=20)
    assert hist.min() > 0.95 * x.size / 20 and hist.max() < 1.05 * x.size / 20


def test_degenerate_parameters():
    x = draw([1, 2, 3], NORMAL, 0.5, 0.0, 1, 3)
    assert (x == 0.5).all()
    u = draw([1, 2, 3], UNIFORM, 2.0, 2.0, 1, 3)
    assert (u == 2.0).all()
