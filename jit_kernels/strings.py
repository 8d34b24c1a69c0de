"""Kernels for string keys: fingerprints, byte comparison and byte gathering.

A batch of strings is one flat ``uint8`` buffer plus ``starts`` (int64, ``n + 1``):
string ``i`` is ``buf[starts[i]:starts[i + 1]]``.

``fingerprint64`` is FarmHash's ``Fingerprint64`` (``farmhashna::Hash64``), the
function behind TensorFlow's ``tf.strings.to_hash_bucket_fast``, so an id computed
here (``fingerprint64(s) mod (2**63 - 1)``) is the id TensorFlow computes with
``tf.strings.to_hash_bucket_fast(s, 2**63 - 1)``: a SavedModel serves string keys
with stock TF ops.

>>> import numpy as np
>>> buf, starts = pack([b"a", b"hello"])
>>> starts.tolist()
[0, 1, 6]
>>> ids = level0_ids(buf, starts)
>>> bool((ids >= 0).all())
True
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._inner import inner
from .segment import PARALLEL_MIN

__all__ = ["pack", "fingerprint64", "level0_ids", "deep_ids", "equal_to", "gather_bytes",
           "ID_MOD"]

K0 = np.uint64(0xc3a5c85c97cb3127)
K1 = np.uint64(0xb492b66fbe98f273)
K2 = np.uint64(0x9ae16a3b2f90404f)
ID_MOD = np.uint64((1 << 63) - 1)       # ids of level 0: fingerprint mod (2**63 - 1)
_U8 = np.uint64(8)


def pack(strings):
    """``(buf uint8, starts int64 (n + 1,))`` for a sequence / array of ``bytes``
    (``str`` is encoded as UTF-8).  C-level loops only (``map``, ``bytes.join``).
    TypeError names the types of items that are neither."""
    items = strings.tolist() if isinstance(strings, np.ndarray) else list(strings)
    try:
        joined = b"".join(items)                  # all bytes: the fast path
    except TypeError:
        items = _encoded(items)
        joined = b"".join(items)
    starts = np.zeros(len(items) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, items), np.int64, len(items)), out=starts[1:])
    return np.frombuffer(joined, np.uint8), starts


def _encoded(items):
    """``items`` with ``str`` encoded as UTF-8; TypeError if any is neither."""
    kinds = set(map(type, items))
    bad = sorted(k.__name__ for k in kinds if not issubclass(k, (bytes, str)))
    if bad:
        raise TypeError(f"strings must be bytes or str, got {', '.join(bad)}")
    try:
        if kinds == {str}:
            return list(map(str.encode, items))
        return [s.encode() if isinstance(s, str) else s for s in items]   # mixed: rare
    except UnicodeEncodeError as e:     # lone surrogates: str that is no UTF-8 text
        raise ValueError(f"strings must be bytes or str that UTF-8 can encode, got "
                         f"{e.object!r} ({e.reason} at {e.start}); pass bytes") from None


def _load_intrinsic(nbytes):
    @intrinsic
    def load(typingctx, b, p):
        if not (isinstance(b, types.Array) and b.dtype == types.uint8 and b.ndim == 1
                and b.layout == "C" and isinstance(p, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            at = builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()), [args[1]])
            word = ir.IntType(8 * nbytes)
            v = builder.load(builder.bitcast(at, word.as_pointer()), align=1)
            return v if nbytes == 8 else builder.zext(v, ir.IntType(64))
        return types.uint64(b, types.intp), codegen
    return load


# The 8 / 4 bytes at ``b[p]`` (a 1-D C-contiguous uint8 array) as a little-endian
# unsigned integer: one unaligned load (x86-64 and AArch64 are little-endian).  An
# intrinsic, not a loop over the bytes: FarmHash reads 16 words from a long string, and
# a byte loop inlined at each read was most of the strings' first-use compile.
_fetch64 = _load_intrinsic(8)
_fetch32 = _load_intrinsic(4)


@inner(inline="always")
def _rot(v, s):
    return (v >> np.uint64(s)) | (v << np.uint64(64 - s))


@inner(inline="always")
def _shift_mix(v):
    return v ^ (v >> np.uint64(47))


@inner(inline="always")
def _len16(u, v, mul):
    a = (u ^ v) * mul
    a ^= a >> np.uint64(47)
    b = (v ^ a) * mul
    b ^= b >> np.uint64(47)
    return b * mul


@inner
def _len0to16(b, s, n):
    ln = np.uint64(n)
    if n >= 8:
        mul = K2 + ln * np.uint64(2)
        a = _fetch64(b, s) + K2
        c0 = _fetch64(b, s + n - 8)
        c = _rot(c0, 37) * mul + a
        d = (_rot(a, 25) + c0) * mul
        return _len16(c, d, mul)
    if n >= 4:
        mul = K2 + ln * np.uint64(2)
        a = _fetch32(b, s)
        return _len16(ln + (a << np.uint64(3)), _fetch32(b, s + n - 4), mul)
    if n > 0:
        a = np.uint64(b[s])
        bb = np.uint64(b[s + (n >> 1)])
        c = np.uint64(b[s + n - 1])
        y = (a + (bb << _U8)) & np.uint64(0xFFFFFFFF)
        z = (ln + (c << np.uint64(2))) & np.uint64(0xFFFFFFFF)
        return _shift_mix(y * K2 ^ z * K0) * K2
    return K2


@inner(inline="always")
def _ends(b, s, n, ka):
    """The words both mid-length bands start from: ``(a, b, c, d, mul)``."""
    mul = K2 + np.uint64(n) * np.uint64(2)
    return (_fetch64(b, s) * ka, _fetch64(b, s + 8), _fetch64(b, s + n - 8) * mul,
            _fetch64(b, s + n - 16) * K2, mul)


@inner
def _len17to32(b, s, n):
    a, bb, c, d, mul = _ends(b, s, n, K1)
    return _len16(_rot(a + bb, 43) + _rot(c, 30) + d, a + _rot(bb + K2, 18) + c, mul)


@inner
def _len33to64(b, s, n):
    a, bb, c, d, mul = _ends(b, s, n, K2)
    y = _rot(a + bb, 43) + _rot(c, 30) + d
    z = _len16(y, a + _rot(bb + K2, 18) + c, mul)
    e = _fetch64(b, s + 16) * mul
    f = _fetch64(b, s + 24)
    g = (y + _fetch64(b, s + n - 32)) * mul
    h = (z + _fetch64(b, s + n - 24)) * mul
    return _len16(_rot(e + f, 43) + _rot(g, 30) + h, e + _rot(f + a, 18) + g, mul)


@inner(inline="always")
def _weak32(b, p, a, c):
    """FarmHash's WeakHashLen32WithSeeds over the 32 bytes at ``p``: two words."""
    w, x, y, z = _fetch64(b, p), _fetch64(b, p + 8), _fetch64(b, p + 16), _fetch64(b, p + 24)
    a += w
    c = _rot(c + a + z, 21)
    t = a
    a += x
    a += y
    c += _rot(a, 44)
    return a + z, c + t


