"""The exchange of :mod:`jit_kernels.exchange` planned on a GPU: the same plan, on
device arrays, for tables split across processes whose rows live on GPUs.

:func:`plan` gives exactly the CPU plan's ``send_keys``, ``counts`` and ``slot``
(distinct keys grouped by owner, rank 0's first, each owner's in first-occurrence
order) and, instead of ``inverse``, ``first`` (n,) bool: whether a position is its
key's first occurrence (all :func:`jit_kernels.exchange.first_flags` needs).  How:

1. ``ids``: each position's distinct key number (the batch-local hash index of
   :func:`jit_kernels.cuda_table.number_keys`, numbers in no particular order);
2. ``firstpos[id]``: its first position (``atomic.min``);
3. each first occurrence's owner (SOK's rule, :func:`jit_kernels.exchange.owner_of`,
   or a custom partitioner's answer computed on the host), repeats in an extra group
   ``R``; a stable counting sort of the positions by that
   (:func:`jit_kernels.cuda_table.group_positions`) lists the first occurrences by
   owner in batch order;
4. ``send_keys[j]``, each id's place ``j``, and ``slot[i]`` = the place of position
   ``i``'s id.

Only ``counts`` (R,) comes to the host (MPI's header needs it to size the receive
buffers).  :func:`segment_sums` sums gradient rows per place (``segment_sum``'s bits:
from zero, in batch order); :func:`pick` brings flags back in batch order.  Nothing here imports ``numba.cuda`` until a driver is first called.

Example (needs a GPU or the simulator, so not a doctest)::

    send_keys, counts, slot, first = plan(cuda.to_device(keys), 2)
"""
import numpy as np

from . import cuda_table as ct
from .cuda_kernels import registrar
from .exchange import owner_of

__all__ = ["plan", "segment_sums", "pick"]

cuda = None      # numba.cuda, bound by add_kernels (a global: the simulator swaps it)


def add_kernels(kernels, cuda_module, body, group_sum):
    """Add the exchange kernels (``exchange_*``) to ``kernels`` (from
    :func:`jit_kernels.cuda_kernels.build`; ``group_sum``: the optimizer kernels'
    device function summing a group's gradient rows)."""
    global cuda
    cuda = cuda_module
    owner = body(owner_of)

    kernel = registrar(kernels, "exchange_")

    @kernel
    def first_pos(ids, firstpos):
        for i in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
            cuda.atomic.min(firstpos, ids[i], i)

    # ids empty: every position is its own key (a plan of every position)
    @kernel
    def owners(keys, ids, firstpos, n_ranks, mask, given, group):
        """group[i] = the owner of a first occurrence (``given[i]`` if ``given`` is
        not empty: a custom partitioner's), ``n_ranks`` for a repeat."""
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            if ids.shape[0] == 0 or firstpos[ids[i]] == i:
                group[i] = given[i] if given.shape[0] else owner(keys[i], n_ranks, mask)
            else:
                group[i] = n_ranks

    @kernel
    def place(keys, ids, order, send_keys, place_of):
        """send_keys[j] = the key at order[j]; place_of[its id] = j."""
        for j in range(cuda.grid(1), send_keys.shape[0], cuda.gridsize(1)):
            p = order[j]
            send_keys[j] = keys[p]
            place_of[p if ids.shape[0] == 0 else ids[p]] = j

    @kernel
    def slots(ids, firstpos, place_of, slot, first):
        for i in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
            g = ids[i]
            slot[i] = place_of[g]
            first[i] = firstpos[g] == i

    @kernel
    def sums(grads, order, starts, out):
        """out[g, c] = the sum of column c of group g's rows, from zero in batch order."""
        dim = out.shape[1]
        for e in range(cuda.grid(1), out.shape[0] * dim, cuda.gridsize(1)):
            g, c = e // dim, e % dim
            group_sum(grads, order, starts[g], starts[g + 1], out[g], c, c + 1)

    @kernel
    def pick(back, slot, first, only_first, out):
        """out[i] = back[slot[i]]; with ``only_first`` a repeat (``first[i]`` False)
        gets True."""
        for i in range(cuda.grid(1), slot.shape[0], cuda.gridsize(1)):
            out[i] = True if only_first and not first[i] else back[slot[i]]


def plan(keys, n_ranks, bits=64, unique=True, owners=None):
    """Plan the exchange of the flat int64 device ``keys`` (n,) among ``n_ranks`` ranks
    by SOK's rule on ``bits``-bit keys, or by ``owners`` (n,) int64 device array, each
    position's rank in ``[0, n_ranks)`` (a custom partitioner's answer, checked by the
    caller): ``(send_keys (u,) int64, counts (R,) numpy int64, slot (n,) int64, first
    (n,) bool)``, device arrays but ``counts``.  ``unique=False``: every position is
    sent (``u == n``, grouped by owner in batch order), and ``first`` is all True."""
    K = ct._kernels()
    n = keys.shape[0]
    scratch = ct.Scratch()         # the plan outlives the call: nothing shared
    slot = cuda.device_array(n, np.int64)
    mask = np.uint64((1 << bits) - 1)
    if not n:
        return (cuda.device_array(0, np.int64), np.zeros(n_ranks, np.int64), slot,
                cuda.device_array(0, np.bool_))
    if unique:
        ids, _, u = ct.number_keys(keys, scratch)
        firstpos = ct.filled(u, n, np.int64)
        ct._go(K.exchange_first_pos, n, ids, firstpos)
    else:                          # no ids: each position its own key, all sent
        ids = firstpos = cuda.device_array(0, np.int64)
        u = n
    group = cuda.device_array(n, np.int64)
    given = cuda.device_array(0, np.int64) if owners is None else owners
    ct._go(K.exchange_owners, n, keys, ids, firstpos, np.int64(n_ranks), mask, given, group)
    order, starts = ct.group_positions(group, n_ranks + 1, scratch)
    counts = np.diff(starts.copy_to_host()[:n_ranks + 1])
    send_keys = cuda.device_array(u, np.int64)
    if not unique:                 # a position's place is its slot
        ct._go(K.exchange_place, u, keys, ids, order, send_keys, slot)
        return send_keys, counts, slot, ct.filled(n, True, np.bool_)
    first = cuda.device_array(n, np.bool_)
    place_of = cuda.device_array(u, np.int64)
    ct._go(K.exchange_place, u, keys, ids, order, send_keys, place_of)
    ct._go(K.exchange_slots, n, ids, firstpos, place_of, slot, first)
    return send_keys, counts, slot, first


def segment_sums(grads, slot, u):
    """(u, dim) float sums of ``grads`` (n, dim) rows by ``slot`` (n,) in ``[0, u)``,
    each from zero in batch order (:func:`jit_kernels.segment.segment_sum`'s bits)."""
    K = ct._kernels()
    out = cuda.device_array((u, grads.shape[1]), grads.dtype)
    if u:
        order, starts = ct.group_positions(slot, u, ct.Scratch())
        ct._go(K.exchange_sums, u * grads.shape[1], grads, order, starts, out)
    return out


def pick(back, slot, first=None):
    """(n,) bool ``back[slot[i]]``; with ``first`` (from :func:`plan`) a repeated key's
    later positions get True (:func:`jit_kernels.exchange.first_flags`)."""
    K = ct._kernels()
    out = cuda.device_array(slot.shape[0], np.bool_)
    only_first = first is not None
    if first is None:
        first = cuda.device_array(0, np.bool_)
    ct._go(K.exchange_pick, slot.shape[0], back, slot, first, only_first, out)
    return out
