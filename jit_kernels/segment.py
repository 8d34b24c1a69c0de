"""Unique ids and per-id gradient sums: the first half of a sparse backward pass.

``unique_inverse`` numbers the distinct keys of a batch through a temporary
hash index.  In parallel it is driven by the table's own lock-free insert
(:func:`jit_kernels.cpu_table.find_or_insert_rows`; the row it hands out is
the unique id), and the ids, which depend on thread timing, are renumbered in
first-occurrence order.  Serially a plain linear-probing pass without atomics
hands them out in that order directly (65,536 Zipf ids: 0.42 ms against 0.60
ms through the atomic body).  ``segment_sum`` adds the rows of each id
in batch order, so float sums are reproducible whatever the thread count.
``gather_rows`` is its forward twin: ``out[i] = rows[inverse[i]]``.

Shapes: ``keys`` (n,) int64; ``uniq`` (u,); ``inverse`` (n,) int64 with
``uniq[inverse] == keys``; ``values`` (n, d); sums (u, d).

Serial or parallel: every driver here exists twice, compiled from the same
Python function with ``parallel=True`` and with ``parallel=False``
(:func:`serial_twin`); :func:`threads_for` picks one from the amount of work,
``elements x cost`` against :data:`PARALLEL_MIN`.  A parallel launch costs
tens of microseconds on an idle machine but, when the cores are busy (a
training process: TensorFlow's thread pools, the input pipeline, other
processes), it waits until every worker thread has been scheduled, up to
milliseconds; and the parallel unique and segment-sum do more work than the
serial ones (race ids then renumbering; every thread scans the whole batch).
On 2 cores (AMD EPYC, load 1.5) the serial unique of a 65,536-id Zipf batch
took 0.65 ms against 1.28 ms in parallel, the segment-sum 0.98 ms against
2.10 ms, so both stay serial up to :data:`PARALLEL_MIN` elements (cost 1);
an Adam row update is heavier (cost :data:`ROW_COST` per row:
:mod:`jit_kernels.optimizers`), and 13,633 rows took 2.16 ms serially against
1.29 ms in parallel.  Set ``NUMBAEMB_PARALLEL_MIN`` before import to change
the cut-off, or assign :data:`PARALLEL_MIN` at run time; 0 means always
parallel.

>>> import numpy as np
>>> uniq, inv = unique_inverse(np.array([7, -1, 7, 0], np.int64))
>>> uniq.tolist(), inv.tolist()
([7, -1, 0], [0, 1, 0, 2])
>>> segment_sum(np.ones((4, 2), np.float32), inv, 3, 2).tolist()
[[2.0, 2.0], [1.0, 1.0], [1.0, 1.0]]
"""
import os

import numba
import numpy as np
from numba import njit, prange

from ._inner import inner
from ._twins import serial_twin
from .atomics import cas, load_acquire
from .cpu_table import find_or_insert_rows
from .hashing import hash_key
from .slots import empty_slots

__all__ = ["unique_inverse", "segment_sum", "segment_sum_into", "gather_rows",
           "serial_twin", "threads_for", "PARALLEL_MIN", "ROW_COST"]

_opts = dict(parallel=True, nogil=True, cache=True)


def _env_int(name, default):
    value = os.environ.get(name, "")
    try:
        return max(0, int(value)) if value.strip() else default
    except ValueError:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}") from None


# Work (elements x cost) below which drivers run their serial twin.
PARALLEL_MIN = _env_int("NUMBAEMB_PARALLEL_MIN", 1 << 18)
# Cost of one optimizer row update of 64 values (three rows of the table) in these units;
# the optimizer drivers scale it by their row width.
ROW_COST = 256


_LAST_SIZE = [0]


def last_size():
    """The ``n`` of the latest :func:`threads_for` call (the batch a driver is about to
    run: what a cold start's helper sizes its kernels by, :mod:`numbaemb._ahead`)."""
    return _LAST_SIZE[0]


def threads_for(n, cost=1):
    """Threads a driver should use for ``n`` elements of ``cost`` each: 1 while
    ``n * cost < PARALLEL_MIN``, else ``numba.get_num_threads()``."""
    _LAST_SIZE[0] = n
    if n * cost < PARALLEL_MIN:
        return 1
    return numba.get_num_threads()


def unique_inverse(keys, out=None):
    """Distinct keys in first-occurrence order and, per position, its key's index.

    Args:
      keys: (n,) int64 (any values, INT64_MIN/INT64_MAX/-1 included).
      out: optional ``(uniq_buffer (n,), inverse (n,))`` int64 C-contiguous arrays to
        write into (e.g. 64-byte aligned ones to hand to TensorFlow); ``uniq`` is then
        the view ``uniq_buffer[:u]``.
    Returns:
      ``(uniq (u,) int64, inverse (n,) int64)`` with ``uniq[inverse] == keys``.
    """
    keys = np.ascontiguousarray(keys, np.int64)
    n = keys.shape[0]
    uniq, inverse = (np.empty(n, np.int64), np.empty(n, np.int64)) if out is None else out
    if threads_for(n) == 1:     # (its index from here: no allocation compiled with it)
        u = _unique_serial(keys, uniq, inverse, np.empty(_index_slots(n), np.int64))
    else:
        # load <= 1/2 keeps probe sequences short; the index lives only for this call
        slots = empty_slots(_index_slots(n))
        race_ids, alloc = np.empty(n, np.int64), np.zeros(1, np.int64)
        find_or_insert_rows(slots, slots.shape[0] // 2 - 1, keys, race_ids,
                            np.empty(n, np.bool_), alloc, np.empty(0, np.int64), 0, 0)
        u = int(alloc[0])
        first_occurrence_order(keys, race_ids, u, uniq, inverse)
    return (uniq[:u] if out is not None or 2 * u > n else uniq[:u].copy()), inverse


