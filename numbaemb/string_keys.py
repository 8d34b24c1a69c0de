"""String keys: ``Variable(dim, key_dtype="string")`` takes ``bytes`` / ``str`` keys.

Each string gets an int64 *id*, and the table's shards are keyed by ids.  The id of
a string is its FarmHash fingerprint mod ``2**63 - 1`` (level 0: what TensorFlow's
``tf.strings.to_hash_bucket_fast(s, 2**63 - 1)`` computes, so a SavedModel finds it
with stock TF ops), unless another string already holds that id: then it is the
first free id of levels 1, 2, 3 (negative ids from a second, independent hash of
the bytes).  A name index keeps, for every id, the string's bytes (in one byte
arena) and its level-0 id; a lookup compares the bytes on every id match, so two
strings never share a row, and ``export`` returns the original strings.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=2, key_dtype="string")
>>> v.upsert(np.array([b"user:7", b"query"], object), np.ones((2, 2), np.float32))
>>> v.lookup(np.array(["user:7", "nobody"])).tolist()   # str is UTF-8 encoded
[[1.0, 1.0], [0.0, 0.0]]
>>> sorted(v.export()[0].tolist())
[b'query', b'user:7']

Keys may be numpy ``S`` / ``U`` / object arrays or lists of ``bytes`` / ``str``
(numpy ``S`` arrays drop trailing NUL bytes: pass an object array to keep them).
An int64 array addresses rows by id (:meth:`StringVariable.ids`): optimizers and
tf_bridge work on ids after one resolution.  Ops that insert (``upsert``,
``find_or_insert``, ``accum``, ``ids(..., insert=True)``) register new strings;
``remove`` forgets them.  Strings whose id has no row (evicted by ``max_capacity``,
held back by an admission filter, never given a row by an ``accum``) are forgotten
in sweeps after inserting calls, once they outnumber twice the keys plus
``SWEEP_SLACK``; a training lookup's new strings are kept until the sweep after next,
for its optimizer step.  String tables live in one process (not split across MPI
ranks).
"""
import threading
from collections import deque
from typing import NamedTuple

import numpy as np

from jit_kernels.segment import unique_inverse
from jit_kernels.strings import deep_ids, equal_to, gather_bytes, level0_ids, pack

from . import _checks
from ._lock import RWLock

__all__ = ["StringKeys", "StringVariable", "Packed", "as_strings", "LEVELS"]

LEVELS = 4                   # candidate ids per string; all taken is a ValueError
SWEEP_SLACK = 4096           # names without a row tolerated beyond the table's keys
RECENT_CALLS = 4             # registering calls whose new strings a sweep spares
_COMPACT_MIN = 1 << 20       # arena garbage below this is never compacted


class Packed(NamedTuple):
    """String keys already in one buffer: string ``i`` of the row-major ``shape`` is
    ``buf[starts[i]:starts[i + 1]]`` (``buf`` uint8, ``starts`` int64 ``(n + 1,)``).
    Every op of a string table takes it where it takes keys: no Python object per
    string (tf_bridge hands TensorFlow's string tensors over this way).

    >>> import numpy as np
    >>> p = Packed(np.frombuffer(b"abcd", np.uint8), np.array([0, 1, 4]), (2,))
    >>> as_strings(p)[0]
    (2,)
    """
    buf: np.ndarray
    starts: np.ndarray
    shape: tuple

    @classmethod
    def from_lengths(cls, joined, lengths):
        """From the strings' bytes back to back (``bytes`` or a uint8 array) and their
        lengths (an int array of the keys' shape)."""
        lengths = np.asarray(lengths)
        starts = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths.reshape(-1), out=starts[1:])
        buf = np.frombuffer(joined, np.uint8) if isinstance(joined, bytes) else joined
        if buf.shape[0] != starts[-1]:
            raise ValueError(f"packed strings: {buf.shape[0]} bytes, lengths add up to "
                             f"{starts[-1]}")
        return cls(buf, starts, lengths.shape)


def as_strings(keys, name="keys"):
    """``(shape, buf, starts)`` of string ``keys`` (numpy ``S``/``U``/object array, a
    sequence of ``bytes`` / ``str``, or :class:`Packed`); DtypeError for anything else."""
    if isinstance(keys, Packed):
        return tuple(keys.shape), keys.buf, keys.starts
    if isinstance(keys, (bytes, str)):
        keys = [keys]
    arr = np.asarray(keys, dtype=object) if isinstance(keys, (list, tuple)) else np.asarray(keys)
    if arr.dtype.kind not in "SUO":
        raise _checks.DtypeError(f"{name} must hold strings (bytes or str) for a string-key "
                                 f"table, got dtype {arr.dtype}")
    try:
        buf, starts = pack(arr.reshape(-1))
    except TypeError as e:
        raise _checks.DtypeError(f"{name}: {e}") from None
    except ValueError as e:         # a str UTF-8 cannot encode
        raise ValueError(f"{name}: {e}") from None
    return arr.shape, buf, starts


