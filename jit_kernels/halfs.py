"""16-bit float values (float16, bfloat16) stored as integer bits.

Numba has no CPU half type, so a 16-bit table stores each value's bits in an
integer column: ``uint16`` for IEEE float16, ``int16`` for bfloat16 (the storage
dtype tells the two apart at compile time).  Kernels read and write value
columns through :func:`load` / :func:`store` and compute in
:func:`compute_cast` 's type: for these columns float32 (the value widened
exactly, the result rounded once to nearest-even on store), for every other
column its own dtype with plain reads and writes, so float32 / float64 / integer
tables compile to the same code as without these helpers.

Conversions round to nearest, ties to even, as NumPy's ``astype(np.float16)``
and ``ml_dtypes.bfloat16`` (and TensorFlow's casts) do; NaN stays NaN (quiet),
infinities and signed zeros are kept, float16 subnormals are exact.

>>> import numpy as np
>>> bits = np.array([f32_to_f16(np.float32(x)) for x in (1.0, -2.5, 65504.0, 1e6)])
>>> [float(f16_to_f32(b)) for b in bits]
[1.0, -2.5, 65504.0, inf]
"""
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ._inner import inner
from .bitcast import bits_f32, f32_bits

__all__ = ["F16_STORE", "BF16_STORE", "f32_to_f16", "f16_to_f32", "f32_to_bf16", "bf16_to_f32",
           "load", "store", "compute_cast", "sixteen", "widen", "narrow"]

F16_STORE = np.dtype(np.uint16)    # storage of float16 values (their bits)
BF16_STORE = np.dtype(np.int16)    # storage of bfloat16 values (their bits)

_inline = dict(nogil=True, cache=True)    # small: LLVM inlines them
_M32 = 0xFFFFFFFF


@inner(**_inline)
def _u32(x):
    """The bits of float32 ``x`` as a non-negative int64."""
    return np.int64(f32_bits(x)) & _M32


@inner(**_inline)
def f32_to_f16(x):
    """IEEE float16 bits (int64 in [0, 65535]) of float32 ``x``, rounded to nearest even."""
    f = _u32(x)
    sign = (f >> 16) & 0x8000
    f &= 0x7FFFFFFF
    if f >= 0x7F800000:                               # inf, NaN (kept quiet)
        return sign | (0x7C00 if f == 0x7F800000 else 0x7E00 | ((f >> 13) & 0x3FF))
    if f >= 0x477FF000:                               # rounds to 65520 or more: inf
        return sign | 0x7C00
    if f >= 0x38800000:                               # a float16 normal
        h = (f - 0x38000000) >> 13
        rest = f & 0x1FFF
        if rest > 0x1000 or (rest == 0x1000 and (h & 1)):
            h += 1                                    # may carry into the exponent: right
        return sign | h
    if f < 0x33000000:                                # below 2**-25: zero
        return sign
    shift = 126 - (f >> 23)                           # 14 .. 24: a float16 subnormal
    m = (f & 0x7FFFFF) | 0x800000
    h = m >> shift
    rest = m & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    if rest > half or (rest == half and (h & 1)):
        h += 1
    return sign | h


@inner(**_inline)
def f16_to_f32(h):
    """The float32 value of IEEE float16 bits ``h`` (any integer; low 16 bits used)."""
    h = np.int64(h) & 0xFFFF
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        return bits_f32(sign | 0x7F800000 | (m << 13))
    if e != 0:
        return bits_f32(sign | ((e + 112) << 23) | (m << 13))
    if m == 0:
        return bits_f32(sign)
    e = np.int64(113)                                 # a subnormal: normalise it
    while (m & 0x400) == 0:
        m <<= 1
        e -= 1
    return bits_f32(sign | (e << 23) | ((m & 0x3FF) << 13))


@inner(**_inline)
def f32_to_bf16(x):
    """bfloat16 bits (int64 in [0, 65535]) of float32 ``x``, rounded to nearest even."""
    f = _u32(x)
    if (f & 0x7FFFFFFF) > 0x7F800000:                 # NaN: keep it quiet
        return ((f >> 16) | 0x40) & 0xFFFF
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16) & 0xFFFF


@inner(**_inline)
def bf16_to_f32(h):
    """The float32 value of bfloat16 bits ``h`` (any integer; low 16 bits used)."""
    return bits_f32((np.int64(h) & 0xFFFF) << 16)


# ---- column access: compile-time dispatch on the column's dtype --------------------------
def load(row, c):
    """``row[c]`` as a number to compute with (float32 for 16-bit float columns)."""
    x = row[c]
    dt = np.dtype(row.dtype)
    if dt == F16_STORE:
        return f16_to_f32(x)
    if dt == BF16_STORE:
        return bf16_to_f32(x)
    return x


def store(row, c, v):
    """``row[c] = v`` (rounded to the 16-bit format for 16-bit float columns)."""
    dt = np.dtype(row.dtype)
    if dt == F16_STORE:
        row[c] = f32_to_f16(np.float32(v))
    elif dt == BF16_STORE:
        row[c] = np.uint16(f32_to_bf16(np.float32(v))).view(np.int16)
    else:
        row[c] = v


def compute_cast(row, x):
    """``x`` in the type kernels compute ``row``'s values in: float32 for 16-bit float
    columns, else ``row``'s dtype."""
    dt = np.dtype(row.dtype)
    return np.float32(x) if dt in (F16_STORE, BF16_STORE) else dt.type(x)


def sixteen(row):
    """Whether ``row`` is a 16-bit float column (a compile-time constant in kernels)."""
    return np.dtype(row.dtype) in (F16_STORE, BF16_STORE)


def _sixteen(row):
    return isinstance(row, types.Array) and row.dtype in (types.uint16, types.int16)


@overload(sixteen, inline="always")
def _sixteen_ol(row):
    flag = _sixteen(row)
    return lambda row: flag


@overload(load, inline="always")
def _load(row, c):
    if isinstance(row, types.Array) and row.dtype == types.uint16:
        return lambda row, c: f16_to_f32(row[c])
    if isinstance(row, types.Array) and row.dtype == types.int16:
        return lambda row, c: bf16_to_f32(row[c])
    return lambda row, c: row[c]


@overload(store, inline="always")
def _store(row, c, v):
    if isinstance(row, types.Array) and row.dtype == types.uint16:
        def f16(row, c, v):
            row[c] = f32_to_f16(np.float32(v))
        return f16
    if isinstance(row, types.Array) and row.dtype == types.int16:
        def bf16(row, c, v):
            row[c] = f32_to_bf16(np.float32(v))
        return bf16

    def plain(row, c, v):
        row[c] = v
    return plain


@overload(compute_cast, inline="always")
def _compute_cast(row, x):
    if _sixteen(row):
        return lambda row, x: np.float32(x)
    return lambda row, x: row.dtype.type(x)


# ---- whole arrays (host side) ---------------------------------------------------------------
@njit(nogil=True, cache=True, parallel=True)
def widen(bits, out):
    """``out[i] = value of bits[i]`` (float32 out; ``bits`` uint16 float16 or int16
    bfloat16 storage, 1-D)."""
    for i in prange(bits.shape[0]):
        out[i] = load(bits, i)


@njit(nogil=True, cache=True, parallel=True)
def narrow(x, out):
    """``out[i] = x[i]`` rounded to ``out``'s 16-bit format (1-D)."""
    for i in prange(x.shape[0]):
        store(out, i, np.float32(x[i]))
