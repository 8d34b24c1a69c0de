"""Lookups, and optimizer steps, of several tables in one kernel call (:func:`lookup_many`,
:func:`apply_many`).

For a model with many small tables: one parallel kernel looks every table up
(:func:`jit_kernels.multi.lookup_tables`, a table per thread at a time), or
applies every table's optimizer step (:func:`jit_kernels.multi.apply_tables`),
where table-by-table calls each pay the Python around a kernel and run serially.
Results are those of :meth:`numbaemb.Variable.lookup` (and of
:func:`jit_kernels.segment.unique_inverse`) and of
:func:`numbaemb.optimizers.apply_gradients` table by table, bit for bit.

Only plain tables take this path (:func:`fits`: CPU, one shard, int keys,
32/64-bit values, no key range; to train, :func:`trains_with_others`: also no
bound, admission filter, steps-to-live or ``max_keys``); the caller handles the
other tables one by one.

>>> import numpy as np, numbaemb as ne
>>> a, b = ne.Variable(dim=2, initializer=1.0), ne.Variable(dim=3, initializer=2.0)
>>> a.upsert(np.array([5]), np.array([[9.0, 9.0]]))
>>> res = lookup_many([a, b], [np.array([5, 6, 5]), np.array([1])], unique=True)
>>> res[0].rows.tolist(), res[0].uniq.tolist(), res[0].inverse.tolist()
([[9.0, 9.0], [1.0, 1.0], [9.0, 9.0]], [5, 6], [0, 1, 0])
>>> res[0].absent[0].tolist(), res[1].rows.tolist()      # distinct ids found absent
([False, True], [[2.0, 2.0, 2.0]])
"""
import contextlib
from typing import NamedTuple, Optional

import numpy as np

from jit_kernels.multi import (RULES, addresses, apply_tables, lookup_bucket_tables,
                               lookup_tables)
from jit_kernels.streams import STREAM_MIN

from . import _ahead, _checks
from . import optimizers as opt
from .bounded import BoundedShard
from .shard import Shard
from .variable import Variable

__all__ = ["lookup_many", "apply_many", "fits", "trains_with_others", "Looked"]


class Looked(NamedTuple):
    """One table's result: ``rows`` (n, dim), ``exists`` (n,); with ``unique`` the
    distinct ids ``uniq`` (u,) in first-occurrence order, ``inverse`` (n,) and
    ``absent``: None when every id was found, else ``(valid (u,), rows (u, dim))``,
    the distinct ids found absent and their initial rows (rows of other ids are
    undefined)."""
    rows: np.ndarray
    exists: np.ndarray
    uniq: Optional[np.ndarray] = None
    inverse: Optional[np.ndarray] = None
    absent: Optional[tuple] = None


def fits(table) -> bool:
    """Whether ``table`` can take :func:`lookup_many`'s one-kernel path."""
    return (type(table) is Variable and table.device == "cpu" and table.num_shards == 1
            and type(table.shards[0]) in (Shard, BoundedShard) and table.key_range is None
            and table._store == table.value_dtype and table.value_dtype.itemsize >= 4)


def lookup_many(tables, keys, unique=False, outs=None):
    """Rows of ``keys[t]`` (int arrays, any shape: flattened) in ``tables[t]`` (tables that
    :func:`fits`), every position looked up, absent keys given their initial rows and
    not inserted; with ``unique`` also each batch's distinct ids (see :class:`Looked`).
    ``outs``: optional ``(n_t, dim_t)`` C-contiguous arrays of each table's value
    dtype to write the rows into.  Returns one :class:`Looked` a table.

    Tables of one value dtype go to one kernel call (threads take a table each); the
    tables' read locks are held across it, taken in a fixed order."""
    tables, keys = list(tables), list(keys)
    _ahead.note_multi()                 # a cold start's helper: the step of all tables
    for t, table in enumerate(tables):
        if not fits(table):
            raise ValueError(f"tables[{t}] cannot be looked up with others (a CPU table of one "
                             "shard, int keys, 32/64-bit values, no key range); look it up "
                             "on its own")
    if len(keys) != len(tables):
        raise ValueError(f"keys must have one array per table ({len(tables)}), got {len(keys)}")
    keys = [table._keys(k)[1] for table, k in zip(tables, keys)]       # checked, flat int64
    if outs is None:
        outs = [np.empty((k.shape[0], t.dim), t.value_dtype) for t, k in zip(tables, keys)]
    else:
        outs = [t._out(o, k.shape[0]) for t, o, k in zip(tables, outs, keys)]
    results = [None] * len(tables)
    groups = {}
    for t, table in enumerate(tables):
        bucketed = getattr(table.shards[0], "bucketed", False)     # (a kernel of its own)
        groups.setdefault((table.value_dtype, bucketed), []).append(t)
    with contextlib.ExitStack() as stack:
        for table in sorted({id(t): t for t in tables}.values(), key=id):
            stack.enter_context(table._lock.read())
        for (_, bucketed), group in groups.items():
            _run(group, tables, keys, outs, unique, results, bucketed)
    return results


