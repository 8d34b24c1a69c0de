"""numbaemb's per-key initializers written in plain TensorFlow ops.

Serving graphs must not call back into Python, so unknown ids get their initial
values from this twin of :mod:`jit_kernels.initializers`: the same bit mixing in
uint64, then the same float32 operations in the same order (``+ - *``, ``sqrt``
and bit casts, each rounded as IEEE 754 says), so the values are bit for bit
those of the kernels.

>>> import numpy as np, tensorflow as tf
>>> from jit_kernels.initializers import NORMAL
>>> v = init_values(tf.constant([1, -1], tf.int64), 3, (NORMAL, 0.0, 1.0, 7, np.zeros(3)), tf.float32)
>>> v.shape
TensorShape([2, 3])
"""
import numpy as np
import tensorflow as tf

from jit_kernels import initializers as k

_GOLDEN = 0x9E3779B97F4A7C15


def _u64(x):
    return tf.constant(np.uint64(x), tf.uint64)


def _f32(x):
    return tf.constant(np.float32(x), tf.float32)


def mix64(x):
    """MurmurHash3 fmix64 on a uint64 tensor (same as jit_kernels.hashing.mix64)."""
    s = _u64(33)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, s)) * _u64(0xFF51AFD7ED558CCD)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, s)) * _u64(0xC4CEB9FE1A85EC53)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, s))


def uniform01(keys, dim, seed):
    """(n, dim) float32 uniforms in (0, 1): the kernels' uniform01(key_stream(seed, key), col)."""
    h = mix64(tf.bitcast(keys, tf.uint64) + _u64(_GOLDEN))
    seed_mix = mix64(_u64(np.uint64(np.int64(seed))) * _u64(_GOLDEN))
    stream = mix64(tf.bitwise.bitwise_xor(h, seed_mix))
    cols = tf.range(dim, dtype=tf.int64)
    pair = tf.bitcast(tf.bitwise.right_shift(cols, 1) + 1, tf.uint64)
    bits = mix64(stream[:, None] + pair[None, :] * _u64(_GOLDEN))
    half = tf.bitcast(tf.bitwise.bitwise_and(cols, 1) * 32, tf.uint64)[None, :]
    bits = tf.bitwise.right_shift(tf.bitwise.right_shift(bits, half), _u64(9))
    top23 = tf.cast(tf.bitwise.bitwise_and(bits, _u64(0x7FFFFF)), tf.int32)
    return tf.cast(top23, tf.float32) * _f32(2.0 ** -23) + _f32(2.0 ** -24)


def poly8(x, c):
    """Estrin's scheme, operation for operation as ``initializers.poly8`` (``c`` from x**8 down)."""
    c8, c7, c6, c5, c4, c3, c2, c1, c0 = [_f32(v) for v in c]
    x2 = x * x
    x4 = x2 * x2
    lo = (c0 + c1 * x) + (c2 + c3 * x) * x2
    hi = (c4 + c5 * x) + (c6 + c7 * x) * x2
    return (lo + hi * x4) + c8 * (x4 * x4)


def log32(x):
    """``initializers.log32``: exponent and mantissa from the bits, then Cephes' polynomial."""
    i = tf.bitcast(x, tf.int32)
    e = tf.bitwise.right_shift(i, 23) - 126
    m = tf.bitcast(tf.bitwise.bitwise_or(tf.bitwise.bitwise_and(i, 0x7FFFFF), 0x3F000000),
                   tf.float32)
    small = m < _f32(k.SQRT_HALF)
    e = tf.where(small, e - 1, e)
    x = tf.where(small, m + m, m)
    e = tf.cast(e, tf.float32)
    f = x - _f32(1.0)
    z = f * f
    p = poly8(f, (k.L0, k.L1, k.L2, k.L3, k.L4, k.L5, k.L6, k.L7, k.L8))
    y = f * z * p + e * _f32(k.LN2_LO) - _f32(0.5) * z
    return f + y + e * _f32(k.LN2_HI)


def normal_ppf(p):
    """``initializers.normal_ppf`` on a float32 tensor: Giles' erfinv polynomials in ``w``."""
    one = _f32(1.0)
    t = tf.minimum(p, one - p)
    w = -log32(_f32(4.0) * t * (one - t))
    x = _f32(2.0) * p - one
    near = _f32(k.SQRT2) * poly8(w - _f32(2.5), (k.G0, k.G1, k.G2, k.G3, k.G4, k.G5, k.G6,
                                                  k.G7, k.G8)) * x
    far = _f32(k.SQRT2) * poly8(tf.sqrt(w) - _f32(3.0), (k.H0, k.H1, k.H2, k.H3, k.H4, k.H5,
                                                          k.H6, k.H7, k.H8)) * x
    return tf.where(w < _f32(5.0), near, far)


def init_values(keys, dim, params, dtype):
    """Initial rows ``(n, dim)`` of int64 ``keys`` (n,) for kernel params ``(kind, a, b, seed, const)``."""
    kind, a, b, seed, const = params
    n = tf.shape(keys)[0]
    if kind == k.ZEROS:
        return tf.zeros([n, dim], dtype)
    if kind == k.CONSTANT:
        row = np.asarray(const[:dim], np.float64)[None, :]
        if dtype in (tf.float16, tf.bfloat16):   # as the kernels: float32 first, then rounded
            row = row.astype(np.float32)
        return tf.tile(tf.constant(row.astype(dtype.as_numpy_dtype)), [n, 1])
    u = uniform01(keys, dim, seed)
    a32, b32 = _f32(a), _f32(b)
    if kind == k.UNIFORM:
        out = a32 + _f32(np.float32(b) - np.float32(a)) * u
    else:
        if kind == k.TRUNCATED_NORMAL:
            z = normal_ppf(_f32(k.PHI_M2) + _f32(k.PHI_SPAN) * u)
            z = tf.clip_by_value(z, -_f32(k.CUT), _f32(k.CUT))
        else:
            z = normal_ppf(u)
        out = a32 + b32 * z
    return tf.cast(out, dtype)
