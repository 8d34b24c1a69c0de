"""Row arenas: growable columns in reserved address space, faulted in ahead of need.

Large columns live in private anonymous memory mappings (:func:`arena_empty`)
that reserve address space for all the rows physical memory could hold; pages
take memory only once written.  Growing a column is then a longer view of the
same memory: no copy, no move (big pages and outstanding views stay valid).
Where the reservation cannot be had or is outgrown, rows are copied into a new
mapping, in parallel.

The first write to a fresh page costs a page fault: on the 2-core VM this was
measured on, 0.1-1 ms per MiB (more where the hypervisor must back the memory
first), so a training step that inserts 4,000 rows of 64 floats into three
columns spent ~4 ms faulting.  Huge pages are asked for over the whole
reservation: with 4 KiB pages for the rows a growing table faults in (tried),
early steps got cheaper but later ones dearer (Adam on 13,500 random rows of a
700k-row table 1.7-1.9 vs 1.35-1.4 ms: TLB misses), and a long training run
lives in the later ones.

:func:`prefault` has the next pages of a growing column mapped before any row
lands there, by a native background thread (:mod:`numbaemb._populator`: no
GIL, ``SCHED_IDLE``, no ``mmap_lock``).  Measured on the 2-core VM, Keras
benchmark steps 11-30: initial rows of new ids 0.4 against 4.2 ms a step, the
whole step 14.8 against 19.7 ms.  On by default on Linux; ``NUMBAEMB_PREFAULT=0``
before import switches it off.  :func:`populate` maps a whole fresh column at
once, synchronously (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+; else it
writes every page): for the rows a table is created with (``init_size``).
"""
import mmap
import os
import sys
from dataclasses import dataclass

import numpy as np
from numba import njit, types

from jit_kernels import cpu_table as k

from ._populator import make_populator

ARENA_MIN_BYTES = 1 << 20   # smaller columns are plain numpy arrays
MADV_POPULATE_WRITE = 23    # linux/mman.h (5.14+)
CHUNK = 2 << 20             # bytes per madvise call
PREFAULT_MIN = 4 << 20      # populate at least this far ahead of the rows in use ...
PREFAULT_MAX = 64 << 20     # ... and at most this far (1/16 of the column in between)


@dataclass
class Column:
    """A row-aligned column: its data, the kernel initializer params of new rows and
    how many bytes of its mapping have been asked to be populated (:func:`prefault`)."""
    data: np.ndarray
    init: tuple
    populated: int = 0


def _advise(mm):
    if hasattr(mmap, "MADV_HUGEPAGE"):      # big pages: fewer TLB misses on random rows
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, ValueError):
            pass


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 0


def arena_empty(rows, width, dtype, reserve_bytes=None):
    """An uninitialised ``(rows, width)`` column that :func:`arena_grow` extends in place.

    Large columns are a view of their own private anonymous mapping that reserves
    address space (``MAP_NORESERVE``) for ``reserve_bytes`` (default: the
    machine's physical memory, so a column never has to move).  Only pages that
    are written take memory, so the reservation costs no RSS.

    >>> a = arena_empty(1 << 16, 8, np.float32); a.shape, a.flags.c_contiguous
    ((65536, 8), True)
    """
    dtype = np.dtype(dtype)
    count = int(rows) * int(width)
    nbytes = count * dtype.itemsize
    if nbytes < ARENA_MIN_BYTES or not hasattr(mmap, "MAP_PRIVATE") or sys.maxsize < 2 ** 40:
        return np.empty((rows, width), dtype)
    size = max(nbytes, _physical_memory() if reserve_bytes is None else int(reserve_bytes))
    noreserve = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
    try:
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | noreserve)
    except OSError:                          # address space is limited: map what is asked
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    _advise(mm)
    return np.frombuffer(mm, dtype, count=count).reshape(rows, width)


def index_empty(n, dtype):
    """An uninitialised 1-D array of ``n`` items for a hash index or its score copies:
    its own mapping in big pages where the system gives them (``MADV_HUGEPAGE``: a
    probe lands on a random page, and with 4 KiB pages nearly every probe of a large
    index missed the TLB too; evicting inserts into a full bucketed table of 1M keys
    took 16.9 / 17.0 ms a batch of 100k, 13.5 / 12.2 in big pages), ``np.empty``
    below ``ARENA_MIN_BYTES``.

    >>> a = index_empty(1 << 18, np.int64); a.shape, a.flags.c_contiguous
    ((262144,), True)
    """
    n = int(n)
    return arena_empty(n, 1, dtype, reserve_bytes=n * np.dtype(dtype).itemsize).reshape(n)


