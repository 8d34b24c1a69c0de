"""Allocation helpers: buffers aligned for zero-copy hand-off (TF needs 64 bytes)."""
import math
import sys
import threading

import numpy as np

ALIGN = 64


def _nbytes(shape, dtype):
    count = math.prod(int(d) for d in shape)
    return count, max(count, 1) * dtype.itemsize   # a zero-length slice would lose the offset


def _aligned_view(raw, shape, dtype, count, nbytes, align):
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + nbytes].view(dtype)[:count].reshape(shape)


def _shape(shape):
    return (shape,) if np.isscalar(shape) else tuple(shape)


def aligned_empty(shape, dtype, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose data pointer is a multiple of ``align``.

    >>> a = aligned_empty((3, 5), np.float32)
    >>> a.ctypes.data % 64, a.shape
    (0, (3, 5))
    >>> aligned_empty((0, 8), np.float32).ctypes.data % 64
    0
    """
    dtype, shape = np.dtype(dtype), _shape(shape)
    count, nbytes = _nbytes(shape, dtype)
    return _aligned_view(np.empty(nbytes + align, np.uint8), shape, dtype, count, nbytes, align)


class BufferPool:
    """:func:`aligned_empty` from a few buffers that are reused once nothing else
    references them (the views handed out, TensorFlow's tensors of them).

    For the temporaries a training step hands to TensorFlow every step (the 16 MB
    embedding output of the benchmark's job): a fresh array that large is a fresh
    ``mmap`` whenever glibc's moving threshold is below its size, and writing it
    then faults and zeroes every page.  On the 2-core VM that happened in ~10% of
    the steps after a table's index had grown (freeing the old index moves the
    threshold), 15-20 ms each.  A buffer is reused for a request of at least half
    its size; at most ``keep`` buffers are kept (the least recently used go).

    >>> pool = BufferPool()
    >>> a = pool.empty((4, 3), np.float32); p = a.ctypes.data
    >>> b = pool.empty((4, 3), np.float32); b.ctypes.data == p      # a holds its buffer
    False
    >>> del a
    >>> c = pool.empty((2, 5), np.float32); c.ctypes.data == p      # free again: reused
    True
    """

    def __init__(self, keep=4, align=ALIGN):
        self._keep, self._align = keep, align
        self._bufs = []                  # raw uint8 arrays, most recently used first
        self._lock = threading.Lock()

    def empty(self, shape, dtype) -> np.ndarray:
        dtype, shape = np.dtype(dtype), _shape(shape)
        count, nbytes = _nbytes(shape, dtype)
        need = nbytes + self._align
        with self._lock:
            raw = self._take(need)
            if raw is None:
                raw = np.empty(need, np.uint8)
                self._bufs.insert(0, raw)
                del self._bufs[self._keep:]     # dropped ones live on while referenced
            return _aligned_view(raw, shape, dtype, count, nbytes, self._align)

    def _take(self, need):
        for i in range(len(self._bufs)):
            raw = self._bufs[i]
            # references: the list, ``raw`` here and getrefcount's argument; every
            # live view (and so every tensor made of one) adds one
            if need <= raw.shape[0] <= 2 * need and sys.getrefcount(raw) == 3:
                self._bufs.insert(0, self._bufs.pop(i))
                return raw
        return None


def is_aligned(arr: np.ndarray, align: int = ALIGN) -> bool:
    """True when ``arr``'s data pointer is a multiple of ``align``."""
    return arr.ctypes.data % align == 0


def kept_view(owner, attr, base, key, make):
    """``make()``, a view of ``base``, kept in ``owner.<attr>`` and handed out again while
    ``base`` is the same array and ``key`` the same (slicing a GPU array costs ~25 us
    in Numba; a hot path asks for the same view call after call).

    >>> class T: pass
    >>> t, a = T(), np.arange(4)
    >>> kept_view(t, "_v", a, 2, lambda: a[:2]) is kept_view(t, "_v", a, 2, lambda: a[:2])
    True
    """
    held = getattr(owner, attr, None)
    if held is None or held[0] is not base or held[1] != key:
        held = (base, key, make())
        setattr(owner, attr, held)
    return held[2]
