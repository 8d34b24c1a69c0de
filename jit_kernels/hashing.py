"""Bit mixers for int64 keys: slot hashing and counter-based random numbers.

All arithmetic is on uint64 so that every int64 (negative ones included) hashes
the same way on CPU and CUDA.

>>> import numpy as np
>>> int(mix64(np.uint64(0))) == int(mix64(np.uint64(0)))
True
"""
import numpy as np

from ._inner import inner

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


@inner
def mix64(x):
    """MurmurHash3's 64-bit finaliser: a bijection on uint64 with full avalanche."""
    x = np.uint64(x)
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


@inner
def hash_key(key):
    """Hash an int64 key (any value) to a uint64."""
    return mix64(np.uint64(np.int64(key)) + GOLDEN)
