"""Lookups of several tables in one kernel call (:func:`lookup_many`).

For a model with many small tables: one parallel kernel looks every table up
(:func:`jit_kernels.multi.lookup_tables`, a table per thread at a time), where
table-by-table calls each pay the Python around a kernel and run serially.
Results are those of :meth:`numbaemb.Variable.lookup` (and of
:func:`jit_kernels.segment.unique_inverse`) table by table, bit for bit.

Only plain tables take this path (:func:`fits`): CPU, one shard, int keys,
32/64-bit values, no key range; the caller looks other tables up one by one.

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

from jit_kernels.multi import lookup_tables

from .bounded import BoundedShard
from .shard import Shard
from .variable import Variable

__all__ = ["lookup_many", "fits", "Looked"]


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
        groups.setdefault(table.value_dtype, []).append(t)
    with contextlib.ExitStack() as stack:
        for table in sorted({id(t): t for t in tables}.values(), key=id):
            stack.enter_context(table._lock.read())
        for group in groups.values():
            _run(group, tables, keys, outs, unique, results)
    return results


def _run(group, tables, keys, outs, unique, results):
    shards = [tables[t].shards[0] for t in group]
    inits = [s.columns["values"].init for s in shards]
    ks = tuple(keys[t] for t in group)
    out = tuple(outs[t] for t in group)
    exists = tuple(np.empty(k.shape[0], np.bool_) for k in ks)
    n = len(group)
    if unique:
        uniq = tuple(np.empty(k.shape[0], np.int64) for k in ks)
        inverse = tuple(np.empty(k.shape[0], np.int64) for k in ks)
        valid = tuple(np.empty(k.shape[0], np.bool_) for k in ks)
        kept = tuple(np.empty_like(o) for o in out)
    else:                          # (unread: typed as the real ones)
        uniq, inverse, valid, kept = ks, ks, exists, out
    n_uniq, n_absent = np.zeros(n, np.int64), np.zeros(n, np.int64)
    lookup_tables(ks, tuple(s.slots for s in shards), np.array([s.mask for s in shards], np.int64),
                  tuple(s.values for s in shards), out, exists,
                  np.array([i[0] for i in inits], np.int64),
                  np.array([i[1] for i in inits], np.float64),
                  np.array([i[2] for i in inits], np.float64),
                  np.array([i[3] for i in inits], np.int64),
                  tuple(np.ascontiguousarray(i[4], np.float64) for i in inits),
                  unique, uniq, inverse, n_uniq, valid, kept, n_absent)
    for j, t in enumerate(group):
        if not unique:
            results[t] = Looked(out[j], exists[j])
            continue
        u = int(n_uniq[j])
        absent = (valid[j][:u], kept[j][:u]) if n_absent[j] else None
        results[t] = Looked(out[j], exists[j], uniq[j][:u], inverse[j], absent)