def _initializer(shard):
    """``(kind, a, b, seed, constants (float64, C-contiguous))`` of ``shard``'s values."""
    kind, a, b, seed, const = shard.columns["values"].init
    return kind, a, b, seed, np.ascontiguousarray(const, np.float64)


def _run(group, tables, keys, outs, unique, results, bucketed):
    per_table, sizes, init = [], [], []
    for t in group:
        s, k, out = tables[t].shards[0], keys[t], outs[t]
        kind, a, b, seed, const = _initializer(s)
        n = k.shape[0]
        exists = np.empty(n, np.bool_)
        if unique:
            extra = [np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.bool_),
                     np.empty_like(out)]
        else:                          # (never touched)
            extra = [k, k, exists, out]
        per_table.append([k, s.slots, s.values, out, exists, const] + extra)
        sizes.append((n, s.dim, s.values.shape[0], s.slots.shape[0], const.shape[0]))
        init.append((s.mask, kind, a, b, seed))
    masks, kinds, a, b, seeds = (np.array(c) for c in zip(*init))
    n_uniq, n_absent = np.zeros(len(group), np.int64), np.zeros(len(group), np.int64)
    kernel = lookup_bucket_tables if bucketed else lookup_tables
    kernel(addresses(per_table), np.array(sizes, np.int64), masks.astype(np.int64),
                  kinds.astype(np.int64), a.astype(np.float64), b.astype(np.float64),
                  seeds.astype(np.int64), unique, n_uniq, n_absent, per_table[0][2][:0],
                  STREAM_MIN)
    for j, t in enumerate(group):
        arrays = per_table[j]
        if not unique:
            results[t] = Looked(arrays[3], arrays[4])
            continue
        u = int(n_uniq[j])
        absent = (arrays[8][:u], arrays[9][:u]) if n_absent[j] else None
        results[t] = Looked(arrays[3], arrays[4], arrays[6][:u], arrays[7], absent)


def trains_with_others(table) -> bool:
    """Whether ``table`` can take :func:`apply_many`'s one-kernel path: it :func:`fits`,
    holds float32/float64 values, and has no bound, admission filter, steps-to-live
    column or ``max_keys``."""
    return (fits(table) and type(table.shards[0]) is Shard and table.admit is None
            and table.steps_to_live is None and table.max_keys is None
            and table.value_dtype in (np.dtype(np.float32), np.dtype(np.float64)))


