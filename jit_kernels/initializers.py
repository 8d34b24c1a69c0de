"""Initial values as a pure function of (seed, key, column).

A row's initial values never depend on batch order, shard count or device:
each element is drawn from a counter-based generator keyed by
``(seed, key, column)``:

* ``stream = key_stream(seed, key)`` (64 bits, once per row);
* columns ``2j`` and ``2j + 1`` share one 64-bit mix, ``pair_bits(stream, j) =
  mix64(stream + (j + 1) * GOLDEN)``: its low 32 bits are column ``2j``'s, its
  high 32 bits column ``2j + 1``'s;
* the top 23 of a column's bits ``k`` give the float32 uniform ``u = (k + 0.5) /
  2**23`` (exact; never 0 or 1);
* a normal variate is ``normal_ppf(u)``, the inverse normal CDF by Giles'
  single-precision polynomials for ``erfinv`` with :func:`log32`, a logarithm
  made of float32 ``+ - *`` and bit casts (relative error below 1e-6, |z| <= 5.3);
  the truncated normal maps ``u`` onto [Phi(-2), Phi(2)] first;
* the value is ``a + (b - a) * u`` (uniform) or ``a + b * z`` (normal), with ``a``
  and ``b`` rounded to float32.

Initial values are float32 numbers (a float64 table stores them exactly).
Everything after the integer mix is float32 arithmetic with IEEE rounding and
no library calls except ``sqrt``; every product goes through :func:`mul`, which
CUDA may not fuse into an FMA.  So the CPU and CUDA kernels, the TensorFlow twin
used by serving graphs (:mod:`tf_bridge.tf_init`) and a NumPy float32 twin (in
the tests) agree bit for bit.

Speed (``init_row`` runs for every new id in training): no branches and no
calls in the loops, so the CPU compiler vectorises 8 columns at a time (AVX2);
one 64-bit mix serves two columns, polynomials are evaluated by Estrin's scheme
(short dependency chains) and a row skips the far-tail polynomial unless one
of its uniforms needs it.  3.6 ns a normal value (1.3 ns a uniform one) on one
core of the 2-core development VM, against 6.5 ns for the float64 generator
of sessions 1-5 (Acklam's rational approximation, a scalar ``log`` in the
tails).  A kernel built for one :class:`Kind` (what tables pass) inlines that
kind's fill alone: rows of 64 float32 take 3.1-3.4 ns a normal value, 0.9 a
uniform one, 0.24 a zero (3.5-3.7, 1.5 and 1.3 for the all-kinds build; rows
of 8: 11, 5.9 and 0.56 against 16, 11 and 10, the per-row call and the short
loops' scalar remainders).

Kinds (``kind`` argument):

=====  =================  ==============================  ==================
kind   name               ``a``                           ``b``
=====  =================  ==============================  ==================
0      zeros              unused                          unused
1      constant           unused (``const[col]`` is used)  unused
2      uniform [a, b)     minval                          maxval
3      normal             mean                            stddev
4      truncated normal   mean                            stddev (cut at 2 sd)
=====  =================  ==============================  ==================

>>> import numpy as np
>>> row = np.empty(4, np.float32)
>>> init_row(row, 12345, 3, 0.0, 1.0, 7, np.zeros(4))
>>> row2 = np.empty(4, np.float32); init_row(row2, 12345, 3, 0.0, 1.0, 7, np.zeros(4))
>>> bool((row == row2).all())
True
"""
import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload, typeof_impl

from ._inner import inner
from .bitcast import bits_f32, f32_bits
from .halfs import sixteen, store

from .hashing import GOLDEN, hash_key, mix64

ZEROS, CONSTANT, UNIFORM, NORMAL, TRUNCATED_NORMAL = 0, 1, 2, 3, 4

