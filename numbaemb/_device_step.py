"""``apply_gradients`` on a CUDA variable: the batch's gradient rows summed per id and
the optimizer's row body applied, in one kernel (:func:`jit_kernels.cuda_table.update_rows`).

The steps of :func:`numbaemb.optimizers.apply_gradients`, on the device:

1. group the batch's positions by id, each group in batch order
   (``group_keys`` for a batch with repeats, ``group_positions`` for
   ``inverse=``; ``assume_unique``: no groups);
2. ``find_or_insert`` the distinct ids (new rows get initial values in every
   column, slots included);
3. one kernel: per distinct id, a tile of lanes sums its positions' gradient
   rows from zero in batch order (the bits of the CPU's ``segment_sum``) and
   runs the CPU's own ``*_row`` body on the row and its slots.

A table of several shards (all on the variable's GPU) groups the batch once, then
inserts each shard's distinct ids into it and runs the update kernel on that
shard's columns (the other shards' ids dropped there).  ``delta`` (bp_v2,
:func:`_delta_step`) runs the CPU's algorithm with the same kernel on copies (its
slot reads and writes pass through host memory).  ``initial_rows`` is not used: new rows are drawn again on
the device (the same values: initial values are a function of (seed, key)).
"""
import threading
import weakref

import numpy as np

from . import _checks
from .sharding import default_partitioner, split

_SCRATCH = weakref.WeakKeyDictionary()       # one step scratch per shard (reused buffers)
_SCRATCH_LOCK = threading.Lock()


def _scratch(shard):
    from jit_kernels import cuda_table as k
    with _SCRATCH_LOCK:
        sc = _SCRATCH.get(shard)
        if sc is None:
            sc = _SCRATCH[shard] = k.Scratch()
        return sc


def apply_on_device(variable, optimizer, ids, grads, step, lr, assume_unique, delta, inverse):
    """See :func:`numbaemb.optimizers.apply_gradients` (arguments already checked:
    ``variable``, ``optimizer``, ``step``, ``lr``)."""
    from jit_kernels import cuda_table as k

    from .admission import admitted
    from .expiry import mark_updated
    from .optimizers import _add_slot_columns
    a, dim = variable._arrays, variable.dim
    dtype = _checks.compute_dtype(variable.value_dtype)
    keys, flat = variable._keys(ids, insert=True)
    if inverse is not None:      # checked on the host: ids (u,) distinct, grads per position
        inverse = _checks.as_inverse(a.host(inverse), flat.shape[0], "inverse").reshape(-1)
        g = a.values(grads, (inverse.shape[0],), dim, dtype, "grads")
    else:
        g = a.values(grads, keys.shape, dim, dtype, "grads")
    if flat.shape[0] == 0:
        return
    shard = variable.shards[0]
    sc = _scratch(shard)
    with shard.on():
        if inverse is not None:
            uniq = flat
            order, starts = k.group_positions(a.positions(inverse), flat.shape[0], sc)
        elif assume_unique:
            uniq, order, starts = flat, None, None
        else:
            order, starts = k.group_keys(flat, sc)
            uniq = k.group_heads(flat, order, starts,
                                 a.empty(starts.shape[0] - 1, np.int64))
    owner = _owners(variable, uniq)      # (a bad partitioner raises before any change)
    variable._check_room(uniq)
    if delta:
        _delta_step(variable, optimizer, uniq, owner, g, order, starts, lr, step, dtype, sc)
        return
    name, slots, hyper, flag = optimizer._rule(lr, step, dtype)
    with variable._lock.write():
        # group_keys' groups come in thread order; the CPU inserts (and a filter counts)
        # its distinct ids in first-occurrence order, which a bounded table's evictions
        # and a counter's depend on: those tables take them in that order here too
        sel = None
        if order is not None and inverse is None and (
                variable.max_capacity is not None or variable.admit is not None):
            sel = np.argsort(a.host(order)[a.host(starts)[:-1]], kind="stable")
        ranked = uniq if sel is None else a.take(uniq, a.positions(sel))
        ok = admitted(variable, ranked, ranked)     # ids an admission filter holds back
        _add_slot_columns(variable, optimizer)
        variable._last_step = step
        kw = variable._bound_kw(None, uniq.shape)
        keep = None if ok is None and sel is None else \
            (np.arange(uniq.shape[0]) if sel is None else sel)[slice(None) if ok is None else ok]
        for part, pos in _by_shard(variable, owner, keep, uniq.shape[0]):
            with part.on():
                # new rows: initial values, slots too; rows -1 for the ids not admitted (by
                # the filter, or a bounded table) or of another shard, whose gradients the
                # update kernel drops
                if pos is None:
                    rows, _ = part.find_or_insert(uniq, **kw)
                else:
                    rows = k.filled(uniq.shape[0], -1, np.int64)
                    if pos.shape[0]:
                        at = a.positions(pos)
                        a.put(rows, at, part.find_or_insert(a.take(uniq, at), **kw)[0])
                cols = [part.values] + [part.columns[optimizer.column(s)].data if s else
                                        part.values for s in slots]
                k.update_rows(name, cols, rows, g, order, starts, hyper, flag, sc)
                mark_updated(part, rows, step)          # (steps_to_live tables)


