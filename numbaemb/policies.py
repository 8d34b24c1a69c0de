"""Restrict policies: bound a variable's size by evicting stale or rare keys.

The admission filters (:mod:`numbaemb.admission`) are here too, under the names
``ne.policies.CounterFilter``, ``BloomFilter`` and ``RandomFilter``.

A policy keeps one int64 score per key in a column that shares the key's row,
so evicting a key removes its embedding and every optimizer slot together.
Call ``update(ids)`` for the ids a training step touched (the TF optimizer
wrapper does this), then ``apply_restriction(num_reserved, trigger)``.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=2)
>>> p = ne.policies.TimestampRestrictPolicy(v)
>>> _ = v.find_or_insert(np.array([1, 2, 3])); p.update(np.array([1, 2, 3]))
>>> _ = v.find_or_insert(np.array([3])); p.update(np.array([3]))     # 3 is the most recent
>>> p.apply_restriction(1), sorted(v.export()[0].tolist())
(2, [3])
"""
import numba
import numpy as np

from jit_kernels import columns as k
from jit_kernels.initializers import ZEROS

from .admission import BloomFilter, CounterFilter, RandomFilter

__all__ = ["RestrictPolicy", "TimestampRestrictPolicy", "FrequencyRestrictPolicy",
           "CounterFilter", "BloomFilter", "RandomFilter"]


class RestrictPolicy:
    """Base: owns the score column ``"policy/<name>"`` on every shard."""

    column = None

    def __init__(self, variable):
        self.variable = variable
        init = (ZEROS, 0.0, 0.0, 0, np.zeros(1))
        with variable._lock.write():
            for shard in variable.shards:
                if self.column not in shard.columns:
                    shard.add_column(self.column, 1, np.int64, init)

    def update(self, ids, once=False):
        """Record that ``ids`` (any shape) were used; absent ids are ignored.

        ``once``: each distinct id of the call counts once (else every occurrence).
        On a variable split across ranks (``comm=``) this is collective: every rank
        calls it with its own ids, and each owner records what the ranks sent, in
        rank order (``once``: each id once, whichever ranks sent it)."""
        v = self.variable
        if getattr(v, "world_size", 1) > 1:
            v._on_owners("policy_update", ids, lambda k: self._record(v.local, k, once),
                         unique=once)
        else:
            self._record(v, ids, once)

    def _record(self, variable, ids, once):
        keys, flat = variable._keys(ids)
        if once:
            keys = flat = np.unique(flat)
        with variable._lock.write():
            for shard, _, part in variable._parts(keys, flat):
                self._score(shard.columns[self.column].data, shard.find_rows(part))

    def _score(self, col, rows):
        raise NotImplementedError

    def apply_restriction(self, num_reserved, trigger=None):
        """Keep the ``num_reserved`` best-scored keys when size exceeds ``trigger``.

        ``trigger`` defaults to ``num_reserved``.  Returns how many keys were removed.
        Ties are broken by slot order, so the result is deterministic.
        """
        if isinstance(num_reserved, bool) or not isinstance(num_reserved, (int, np.integer)) \
                or num_reserved < 0:
            raise ValueError(f"num_reserved must be an int >= 0, got {num_reserved!r}")
        trigger = num_reserved if trigger is None else trigger
        if isinstance(trigger, bool) or not isinstance(trigger, (int, np.integer)) or trigger < num_reserved:
            raise ValueError(f"trigger must be an int >= num_reserved ({num_reserved}), got {trigger!r}")
        v = self.variable
        size = v.size()
        if size <= trigger:
            return 0
        keep = num_reserved
        split = getattr(v, "world_size", 1) > 1
        if split:             # each rank keeps its share, as TFRA's partitions do
            keep = num_reserved // v.world_size + (v.rank < num_reserved % v.world_size)
        keys, scores = v.export(self.column)
        drop = keys[np.argsort(scores[:, 0], kind="stable")[:max(keys.shape[0] - keep, 0)]]
        v.remove(drop)
        return size - v.size() if split else int(drop.shape[0])


class TimestampRestrictPolicy(RestrictPolicy):
    """Evict the keys used least recently (a logical clock ticks once per ``update``)."""

    column = "policy/timestamp"

    def __init__(self, variable):
        super().__init__(variable)
        self.clock = 0

    def _score(self, col, rows):
        k.set_rows(col, rows, self.clock + 1)

    def update(self, ids, once=False):
        super().update(ids, once)
        self.clock += 1

    def resume(self, scores, comm=None):
        """After a restore: set the clock so later updates score above every restored
        key, ``scores`` (int64, any shape) being the restored column; with ``comm`` (an
        MPI communicator; collective) above every rank's."""
        top = int(np.max(scores)) if np.size(scores) else 0
        self.clock = max(comm.allgather(top)) if comm is not None else top


class FrequencyRestrictPolicy(RestrictPolicy):
    """Evict the keys used least often (each occurrence counts)."""

    column = "policy/frequency"

    def _score(self, col, rows):
        k.count_rows(col, rows, numba.get_num_threads())