_f = np.float32
_S9 = np.uint64(9)
_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_TWO_M23 = _f(2.0 ** -23)
_TWO_M24 = _f(2.0 ** -24)
_HALF, _ONE32, _TWO32 = _f(0.5), _f(1.0), _f(2.0)
# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision:
# erfinv(x) = x * G(w - 2.5) for w = -log(1 - x*x) < 5, else x * H(sqrt(w) - 3).
G0, G1, G2, G3, G4, G5, G6, G7, G8 = (_f(2.81022636e-08), _f(3.43273939e-07),
                                      _f(-3.5233877e-06), _f(-4.39150654e-06),
                                      _f(0.00021858087), _f(-0.00125372503),
                                      _f(-0.00417768164), _f(0.246640727), _f(1.50140941))
H0, H1, H2, H3, H4, H5, H6, H7, H8 = (_f(-0.000200214257), _f(0.000100950558),
                                      _f(0.00134934322), _f(-0.00367342844),
                                      _f(0.00573950773), _f(-0.0076224613),
                                      _f(0.00943887047), _f(1.00167406), _f(2.83297682))
SQRT2, _FOUR, _F2_5, _THREE, _FIVE = (_f(1.4142135623730951), _f(4.0), _f(2.5), _f(3.0),
                                       _f(5.0))
# log(1 + f) = f - f**2 / 2 + f**3 * L(f) on [sqrt(1/2) - 1, sqrt(2) - 1] (Cephes' logf).
L0, L1, L2, L3, L4, L5, L6, L7, L8 = (_f(7.0376836292e-2), _f(-1.1514610310e-1),
                                      _f(1.1676998740e-1), _f(-1.2420140846e-1),
                                      _f(1.4249322787e-1), _f(-1.6668057665e-1),
                                      _f(2.0000714765e-1), _f(-2.4999993993e-1),
                                      _f(3.3333331174e-1))
LN2_HI, LN2_LO = _f(0.693359375), _f(-2.12194440e-4)     # ln 2 = LN2_HI + LN2_LO
SQRT_HALF = _f(0.70710678118654752)
_I1, _I23, _I126 = np.int32(1), np.int32(23), np.int32(126)
_MANT, _HALF_BITS = np.int32(0x7FFFFF), np.int32(0x3F000000)     # mantissa; bits of 0.5
# Phi(-2) and Phi(2): the uniform range that maps to a normal cut at 2 sd.
PHI_M2 = _f(0.022750131948179195)
PHI_SPAN = _f(0.9772498680518208 - 0.022750131948179195)
CUT = _f(2.0)
_INF = _f(np.inf)
# normal_ppf(p) needs ppf_far only where min(p, 1 - p) < 0.001689 (w >= 5); this bound
# is 6% wider in 4t(1 - t), far beyond float32 rounding.
P_FAR = _f(0.0018)

_opts = dict(nogil=True, cache=True, error_model="numpy")
_inline = dict(_opts, inline="always")


@inner
def key_stream(seed, key):
    """Per-(seed, key) stream state from which columns are drawn."""
    return mix64(hash_key(key) ^ mix64(np.uint64(np.int64(seed)) * GOLDEN))


@inner
def pair_bits(stream, j):
    """The 64 random bits of columns ``2j`` (low half) and ``2j + 1`` (high half)."""
    return mix64(stream + np.uint64(j + 1) * GOLDEN)


@inner
def col_bits(stream, col):
    """Column ``col``'s 32 random bits (as a uint64 below 2**32)."""
    return (pair_bits(stream, col >> 1) >> (np.uint64(col & 1) * _S32)) & _LOW32


@inner
def bits_to_uniform(bits):
    """float32 ``(k + 0.5) / 2**23`` from the top 23 of 32 bits: exact, in (0, 1)."""
    return mul(_f(np.int32(bits >> _S9)), _TWO_M23) + _TWO_M24


@inner
def uniform01(stream, col):
    """Uniform float32 in (0, 1) for one column of a key's stream."""
    return bits_to_uniform(col_bits(stream, col))


