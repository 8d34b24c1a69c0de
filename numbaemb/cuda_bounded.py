"""Bounded shards on a CUDA device: :class:`numbaemb.bounded.BoundedRows` over a
:class:`numbaemb.cuda_shard.CudaShard`, driven by :mod:`jit_kernels.cuda_bounded`.

``Variable(dim, device="cuda", max_capacity=N, evict=...)`` builds one.  The index,
the columns (the score column too), ``mscore`` and ``mark`` live in device memory,
and every kernel runs the CPU's body, so a CUDA bounded table holds the keys, rows,
scores and values that a CPU one holds after the same calls.  ``last_evicted``
holds device arrays.  Speed: a call's pass runs on one GPU thread per range of the
index (``bounded_insert_ranges``) when the table is full or the call cannot fill it,
and on one thread for the call that fills it or calls under ``RANGES_MIN`` keys
(unmeasured: no GPU yet).  Hybrid storage (``max_hbm_bytes``) splits every column
but the scores (device memory, beside the index) as on any CUDA shard; admission
filters and ``steps_to_live`` work as on any CUDA table.  With ``evict_window="bucket"``
the index is bucketed and a call runs :mod:`jit_kernels.cuda_buckets` (a thread a
bucket).

Example (needs a GPU or the simulator, so not a doctest)::

    v = ne.Variable(4, device="cuda", max_capacity=1000, evict="lfu")
    out, ev_keys, ev_values = v.find_or_insert(keys, return_evicted=True)
"""
import numpy as np

from jit_kernels import cuda_bounded as kbc
from jit_kernels import cuda_buckets
from jit_kernels import cuda_table as k
from jit_kernels.initializers import ZEROS

from .bounded import SCORE, BoundedRows
from .cuda_shard import CudaShard

__all__ = ["CudaBoundedShard"]


class CudaBoundedShard(BoundedRows, CudaShard):
    """A :class:`CudaShard` that never holds more than ``limit`` keys."""

    _bk = kbc
    _buckets = cuda_buckets         # a bucketed index's (evict_window="bucket")
    _device_columns = (SCORE,)     # hybrid storage: the scores stay beside the index

    def __init__(self, dim, dtype, init, limit, policy, window, init_size=0,
                 device=0, max_hbm_bytes=None):
        self._bounds(limit, policy, window)
        super().__init__(dim, dtype, init, min(int(init_size), self.limit), device,
                         max_hbm_bytes)
        self.add_column(SCORE, 1, np.int64, (ZEROS, 0.0, 0.0, 0, np.zeros(1)))

    # ---- arrays on the device (BoundedRows' hooks) ------------------------------------
    @staticmethod
    def _full(n, value, dtype):
        return k.filled(n, value, dtype)

    _present = staticmethod(kbc.nonneg)

    def _scratches(self):
        if getattr(self, "_bounded_scratch", None) is None:  # the call's, the drivers' three
            self._bounded_scratch = tuple(k.Scratch() for _ in range(4))
        return self._bounded_scratch

    def _driver_kw(self):
        return {"scratch": self._scratches()[1:]}

    def _work(self, name, n, dtype):
        return self._scratches()[0].array(name, n, dtype)

    _host = staticmethod(lambda a: a.copy_to_host())

    @staticmethod
    def _copy(dst, src):
        if dst.shape[0]:
            dst.copy_to_device(src)

    def _take(self, data, rows):
        out = self.cuda.device_array((max(rows.shape[0], 1), data.shape[1]), data.dtype)
        out = out[:rows.shape[0]]
        if rows.shape[0]:
            k.gather(data, rows, out)
        return out

    # ---- operations (on this shard's GPU) -------------------------------------------
    def _insert(self, keys, then=None, scores=None, **kw):
        if scores is not None and not hasattr(scores, "copy_to_host"):
            scores = self.to_device(np.asarray(scores, np.int64))
        return super()._insert(keys, then, scores, **kw)

    def find_or_insert(self, keys, out=None, **kw):
        with self.on():
            return BoundedRows.find_or_insert(self, keys, out, **kw)

    def remove(self, keys):
        with self.on():
            return BoundedRows.remove(self, keys)

    def lookup(self, keys, out, exists):
        with self.on():
            return BoundedRows.lookup(self, keys, out, exists)

    def find_rows(self, keys):
        with self.on():
            return BoundedRows.find_rows(self, keys)

    def accum(self, keys, old, new, exists, **kw):
        """See :meth:`numbaemb.bounded.BoundedShard.accum`: the same plan, each step a
        kernel (groups from ``cuda_table.group_keys``, a thread a group)."""
        n = keys.shape[0]
        if not n:
            return
        with self.on():
            order, starts = k.group_keys(keys)
            g = starts.shape[0] - 1
            present = self._new(n, np.bool_)
            kbc.nonneg(self.find_rows(keys), present)
            touch = self._new(g, np.int64)
            kbc.accum_plan(order, starts, present, exists, touch)
            pos, at = kbc.acting_positions(touch, n)       # in batch order
            acting = self._take(keys.reshape(n, 1), pos).reshape(-1)
            rows, inserted = self._insert(acting, **kw)
            self._init_new(rows, acting, inserted, skip=("values",))
            touch_rows = self._new(g, np.int64)
            kbc.group_rows(touch, at, rows, touch_rows)
            kbc.accum_apply(order, starts, touch, touch_rows, present, self.values, old, new,
                            exists, self._new(n, np.int64), self._new(n, np.bool_))
