"""Planning an all-to-all exchange of keys between ranks: who owns what, and where it goes.

A rank's batch of ``n`` keys becomes ``u`` distinct keys (first-occurrence
order, :func:`jit_kernels.segment.unique_inverse`), each owned by one of
``R`` ranks.  The send buffer holds the distinct keys grouped by owner (rank
0's first), and within an owner in first-occurrence order, so it is one
``Alltoallv`` with ``counts[r]`` keys for rank ``r``.  ``slot[i]`` is where
position ``i``'s key sits in that buffer: the rows that come back in the
same layout reach batch order with ``out[i] = back[slot[i]]``
(:func:`jit_kernels.segment.gather_rows`), and gradients go the other way
with ``sums = segment_sum(grads, slot, u)`` (already in send order).

Shapes: ``keys`` / ``inverse`` / ``slot`` (n,) int64; ``uniq`` / ``owner`` /
``send_pos`` / ``send_keys`` (u,); ``counts`` (R,) int64.

Owners: the default rule is SOK's, the key's unsigned value mod ``R``, on the
key dtype's width (``bits`` 32 for int32 tables, whose flat int64 copies are
sign-extended), like :func:`numbaemb.sharding.default_partitioner`.

>>> import numpy as np
>>> p = plan(np.array([5, 2, 5, -1, 4], np.int64), 2)
>>> p.send_keys.tolist(), p.counts.tolist(), p.slot.tolist()
([2, 4, 5, -1], [2, 2], [2, 0, 2, 3, 1])
"""
from collections import namedtuple

import numpy as np
from numba import njit

from ._inner import inner
from .segment import unique_inverse

__all__ = ["Plan", "plan", "default_owners", "bucket", "place", "first_flags"]

Plan = namedtuple("Plan", "send_keys counts slot inverse")
Plan.__doc__ = """An exchange plan: ``send_keys`` (u,) distinct keys grouped by owner,
``counts`` (R,) keys per owner, ``slot`` (n,) each position's place in ``send_keys``,
``inverse`` (n,) each position's index among the distinct keys (first-occurrence order)."""


@njit(nogil=True, cache=True)
def owner_of(key, n_ranks, mask):
    """Owner of one key: its unsigned value (low bits under ``mask``) mod ``n_ranks``."""
    return np.int64((np.uint64(key) & mask) % np.uint64(n_ranks))


@inner
def _default_owners(keys, n_ranks, mask, out):
    for i in range(keys.shape[0]):
        out[i] = owner_of(keys[i], n_ranks, mask)


def default_owners(keys, n_ranks, bits=64):
    """Owner rank of each key (int64 array of ``keys.shape``), SOK's rule.

    >>> default_owners(np.array([0, 1, -1], np.int64), 4).tolist()
    [0, 1, 3]
    >>> default_owners(np.array([-1], np.int64), 3, bits=32).tolist()   # 2**32 - 1 mod 3
    [0]
    """
    out = np.empty(keys.shape[0], np.int64)
    _default_owners(np.ascontiguousarray(keys, np.int64), np.int64(n_ranks),
                    np.uint64((1 << bits) - 1), out)
    return out


@inner
def bucket(owner, n_ranks, counts, send_pos):
    """Counting sort by owner, stable: ``counts[r]`` items for rank ``r`` and
    ``send_pos[j]`` the place of item ``j`` in the grouped order."""
    for r in range(n_ranks):
        counts[r] = 0
    for j in range(owner.shape[0]):
        counts[owner[j]] += 1
    start = np.empty(n_ranks, np.int64)
    acc = 0
    for r in range(n_ranks):
        start[r] = acc
        acc += counts[r]
    for j in range(owner.shape[0]):
        r = owner[j]
        send_pos[j] = start[r]
        start[r] += 1


@inner
def place(uniq, send_pos, inverse, send_keys, slot):
    """``send_keys[send_pos[j]] = uniq[j]`` and ``slot[i] = send_pos[inverse[i]]``."""
    for j in range(uniq.shape[0]):
        send_keys[send_pos[j]] = uniq[j]
    for i in range(inverse.shape[0]):
        slot[i] = send_pos[inverse[i]]


@njit(nogil=True, cache=True)
def first_flags(inverse, slot, back, out):
    """``exists`` of a find_or_insert in batch order: a key's first occurrence takes
    the owner's answer ``back[slot[i]]``, its repeats found it (True).  Distinct keys
    are numbered by first occurrence, so a first occurrence is a new maximum of
    ``inverse``."""
    seen = -1
    for i in range(inverse.shape[0]):
        u = inverse[i]
        if u > seen:
            out[i] = back[slot[i]]
            seen = u
        else:
            out[i] = True


def check_owners(owner, shape, n_ranks, what="partitioner"):
    """``owner`` as int64, checked to be ``shape`` and in ``[0, n_ranks)``."""
    owner = np.asarray(owner)
    if owner.shape != shape or owner.dtype.kind not in "iu":
        raise ValueError(f"{what} must return integer ranks of shape {shape}, "
                         f"got dtype {owner.dtype} and shape {owner.shape}")
    if owner.size and (owner.min() < 0 or owner.max() >= n_ranks):
        raise ValueError(f"{what} returned ranks outside [0, {n_ranks})")
    return np.ascontiguousarray(owner, np.int64)


def plan(keys, n_ranks, partitioner=None, key_dtype=np.int64, unique=True):
    """Plan the exchange of the flat int64 ``keys`` among ``n_ranks`` ranks.

    Args:
      keys: (n,) int64 (int32 keys sign-extended).
      n_ranks: world size R.
      partitioner: optional ``f(keys in key_dtype, R) -> ranks``; default
        :func:`default_owners`.
      key_dtype: the table's key dtype (width of the default rule; what
        ``send_keys`` holds).
      unique: dedupe (default); ``False`` sends every position (``u == n``,
        ``inverse`` the identity), in batch order within each owner.
    Returns:
      a :class:`Plan`.
    """
    keys = np.ascontiguousarray(keys, np.int64)
    if unique:
        uniq, inverse = unique_inverse(keys)
    else:
        uniq, inverse = keys, np.arange(keys.shape[0], dtype=np.int64)
    key_dtype = np.dtype(key_dtype)
    if partitioner is None:
        owner = default_owners(uniq, n_ranks, 8 * key_dtype.itemsize)
    else:
        owner = check_owners(partitioner(uniq.astype(key_dtype), n_ranks), uniq.shape, n_ranks)
    counts = np.empty(n_ranks, np.int64)
    send_pos = np.empty(uniq.shape[0], np.int64)
    bucket(owner, n_ranks, counts, send_pos)
    send_keys = np.empty(uniq.shape[0], np.int64)
    slot = np.empty(keys.shape[0], np.int64)
    place(uniq, send_pos, inverse, send_keys, slot)
    return Plan(send_keys.astype(key_dtype, copy=False), counts, slot, inverse)