def _mapping(a):
    """The mapping that ``a`` is a C-contiguous view of, from its first byte; or None."""
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    buf = root.base.obj if isinstance(root.base, memoryview) else root.base
    if (isinstance(buf, mmap.mmap) and a.flags.c_contiguous
            and a.ctypes.data == root.ctypes.data and a.nbytes <= len(buf)):
        return buf
    return None


def arena_grow(col, keep, rows):
    """Give column ``col`` (a :class:`Column`) ``rows`` rows; rows ``[0, keep)`` keep
    their values.  Within the column's reservation this is a longer view of the
    same memory (nothing moves, views stay valid); otherwise the rows are copied,
    in parallel, into a new column.

    >>> col = Column(arena_empty(1 << 16, 8, np.float32), None)
    >>> col.data[:] = 1
    >>> view = col.data[:2]
    >>> arena_grow(col, 1 << 16, 1 << 18)
    >>> col.data.shape, float(col.data[(1 << 16) - 1, 7]), np.shares_memory(view, col.data)
    ((262144, 8), 1.0, True)
    >>> col = Column(arena_empty(1 << 16, 8, np.float32, reserve_bytes=0), None)
    >>> col.data[:] = 2
    >>> arena_grow(col, 1 << 16, 1 << 17)                  # beyond the reservation: copied
    >>> col.data.shape, float(col.data[(1 << 16) - 1, 7])
    ((131072, 8), 2.0)
    """
    width, dtype = col.data.shape[1], col.data.dtype
    mm = _mapping(col.data)
    if mm is not None and int(rows) * width * dtype.itemsize <= len(mm):
        col.data = np.frombuffer(mm, dtype, count=int(rows) * width).reshape(rows, width)
        return
    data = arena_empty(rows, width, dtype)
    if min(keep, col.data.shape[0]) > 0:
        k.copy_rows(col.data, data, min(keep, col.data.shape[0]))
    col.data = data
    col.populated = 0


# ---- populating pages ahead of need, off the caller's thread ---------------------------------
_madvise = types.ExternalFunction("madvise", types.intc(types.uintp, types.uintp, types.intc))


@njit(nogil=True, cache=True)
def _populate(addr, nbytes, chunk, advice):
    """``madvise(addr + k chunk, chunk, advice)`` over ``nbytes``, without the GIL;
    0, or -1 at the first failure.  Short calls hold the kernel's mm lock briefly."""
    off = 0
    while off < nbytes:
        n = min(chunk, nbytes - off)
        if _madvise(addr + off, n, advice) != 0:
            return -1
        off += n
    return 0


def populate(a):
    """Fault in every page of the fresh column ``a`` now (no contents yet: called when
    the column is created), so that writing its rows later costs no page faults.
    Used for the rows a table is created with (``init_size``).

    >>> a = arena_empty(1 << 15, 64, np.float32); populate(a); a.shape
    (32768, 64)
    """
    if a.size == 0:
        return
    if not (sys.platform.startswith("linux") and _mapping(a) is not None
            and _populate(a.ctypes.data, a.nbytes, CHUNK, MADV_POPULATE_WRITE) == 0):
        a.fill(0)                            # portable: write every page


# NUMBAEMB_PREFAULT=0 switches the background thread off
POPULATOR = make_populator(sys.platform.startswith("linux")
                           and os.environ.get("NUMBAEMB_PREFAULT", "1") != "0")


def prefault(col, rows_in_use):
    """Have the pages past the first ``rows_in_use`` rows of ``col`` populated ahead of
    need, on the background thread, when the populated part is running out.  Returns
    the byte range asked for, or None.  Never changes the column's contents.

    >>> col = Column(arena_empty(1 << 16, 64, np.float32), None)
    >>> r = prefault(col, 1000)                   # None when NUMBAEMB_PREFAULT=0 or not Linux
    >>> POPULATOR.wait(); r is None or (r[0] <= 1000 * 256 and r[1] >= 1000 * 256 + (4 << 20))
    True
    """
    if not POPULATOR.enabled:
        return None
    in_use = int(rows_in_use) * col.data.shape[1] * col.data.itemsize
    ahead = min(PREFAULT_MAX, max(PREFAULT_MIN, in_use // 16))
    if col.populated >= in_use + ahead // 2:       # (most calls: nothing to do)
        return None
    mm = _mapping(col.data)
    if mm is None:
        return None
    page = mmap.PAGESIZE
    start = max(col.populated, in_use) // page * page
    stop = min(len(mm), (in_use + ahead + page - 1) // page * page)
    if stop <= start:
        return None
    base = col.data.ctypes.data              # the mapping's first byte (see _mapping)
    if not POPULATOR.submit(mm, base + start, stop - start):
        return None
    col.populated = stop
    return start, stop