def _index_slots(n):
    """Slots of an index of ``n`` keys at load <= 1/2: a power of two, at least 16."""
    return max(16, 1 << (2 * n - 1).bit_length())


@njit(nogil=True, cache=True)
def _unique_serial(keys, uniq, inverse, ids):
    """One pass, one thread, no atomics: a linear-probing index of ids in ``ids``
    (:func:`_index_slots` of the keys, any contents; -1: empty slot; any int64 is a
    key, the key of id ``j`` is ``uniq[j]``) at load <= 1/2.  Ids are handed out in
    first-occurrence order.  Returns the number of distinct keys.  (The index comes
    from the caller: an allocation here, ``np.empty`` or ``np.full``, is an overload
    that a cold process compiles with it, 0.08-0.18 s.)"""
    n = keys.shape[0]
    cap = ids.shape[0]
    mask = np.uint64(cap - 1)
    for t in range(cap):
        ids[t] = -1
    u = 0
    for i in range(n):
        key = keys[i]
        s = hash_key(key) & mask
        while True:
            j = ids[s]
            if j < 0:
                ids[s] = u
                uniq[u] = key
                inverse[i] = u
                u += 1
                break
            if uniq[j] == key:
                inverse[i] = j
                break
            s = (s + np.uint64(1)) & mask
    return u


@inner
def _unique_serial_alloc(keys, uniq, inverse):
    """:func:`_unique_serial` for a kernel, which allocates the index itself."""
    cap = 16
    while cap < 2 * keys.shape[0]:
        cap *= 2
    return _unique_serial(keys, uniq, inverse, np.empty(cap, np.int64))


@inner
def _atomic_min(arr, idx, value):
    old = load_acquire(arr, idx)
    while value < old:
        seen = cas(arr, idx, old, value)
        if seen == old:
            return
        old = seen


@njit(**_opts)
def first_occurrence_order(keys, tmp, u, uniq, inverse):
    """Renumber ids ``tmp`` (n,) in [0, u), one per distinct key, by first occurrence,
    into ``uniq[:u]`` and ``inverse`` (n,), as :func:`unique_inverse` returns them."""
    n = keys.shape[0]
    first = np.full(u, n, np.int64)      # first position of each race id
    for i in prange(n):
        _atomic_min(first, tmp[i], i)
    is_first = np.zeros(n, np.int64)
    for t in prange(u):
        is_first[first[t]] = 1
    rank = np.cumsum(is_first)           # rank[p] - 1 = id of a first occurrence p
    renumber = np.empty(u, np.int64)
    for t in prange(u):
        p = first[t]
        renumber[t] = rank[p] - 1
        uniq[rank[p] - 1] = keys[p]
    for i in prange(n):
        inverse[i] = renumber[tmp[i]]


def segment_sum(values, inverse, n_unique, n_threads):
    """out[u] = sum of values[i] over i with inverse[i] == u, added in order of i.

    Thread ``t`` of ``n_threads`` owns the ids ``u % n_threads == t`` and scans
    the batch in order (pass ``numba.get_num_threads()``; fewer than
    :data:`PARALLEL_MIN` rows run serially), so the sums are the sequential
    loop's, bit for bit, in the dtype of ``values``.

    Args:
      values: (n, d) float.  inverse: (n,) int64 in [0, n_unique).
    Returns:
      (n_unique, d) array of ``values.dtype``.
    """
    out = np.empty((n_unique, values.shape[1]), values.dtype)
    segment_sum_into(values, inverse, out, n_threads)
    return out


def segment_sum_into(values, inverse, out, n_threads):
    """:func:`segment_sum` into ``out`` (``(n_unique, d)``, C-contiguous, any contents:
    it is overwritten), e.g. a 64-byte aligned buffer to hand to TensorFlow."""
    n_threads = max(1, min(int(n_threads), threads_for(inverse.shape[0])))
    if n_threads == 1:
        _segment_sum_serial(values, inverse, out)
    else:
        _segment_sum_owned(values, inverse, out, n_threads)
    return out


@njit(nogil=True, cache=True)
def _segment_sum_serial(values, inverse, out):
    d = values.shape[1]
    for u in range(out.shape[0]):
        for c in range(d):
            out[u, c] = 0
    for i in range(inverse.shape[0]):
        u = inverse[i]
        for c in range(d):
            out[u, c] += values[i, c]


@njit(**_opts)
def _segment_sum_owned(values, inverse, out, n_threads):
    d = values.shape[1]
    for t in prange(n_threads):
        for u in range(t, out.shape[0], n_threads):
            for c in range(d):
                out[u, c] = 0
        for i in range(inverse.shape[0]):
            u = inverse[i]
            if u % n_threads == t:
                for c in range(d):
                    out[u, c] += values[i, c]


def gather_rows(rows, inverse, out):
    """``out[i] = rows[inverse[i]]`` (``rows`` (u, d), ``out`` (n, d)); returns ``out``.

    Serial below ``PARALLEL_MIN`` ids: alone, 65,536 x 64 floats take 0.36 ms on
    two threads against 0.64 ms on one (2-core VM), but inside a training step
    the parallel copy took 3-6 ms (TensorFlow's pool threads still hold a core)."""
    if threads_for(inverse.shape[0]) == 1:
        _gather_rows_serial(rows, inverse, out)
    else:
        _gather_rows(rows, inverse, out)
    return out


@njit(**_opts)
def _gather_rows(rows, inverse, out):
    for i in prange(inverse.shape[0]):
        u = inverse[i]
        for c in range(out.shape[1]):
            out[i, c] = rows[u, c]


_gather_rows_serial = serial_twin(_gather_rows)