def _unique_first(keys):
    """``(uniq, inverse, first)``: distinct int64 ``keys`` in first-occurrence order,
    each position's index into them, and where each first occurs (hash based)."""
    uniq, inverse = unique_inverse(keys)
    fresh = np.ones(inverse.shape[0], np.bool_)      # first-occurrence order: a first
    if fresh.shape[0]:                                # occurrence tops every index before it
        fresh[1:] = inverse[1:] > np.maximum.accumulate(inverse)[:-1]
    return uniq, inverse, np.flatnonzero(fresh)


def split_bytes(buf, starts):
    """An object array of ``bytes`` from ``(buf, starts)`` (C-level loops only)."""
    data = buf.tobytes()
    out = np.empty(starts.shape[0] - 1, object)
    out[:] = list(map(data.__getitem__, map(slice, starts[:-1].tolist(), starts[1:].tolist())))
    return out


class StringKeys:
    """The name index of a string table: string ``<->`` int64 id (see the module doc).

    Thread safety: resolutions that register run alone; the others run together."""

    def __init__(self):
        from .variable import Variable
        # id -> (arena offset, length, level-0 id)
        self._spans = Variable(3, value_dtype=np.int64, name=None)
        self._arena = np.empty(1 << 12, np.uint8)
        self._used = 0
        self._garbage = 0
        self._deep = {}                      # level-0 id -> names living at levels >= 1
        self._deep_arr = np.empty(0, np.int64)
        # the ids of the last registering calls since the last sweep, and before it (a
        # few calls: an unbounded table, which never sweeps, keeps no more)
        self._fresh, self._older = deque(maxlen=RECENT_CALLS), deque(maxlen=RECENT_CALLS)
        self._lock = RWLock()

    def __len__(self):
        return self._spans.size()

    def ids(self):
        """Every registered id (int64, no order)."""
        with self._lock.read():
            return self._spans.export()[0]

    @property
    def nbytes(self):
        """Bytes held: the arena and the index's rows (approximate)."""
        return int(self._arena.nbytes + 48 * len(self))

    # ---- resolution ----------------------------------------------------------------------
    def resolve(self, buf, starts, insert=False):
        """``(ids, found)`` of the strings ``(buf, starts)``.  Absent strings get the id
        they would be registered under (an id no string holds); ``insert`` registers
        them."""
        fp0 = level0_ids(buf, starts)
        which = np.arange(fp0.shape[0])
        if not insert:
            with self._lock.read():
                return self._find(buf, starts, which, fp0)
        with self._lock.write():
            return self._register(buf, starts, which, fp0)

    def _find(self, buf, starts, which, fp0):
        n = which.shape[0]
        ids, found = fp0[which].copy(), np.zeros(n, np.bool_)
        free, has_free = np.empty(n, np.int64), np.zeros(n, np.bool_)
        pending, cand = np.arange(n), ids.copy()
        for level in range(LEVELS):
            spans, ex = self._spans.lookup(cand, return_exists=True)
            eq = equal_to(buf, starts, which[pending], self._arena, spans, ex)
            hit = pending[eq]
            ids[hit], found[hit] = cand[eq], True
            fr = ~ex & ~has_free[pending]
            free[pending[fr]], has_free[pending[fr]] = cand[fr], True
            # go deeper: the id is another string's, or the string may live deeper
            more = ~eq & ex
            if self._deep_arr.shape[0]:
                more |= ~eq & np.isin(fp0[which[pending]], self._deep_arr)
            pending = pending[more]
            if not pending.shape[0]:
                break
            cand = deep_ids(buf, starts, which[pending], level + 1)
        absent = ~found
        if not has_free[absent].all():
            raise ValueError(f"a string key's {LEVELS} candidate ids are all held by other "
                             "strings (a chance below 2**-180 per key); nothing was changed")
        ids[absent] = free[absent]
        return ids, found

    def _register(self, buf, starts, which, fp0):
        ids, found = self._find(buf, starts, which, fp0)
        new = np.flatnonzero(~found)
        if not new.shape[0]:
            return ids, found
        cand = ids[new]
        uniq, inv, first = _unique_first(cand)
        reps = which[new[first]]
        # in-batch collisions: another string of the batch has the same candidate id
        rep_spans = np.stack([starts[reps], starts[reps + 1] - starts[reps]], 1)[inv]
        same = equal_to(buf, starts, which[new], buf, rep_spans, np.ones(new.shape[0], np.bool_))
        self._add(buf, starts, reps, uniq, fp0[reps])
        other = new[~same]
        if other.shape[0]:            # their candidate is now held: they go deeper
            ids[other], _ = self._register(buf, starts, which[other], fp0)
        return ids, found

    def _add(self, buf, starts, rows, ids, fp0):
        lens = starts[rows + 1] - starts[rows]
        chunk, local = gather_bytes(buf, starts[rows], lens)
        need = self._used + chunk.shape[0]
        if need > self._arena.shape[0]:
            grown = np.empty(max(need, 2 * self._arena.shape[0]), np.uint8)
            grown[:self._used] = self._arena[:self._used]
            self._arena = grown
        self._arena[self._used:need] = chunk
        spans = np.stack([self._used + local[:-1], lens, fp0], 1)
        self._used = need
        self._spans.upsert(ids, spans)
        self._count_deep(fp0[ids < 0], +1)
        self._fresh.append(ids.copy())

    def _count_deep(self, fp0, sign):
        if not fp0.shape[0]:
            return
        for f in fp0.tolist():                 # only strings off level 0: rare
            c = self._deep.get(f, 0) + sign
            if c:
                self._deep[f] = c
            else:
                self._deep.pop(f, None)
        self._deep_arr = np.array(sorted(self._deep), np.int64)

    def check_registered(self, ids, name="ids"):
        """ValueError unless every id of ``ids`` (int64 array) belongs to a string: a
        row inserted by id must have a name (a string removed since its id was
        resolved has none)."""
        with self._lock.read():
            known = self._spans.lookup(ids.reshape(-1), return_exists=True)[1]
        if not known.all():
            bad = ids.reshape(-1)[~known][:3].tolist()
            raise ValueError(f"{name}: {int((~known).sum())} ids of this string table belong "
                             f"to no string (e.g. {bad}); resolve strings with ids(..., "
                             "insert=True) first (a string removed since its id was resolved "
                             "loses its id); nothing was changed")

    # ---- names -------------------------------------------------------------------------
    def strings(self, ids):
        """The strings of ``ids`` (int64, each registered): an object array of bytes."""
        with self._lock.read():
            spans, ex = self._spans.lookup(np.asarray(ids, np.int64).reshape(-1),
                                           return_exists=True)
            if not ex.all():
                raise KeyError(f"{int((~ex).sum())} ids have no registered string")
            buf, starts = gather_bytes(self._arena, spans[:, 0], spans[:, 1])
        return split_bytes(buf, starts)

    def drop(self, ids):
        """Forget the strings of ``ids`` (unknown ids are ignored)."""
        with self._lock.write():
            self._drop(np.asarray(ids, np.int64).reshape(-1))

    def sweep(self, rowless, protect=True):
        """Forget the strings of ``rowless`` (ids without a row), but (``protect``) those
        the last ``RECENT_CALLS`` registering calls before this sweep and before the one
        before registered: a training lookup's new strings wait for its optimizer step.
        Returns how many were forgotten."""
        with self._lock.write():
            recent = [*self._fresh, *self._older]
            if protect and recent:
                rowless = rowless[~np.isin(rowless, np.concatenate(recent))]
            self._older, self._fresh = self._fresh, deque(maxlen=RECENT_CALLS)
            return self._drop(rowless)

    def _drop(self, ids):
        spans, ex = self._spans.lookup(ids, return_exists=True)
        ids, spans = ids[ex], spans[ex]
        ids, _, keep = _unique_first(ids)
        spans = spans[keep]
        self._spans.remove(ids)
        self._garbage += int(spans[:, 1].sum())
        self._count_deep(spans[ids < 0, 2], -1)
        if self._garbage > max(_COMPACT_MIN, self._used // 2):
            self._compact()
        return ids.shape[0]

    def _compact(self):
        ids, spans = self._spans.export()
        buf, starts = gather_bytes(self._arena, spans[:, 0], spans[:, 1])
        self._arena = np.empty(max(1 << 12, 2 * buf.shape[0]), np.uint8)
        self._arena[:buf.shape[0]] = buf
        self._used, self._garbage = buf.shape[0], 0
        spans[:, 0] = starts[:-1]
        self._spans.upsert(ids, spans)

    def clear(self):
        with self._lock.write():
            self.__init__()

    # ---- state (checkpoints) ---------------------------------------------------------------
    def state(self, ids):
        """``(buf, starts)`` of the strings of ``ids``, for a checkpoint."""
        with self._lock.read():
            spans, ex = self._spans.lookup(np.asarray(ids, np.int64), return_exists=True)
            if not ex.all():
                raise KeyError(f"{int((~ex).sum())} ids have no registered string")
            return gather_bytes(self._arena, spans[:, 0], spans[:, 1])

    def restore(self, ids, buf, starts):
        """Register string ``i`` of ``(buf, starts)`` under ``ids[i]`` (a checkpoint's
        assignment).  ValueError if an id cannot be that string's (a level-0 id that is
        not its fingerprint) or is repeated."""
        ids = np.asarray(ids, np.int64)
        if ids.shape[0] != starts.shape[0] - 1 or np.unique(ids).shape[0] != ids.shape[0]:
            raise ValueError("string ids must be distinct, one per string")
        fp0 = level0_ids(buf, starts)
        if (ids[ids >= 0] != fp0[ids >= 0]).any():
            raise ValueError("a level-0 string id does not match its string's fingerprint")
        with self._lock.write():
            self._add(buf, starts, np.arange(ids.shape[0]), ids, fp0)


def _variable_base():
    from .variable import Variable
    return Variable


class StringVariable(_variable_base()):
    """A :class:`numbaemb.Variable` with string keys (made by ``Variable(...,
    key_dtype="string")``); see the module doc.  ``names`` is its :class:`StringKeys`."""

    def __init__(self, dim, **kwargs):
        super().__init__(dim, **kwargs)
        self.names = StringKeys()
        self._mutate = threading.RLock()    # (a sweep takes it inside an inserting call)

    @property
    def _id_dtype(self):
        return np.dtype(np.int64)

    def _keys(self, keys, insert=False):
        ids = self._host_keys(keys, insert)
        return super()._keys(ids)

    def _host_keys(self, keys, insert=False, name="keys"):
        if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
            ids = super()._host_keys(keys, name=name)       # ids
            if insert:
                self.names.check_registered(ids, name)
            return ids
        shape, buf, starts = as_strings(keys, name)
        return self.names.resolve(buf, starts, insert)[0].reshape(shape)

    def ids(self, keys, insert=False):
        """The int64 ids of string ``keys`` (shape kept): the ids rows are stored under;
        an absent string gets the id it would be inserted under (``insert`` registers
        it, so later int64 ops on that id belong to the string)."""
        return self._keys(keys, insert)[0]

    def export(self, column="values"):
        """All keys (an object array of ``bytes``) and their rows, shard by shard."""
        with self._lock.read():
            ids, rows = self._export(column)
            return self.names.strings(ids), rows

    # A string's registration and its row's insert or removal happen under one mutex, so
    # a concurrent remove cannot drop a name whose row is being inserted.
    def upsert(self, keys, values, scores=None):
        with self._mutate:
            super().upsert(keys, values, scores=scores)
            self._sweep_names()

    def find_or_insert(self, keys, return_exists=False, **kwargs):
        """:meth:`numbaemb.Variable.find_or_insert`; ``return_evicted``'s keys are the
        evicted strings (an object array of bytes)."""
        with self._mutate:
            out = super().find_or_insert(keys, return_exists, **kwargs)
            if kwargs.get("return_evicted"):
                at = 2 if return_exists else 1
                out = (*out[:at], self.names.strings(self._arrays.host(out[at])),
                       *out[at + 1:])
            self._sweep_names()
            return out

    def accum(self, keys, old_values, new_values, exists):
        with self._mutate:
            super().accum(keys, old_values, new_values, exists)
            self._sweep_names()

    def _sweep_names(self, force=False):
        """Forget the strings whose id has no row (evicted by a bounded table, held back
        by an admission filter, left out of a load) once the names outnumber twice the
        keys plus ``SWEEP_SLACK`` (or ``force``): a pass over the names, amortised over
        the registrations since the last.  Runs after an inserting call (and
        ``numbaemb.optimizers.apply_gradients``); the strings registered since the sweep
        before are kept (:meth:`StringKeys.sweep`) unless ``force``."""
        if len(self.names) <= (self.size() if force else 2 * self.size() + SWEEP_SLACK):
            return 0
        # (_mutate: not between another call's registration of strings and its insert)
        with self._mutate, self._lock.write():
            ids = self.names.ids()
            have = self._present(*super()._keys(ids))
            return self.names.sweep(ids[~have], protect=not force)

    def remove(self, keys):
        with self._mutate:
            keys, flat = self._keys(keys)
            with self._lock.write():
                for shard, _, k in self._parts(keys, flat):
                    shard.remove(k)
                self.names.drop(flat)

    def clear(self):
        with self._mutate, self._lock.write():
            for s in self.shards:
                s.clear()
            self.names.clear()