@inner
def _long(b, s, n):
    seed = np.uint64(81)
    x = seed
    y = seed * K1 + np.uint64(113)
    z = _shift_mix(y * K2 + np.uint64(113)) * K2
    v0 = v1 = w0 = w1 = np.uint64(0)
    x = x * K2 + _fetch64(b, s)
    end = s + ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    p = s
    while True:
        x = _rot(x + y + v0 + _fetch64(b, p + 8), 37) * K1
        y = _rot(y + v1 + _fetch64(b, p + 48), 42) * K1
        x ^= w1
        y += v0 + _fetch64(b, p + 40)
        z = _rot(z + w0, 33) * K1
        v0, v1 = _weak32(b, p, v1 * K1, x + w0)
        w0, w1 = _weak32(b, p + 32, z + w1, y + _fetch64(b, p + 16))
        x, z = z, x
        p += 64
        if p == end:
            break
    mul = K1 + ((z & np.uint64(0xff)) << np.uint64(1))
    p = last64
    w0 += np.uint64((n - 1) & 63)
    v0 += w0
    w0 += v0
    x = _rot(x + y + v0 + _fetch64(b, p + 8), 37) * mul
    y = _rot(y + v1 + _fetch64(b, p + 48), 42) * mul
    x ^= w1 * np.uint64(9)
    y += v0 * np.uint64(9) + _fetch64(b, p + 40)
    z = _rot(z + w0, 33) * mul
    v0, v1 = _weak32(b, p, v1 * mul, x + w0)
    w0, w1 = _weak32(b, p + 32, z + w1, y + _fetch64(b, p + 16))
    x, z = z, x
    return _len16(_len16(v0, w0, mul) + _shift_mix(y) * K0 + z, _len16(v1, w1, mul) + x, mul)