def _owners(variable, uniq):
    """Each distinct id's shard (host int64), None for a table of one shard."""
    if variable.num_shards == 1:
        return None
    owner = np.empty(uniq.shape[0], np.int64)
    for s, pos in enumerate(split(variable._arrays.host(uniq), variable.num_shards,
                                  variable.partitioner or default_partitioner)):
        owner[pos] = s
    return owner


def _by_shard(variable, owner, keep, u):
    """``[(shard, positions of the u distinct ids it inserts, in order)]``: ``keep``
    (host, the positions that may insert, in insert order; None: all, in order) split
    by ``owner`` (:func:`_owners`); positions None: every one, one shard."""
    if owner is None:
        return [(variable.shards[0], keep)]
    keep = np.arange(u) if keep is None else keep
    parts = [keep[owner[keep] == s] for s in range(variable.num_shards)]
    return [(shard, pos) for shard, pos in zip(variable.shards, parts) if pos.shape[0]]


def _parts(variable, owner, uniq):
    """``variable._parts(uniq, uniq)`` from the owners :func:`_owners` found (the
    partitioner is not asked again)."""
    a, out = variable._arrays, []
    for shard, pos in _by_shard(variable, owner, None, uniq.shape[0]):
        at = None if pos is None else a.positions(pos)
        out.append((shard, at, uniq if at is None else a.take(uniq, at)))
    return out


def _delta_step(variable, optimizer, uniq, owner, g, order, starts, lr, step, dtype, sc):
    """``apply_gradients(delta=True)`` (TFRA's bp_v2) on a GPU table, as the CPU's
    ``_apply_delta``: the distinct ids' rows and slots as the step starts (absent:
    initial values), the update kernel on copies of them, the change ``new - old``
    added by ``variable.accum`` (absent ids inserted with ``new``), then the slots set
    for every id present after it."""
    from jit_kernels import cuda_table as k

    from .expiry import mark_updated
    from .optimizers import _add_slot_columns
    a, u, dim = variable._arrays, uniq.shape[0], variable.dim
    name, rule_slots, hyper, flag = optimizer._rule(lr, step, dtype)
    slots = optimizer.slots()
    with variable._lock.write():
        _add_slot_columns(variable, optimizer)
    old, exists = a.empty((u, dim), variable._store), a.empty(u, np.bool_)
    copies = {s: np.empty((u, dim), dtype) for s, _ in slots}
    parts = _parts(variable, owner, uniq)
    with variable._lock.read():             # the rows as the step starts
        for shard, pos, keys in parts:
            o, e = (old, exists) if pos is None else (a.empty((keys.shape[0], dim),
                                                              variable._store),
                                                      a.empty(keys.shape[0], np.bool_))
            shard.lookup(keys, o, e)
            if pos is not None:
                a.put(old, pos, o)
                a.put(exists, pos, e)
            at = slice(None) if pos is None else a.host(pos)
            for s, init in slots:           # absent (or new to the table): initial slots
                found, data = shard.read_rows(optimizer.column(s), keys)
                part = np.full((keys.shape[0], dim), init, dtype)
                part[found] = data
                copies[s][at] = part
    copies = {s: a.from_host(c) for s, c in copies.items()}
    if variable._store != variable.value_dtype:     # 16-bit floats: exact in float32
        old = a.from_host(variable._shown(a.host(old)).astype(dtype))
    new = a.from_host(a.host(old))
    with variable.shards[0].on():
        k.update_rows(name, [new] + [copies[s] if s else new for s in rule_slots],
                      a.from_host(np.arange(u, dtype=np.int64)), g, order, starts, hyper,
                      flag, sc)
    variable.accum(uniq, old, new, exists)
    with variable._lock.write():            # slots are set (last writer wins), as TFRA's
        for shard, pos, keys in parts:
            with shard.on():
                rows = a.host(shard.find_rows(keys))
                hit = np.flatnonzero(rows >= 0)
                at = hit if pos is None else a.host(pos)[hit]
                found = a.from_host(rows[hit])
                mark_updated(shard, found, step)
                for s, _ in slots:
                    k.assign_rows(shard.columns[optimizer.column(s)].data, found,
                                  a.take(copies[s], a.positions(at)), scratch=_scratch(shard))