@intrinsic
def mul(typingctx, x, y):
    """``x * y`` for float32s, rounded once and never fused with an add.

    On the CPU a plain multiply (Numba does not contract); on CUDA ``mul.rn.f32``,
    since NVVM would otherwise fuse a multiply and a following add into an FMA and
    change the last bit.  Every float32 product of this module goes through it.
    """
    if x != types.float32 or y != types.float32:
        return None

    def codegen(context, builder, sig, args):
        if "CUDA" in type(context).__name__:
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.nvvm.mul.rn.f")
            return builder.call(fn, args)
        return builder.fmul(*args)
    return types.float32(types.float32, types.float32), codegen


@inner(**_inline)
def poly8(x, c8, c7, c6, c5, c4, c3, c2, c1, c0):
    """``c8 x**8 + c7 x**7 + ... + c0`` by Estrin's scheme: four independent pairs,
    then two, then one, so the chain of dependent operations is 4 deep, not 9."""
    x2 = mul(x, x)
    x4 = mul(x2, x2)
    lo = (c0 + mul(c1, x)) + mul(c2 + mul(c3, x), x2)
    hi = (c4 + mul(c5, x)) + mul(c6 + mul(c7, x), x2)
    return (lo + mul(hi, x4)) + mul(c8, mul(x4, x4))


@inner(**_inline)
def log32(x):
    """Natural logarithm of a positive, normal float32 ``x``, as float32.

    ``x = m * 2**e`` with ``m`` in [sqrt(1/2), sqrt(2)) (from the bits), then Cephes'
    polynomial for ``log(1 + f)``, ``f = m - 1``: within 1 ulp.  Float32 ``+ - *``
    only and no branches, so it vectorises and gives the same bits wherever
    float32 arithmetic rounds as IEEE 754 says (its TensorFlow twin included).
    """
    i = f32_bits(x)
    e = np.int32(np.int32(i >> _I23) - _I126)             # x = m * 2**e, m in [1/2, 1)
    m = bits_f32(np.int32(np.int32(i & _MANT) | _HALF_BITS))
    small = m < SQRT_HALF                                 # into [sqrt(1/2), sqrt(2))
    e = np.int32(e - _I1) if small else e
    x = m + m if small else m
    e = _f(e)
    f = x - _ONE32
    z = mul(f, f)
    p = poly8(f, L0, L1, L2, L3, L4, L5, L6, L7, L8)
    y = mul(mul(f, z), p) + mul(e, LN2_LO) - mul(_HALF, z)
    return f + y + mul(e, LN2_HI)


@inner(**_inline)
def ppf_w(p):
    """``w = -log(4 t (1 - t))``, ``t = min(p, 1 - p)`` (exact): Giles' variable."""
    t = min(p, _ONE32 - p)
    return -log32(mul(mul(_FOUR, t), _ONE32 - t))


@inner(**_inline)
def ppf_near(p, w):
    """``normal_ppf(p)`` for ``w = ppf_w(p) < 5``: a polynomial in ``w - 2.5``."""
    v = w - _F2_5
    g = poly8(v, G0, G1, G2, G3, G4, G5, G6, G7, G8)
    return mul(mul(SQRT2, g), mul(_TWO32, p) - _ONE32)


@inner(**_inline)
def ppf_far(p, w):
    """``normal_ppf(p)`` for ``w >= 5`` (|z| > 2.93): a polynomial in ``sqrt(w) - 3``."""
    v = math.sqrt(w) - _THREE
    h = poly8(v, H0, H1, H2, H3, H4, H5, H6, H7, H8)
    return mul(mul(SQRT2, h), mul(_TWO32, p) - _ONE32)