@inner
def fingerprint64(b, s, n):
    """FarmHash ``Fingerprint64`` of ``b[s:s + n]`` (uint64)."""
    if n <= 16:
        return _len0to16(b, s, n)
    if n <= 32:
        return _len17to32(b, s, n)
    if n <= 64:
        return _len33to64(b, s, n)
    return _long(b, s, n)


@njit(nogil=True, cache=True, parallel=True)
def _level0_par(buf, starts, out):
    for i in prange(out.shape[0]):
        out[i] = np.int64(fingerprint64(buf, starts[i], starts[i + 1] - starts[i]) % ID_MOD)


@njit(nogil=True, cache=True)
def _level0_ser(buf, starts, out):
    for i in range(out.shape[0]):
        out[i] = np.int64(fingerprint64(buf, starts[i], starts[i + 1] - starts[i]) % ID_MOD)


def level0_ids(buf, starts):
    """Level-0 id of each string: ``fingerprint64 mod (2**63 - 1)``, in ``[0, 2**63 - 2]``
    (int64, ``(n,)``)."""
    out = np.empty(starts.shape[0] - 1, np.int64)
    (_level0_par if out.shape[0] >= PARALLEL_MIN else _level0_ser)(buf, starts, out)
    return out


@njit(nogil=True, cache=True)
def deep_ids(buf, starts, which, level):
    """Ids of level ``level >= 1`` for strings ``which``: negative, in ``[-2**63, -1]``,
    from a hash independent of the fingerprint (FNV-1a over the bytes, seeded by the
    level, then MurmurHash3's finaliser), so strings that share a fingerprint differ here."""
    out = np.empty(which.shape[0], np.int64)
    for j in range(which.shape[0]):
        i = which[j]
        h = np.uint64(0xcbf29ce484222325) ^ (np.uint64(level) * np.uint64(0x9E3779B97F4A7C15))
        for p in range(starts[i], starts[i + 1]):
            h = (h ^ np.uint64(buf[p])) * np.uint64(0x100000001b3)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        out[j] = -np.int64(h >> np.uint64(1)) - 1
    return out


@inner(inline="always")
def _equal_one(buf, starts, i, arena, a, n):
    s = starts[i]
    if starts[i + 1] - s != n:
        return False
    for p in range(n):
        if buf[s + p] != arena[a + p]:
            return False
    return True


@njit(nogil=True, cache=True, parallel=True)
def _equal_par(buf, starts, which, arena, spans, exists, out):
    for j in prange(which.shape[0]):
        out[j] = exists[j] and _equal_one(buf, starts, which[j], arena, spans[j, 0], spans[j, 1])


@njit(nogil=True, cache=True)
def _equal_ser(buf, starts, which, arena, spans, exists, out):
    for j in range(which.shape[0]):
        out[j] = exists[j] and _equal_one(buf, starts, which[j], arena, spans[j, 0], spans[j, 1])


EQUAL_PARALLEL_MIN = 1 << 13    # a cache miss per string: threads pay off early


def equal_to(buf, starts, which, arena, spans, exists):
    """For each ``j``: string ``which[j]`` equals ``arena[spans[j, 0]:][:spans[j, 1]]``
    (and ``exists[j]``); bool ``(len(which),)``."""
    out = np.empty(which.shape[0], np.bool_)
    kernel = _equal_par if which.shape[0] >= EQUAL_PARALLEL_MIN else _equal_ser
    kernel(buf, starts, which, arena, spans, exists, out)
    return out


@njit(nogil=True, cache=True)
def gather_bytes(arena, offsets, lengths):
    """``(buf, starts)`` of the arena pieces ``arena[offsets[j]:][:lengths[j]]``."""
    starts = np.zeros(offsets.shape[0] + 1, np.int64)
    for j in range(offsets.shape[0]):
        starts[j + 1] = starts[j] + lengths[j]
    buf = np.empty(starts[-1], np.uint8)
    for j in range(offsets.shape[0]):       # (a slice assignment would compile Numba's
        s, a = starts[j], offsets[j]        # shape-mismatch message: strings, 1.5 s)
        for p in range(lengths[j]):
            buf[s + p] = arena[a + p]
    return buf, starts