def apply_many(tables, optimizer, keys, grads, inverse, initial_rows, *, step,
               learning_rate=None):
    """One step of ``optimizer`` on each of ``tables`` (that :func:`trains_with_others`):
    for every ``t``, what ``numbaemb.optimizers.apply_gradients(tables[t], optimizer,
    keys[t], grads[t], step=step, learning_rate=learning_rate, inverse=inverse[t],
    initial_rows=initial_rows[t])`` does, bit for bit, in one kernel call a value dtype.
    ``keys[t]`` (u,) distinct ids, ``grads[t]`` (n, dim) one row per position,
    ``inverse[t]`` (n,) each position's index into ``keys[t]``, ``initial_rows[t]``
    None or ``(rows (u, dim), valid (u,))``.  Arguments are checked before anything is
    applied; the tables' write locks are held across the call, taken in a fixed order.

    >>> import numpy as np, numbaemb as ne
    >>> a, b = ne.Variable(dim=2, initializer=1.0), ne.Variable(dim=1, initializer=0.0)
    >>> apply_many([a, b], ne.optimizers.SGD(0.5), [np.array([7]), np.array([3, 4])],
    ...            [np.ones((2, 2), np.float32), np.ones((1, 1), np.float32)],
    ...            [np.array([0, 0]), np.array([1])], [None, None], step=1)
    >>> a.lookup(np.array([7])).tolist(), b.lookup(np.array([3, 4])).ravel().tolist()
    ([[0.0, 0.0]], [0.0, -0.5])
    """
    tables = list(tables)
    n = len(tables)
    for name, arg in (("keys", keys), ("grads", grads), ("inverse", inverse),
                      ("initial_rows", initial_rows)):
        if len(arg) != n:
            raise ValueError(f"{name} must have one entry per table ({n}), got {len(arg)}")
    seen = {}
    for t, table in enumerate(tables):
        if id(table) in seen:       # (its two steps would run at once, on one table)
            raise ValueError(f"tables[{t}] is tables[{seen[id(table)]}]: a table may be "
                             "stepped once a call")
        seen[id(table)] = t
        if not trains_with_others(table):
            raise ValueError(f"tables[{t}] cannot be trained with others (see "
                             "numbaemb.multi.trains_with_others); apply its step on its own")
        opt._check(table, optimizer)
    step, lr = opt._step_and_rate(optimizer, step, learning_rate)
    work = []
    for t, table in enumerate(tables):
        k = _checks.flat_int64(table._host_keys(keys[t], insert=True, name=f"keys[{t}]"))
        inv, g = opt._position_rows(table, grads[t], inverse[t], k.size, f"[{t}]")
        kept = valid = None
        if initial_rows[t] is not None:
            kept, valid = (np.ascontiguousarray(a) for a in
                           opt._initial_rows(table, initial_rows[t], k.shape, f"[{t}]"))
        work.append((t, k, inv, np.ascontiguousarray(g), kept, valid))
    name, slot_names, hyper, flag = optimizer._rule(lr, step, np.float32)
    init = dict(optimizer.slots())
    s0 = np.array([init[s] if s else 0.0 for s in slot_names], np.float64)
    h = np.zeros(6, np.float64)
    with contextlib.ExitStack() as stack:
        for table in sorted({id(t): t for t in tables}.values(), key=id):
            stack.enter_context(table._lock.write())
        groups = {}
        for item in work:
            table = tables[item[0]]
            opt._add_slot_columns(table, optimizer)
            table._last_step = step
            if item[1].size:
                groups.setdefault(table.value_dtype, []).append(item)
        for dtype, group in groups.items():
            # Adam's step size is computed in the table's dtype (as apply_gradients does)
            hyper = optimizer._rule(lr, step, dtype)[2]
            h[:] = 0.0
            h[:len(hyper)] = hyper
            _apply_group(group, tables, optimizer, name, slot_names, h, flag, s0)


def _apply_group(group, tables, optimizer, rule, slot_names, h, flag, s0):
    shards = [tables[t].shards[0] for t, *_ in group]
    for shard, (_, k, *_) in zip(shards, group):
        shard._reserve(k)                    # room for the absent ids (grows, rehashes)
    per_table, sizes, numbers = [], [], []
    for s, (_, k, inv, g, kept, valid) in zip(shards, group):
        kind, ia, ib, seed, const = _initializer(s)
        cols = [s.columns[optimizer.column(n)].data if n else s.values for n in slot_names]
        if any(c.shape != s.values.shape for c in cols):
            raise RuntimeError("a slot column and the values of a shard differ in shape")
        u = k.shape[0]
        sums = np.empty((u, s.dim), s.values.dtype)
        w0 = np.empty_like(sums)
        inserted = np.empty(u, np.bool_)
        per_table.append([k, inv, g, sums, s.slots, s.free_rows, np.empty(u, np.int64),
                          inserted, s.values, *cols, inserted if valid is None else valid,
                          w0 if kept is None else kept, const, w0])
        sizes.append((u, inv.shape[0], s.dim, s.values.shape[0], s.slots.shape[0],
                      s.free_rows.shape[0], const.shape[0]))
        numbers.append((s.mask, s.fresh, kept is not None, kind, ia, ib, seed))
    masks, fresh, has_kept, kinds, ia, ib, seeds = (np.array(c) for c in zip(*numbers))
    alloc = np.zeros(len(group), np.int64)
    apply_tables(RULES[rule], h, flag, s0, addresses(per_table), np.array(sizes, np.int64),
                 masks.astype(np.int64), fresh.astype(np.int64), alloc, has_kept.astype(np.bool_),
                 kinds.astype(np.int64), ia.astype(np.float64), ib.astype(np.float64),
                 seeds.astype(np.int64), shards[0].values[:0])
    for shard, taken in zip(shards, alloc):
        shard._take_rows(int(taken))