@inner(**_inline)
def normal_ppf(p):
    """Inverse standard normal CDF of a float32 ``p`` in (0, 1), as float32.

    ``sqrt(2) * erfinv(2p - 1)`` by Giles' single-precision polynomials in
    ``w = ppf_w(p)``: :func:`ppf_near` for ``w < 5`` (99.66% of draws), else
    :func:`ppf_far`.  No division; exactly odd about 1/2; relative error below
    1e-6 on (0, 1) (float32 rounding included).
    """
    w = ppf_w(p)
    return ppf_near(p, w) if w < _FIVE else ppf_far(p, w)


@inner(**_inline)
def normal_range(kind):
    """``(lo, span, lim)``: a draw is ``clip(normal_ppf(lo + span * u), -lim, lim)``.

    ``(0, 1, inf)`` for the normal (``0 + 1 * u`` is exactly ``u``); for the normal
    cut at 2 sd ``u`` is mapped onto [Phi(-2), Phi(2)] and the result clamped to
    [-2, 2] (float32 rounding at the ends).
    """
    if kind == TRUNCATED_NORMAL:
        return PHI_M2, PHI_SPAN, CUT
    return _f(0.0), _ONE32, _INF


@inner(**_opts)
def init_value(stream, col, kind, a, b, const):
    """Initial value of one column (float64 holding a float32 value, or ``const[col]``)."""
    if kind == ZEROS:
        return 0.0
    if kind == CONSTANT:
        return const[col]
    u = uniform01(stream, col)
    a32, b32 = _f(a), _f(b)
    if kind == UNIFORM:
        return np.float64(a32 + mul(b32 - a32, u))
    lo, span, lim = normal_range(kind)
    return np.float64(a32 + mul(b32, min(max(normal_ppf(lo + mul(span, u)), -lim), lim)))


class Kind(int):
    """An initializer kind (:data:`ZEROS` ... :data:`TRUNCATED_NORMAL`) that kernels
    compile for: an ``int`` in Python, ``Literal[int](kind)`` to Numba.

    A kernel called with ``Kind(ZEROS)`` builds only the zero fill of :func:`init_row`,
    not the normal draw's polynomials (a second of compile on a 2-core VM); one called
    with a plain ``int`` builds every kind and picks one per call.  Each kind a kernel
    meets is one more build of that kernel (the tables of a process seldom use more
    than two).

    >>> Kind(NORMAL) == 3, Kind(NORMAL) + 1
    (True, 4)
    """

    def __new__(cls, kind):
        if isinstance(kind, (bool, np.bool_)) or int(kind) not in range(5) or kind != int(kind):
            raise ValueError(f"kind must be an int from 0 to 4, got {kind!r}")
        self = super().__new__(cls, int(kind))
        self._numba_type_ = types.IntegerLiteral(int(kind))   # read by Numba's typeof
        return self

    def __reduce__(self):
        return Kind, (int(self),)


@typeof_impl.register(Kind)
def _typeof_kind(val, c):
    return val._numba_type_


def init_row(dst, key, kind, a, b, seed, const):
    """Fill ``dst`` (shape ``(dim,)``) with the initial values of ``key``.

    Equal, element for element, to ``init_value(key_stream(seed, key), c, ...)``.
    The uniforms go through ``dst`` first (exact in float32 and float64), one
    64-bit mix for two columns; then each is transformed in place.  A normal row
    with no uniform in the far tails (80% of rows of 64) skips :func:`ppf_far`.
    16-bit float rows (:mod:`jit_kernels.halfs`) get the float32 values rounded
    once.  Kernels compile only the variant their row dtype needs, and for a
    :class:`Kind` only that kind's (an overload).
    """
    return (_init_row_16 if sixteen(dst) else _init_row_wide)(dst, key, kind, a, b, seed, const)


@overload(init_row, prefer_literal=True)
def _init_row_overload(dst, key, kind, a, b, seed, const):
    # calls of the (cached) dispatchers: each variant compiles once, only where needed
    if isinstance(dst, types.Array) and dst.dtype in (types.uint16, types.int16):
        return lambda dst, key, kind, a, b, seed, const: _init_row_16(dst, key, kind, a, b,
                                                                      seed, const)
    fixed = kind.literal_value if isinstance(kind, types.IntegerLiteral) else None
    if fixed == ZEROS:
        return lambda dst, key, kind, a, b, seed, const: _fill_zeros(dst)
    if fixed == CONSTANT:
        return lambda dst, key, kind, a, b, seed, const: _fill_const(dst, const)
    if fixed == UNIFORM:
        return lambda dst, key, kind, a, b, seed, const: _init_uniform(dst, key, a, b, seed)
    if fixed in (NORMAL, TRUNCATED_NORMAL):     # int(kind): one build for both
        return lambda dst, key, kind, a, b, seed, const: _init_normal(dst, key, int(kind), a,
                                                                      b, seed)
    return lambda dst, key, kind, a, b, seed, const: _init_row_wide(dst, key, kind, a, b,
                                                                    seed, const)


@inner(**_opts)
def _init_row_16(dst, key, kind, a, b, seed, const):
    """:func:`init_row` for 16-bit float storage: each column's float32 value, rounded."""
    stream = key_stream(seed, key) if kind > CONSTANT else np.uint64(0)
    for c in range(dst.shape[0]):
        store(dst, c, np.float32(init_value(stream, c, kind, a, b, const)))


@inner(**_opts)
def _init_row_wide(dst, key, kind, a, b, seed, const):
    """:func:`init_row` for float32 / float64 / integer rows, any kind."""
    if kind == ZEROS:
        _fill_zeros(dst)
    elif kind == CONSTANT:
        _fill_const(dst, const)
    elif kind == UNIFORM:
        _init_uniform(dst, key, a, b, seed)
    else:
        _init_normal(dst, key, kind, a, b, seed)


@inner(**_opts)
def _fill_zeros(dst):
    for c in range(dst.shape[0]):
        dst[c] = 0


@inner(**_opts)
def _fill_const(dst, const):
    for c in range(dst.shape[0]):
        dst[c] = const[c]


@inner(**_inline)
def _uniforms(dst, key, seed):
    """dst[c] = the key's uniform of column c (float32 values in (0, 1))."""
    n = dst.shape[0]
    stream = key_stream(seed, key)
    for j in range(n >> 1):
        h = pair_bits(stream, j)
        dst[2 * j] = bits_to_uniform(h & _LOW32)
        dst[2 * j + 1] = bits_to_uniform(h >> _S32)
    if n & 1:                 # (uniform01(stream, n - 1), without its two compiles)
        dst[n - 1] = bits_to_uniform(pair_bits(stream, n >> 1) & _LOW32)


@inner(**_opts)
def _init_uniform(dst, key, a, b, seed):
    _uniforms(dst, key, seed)
    a32 = _f(a)
    d = _f(b) - a32
    for c in range(dst.shape[0]):
        dst[c] = a32 + mul(d, _f(dst[c]))


@inner(**_opts)
def _init_normal(dst, key, kind, a, b, seed):
    """The normal (``kind`` NORMAL) or the normal cut at 2 sd (TRUNCATED_NORMAL)."""
    _uniforms(dst, key, seed)
    n = dst.shape[0]
    a32, b32 = _f(a), _f(b)
    lo, span, lim = normal_range(kind)
    far = False
    if kind == NORMAL:                   # (the truncated normal's p is never that far)
        for c in range(n):
            far |= (_f(dst[c]) < P_FAR) | (_f(dst[c]) > _ONE32 - P_FAR)
    if far:
        for c in range(n):
            z = normal_ppf(lo + mul(span, _f(dst[c])))
            dst[c] = a32 + mul(b32, min(max(z, -lim), lim))
    else:
        for c in range(n):
            p = lo + mul(span, _f(dst[c]))
            dst[c] = a32 + mul(b32, min(max(ppf_near(p, ppf_w(p)), -lim), lim))
