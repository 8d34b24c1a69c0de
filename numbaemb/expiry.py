"""Dropping stale and small rows: DeepRec's ``steps_to_live`` and L2-norm threshold.

``Variable(dim, steps_to_live=N)`` keeps, per key, the optimizer step that last
updated it (a row-aligned ``updated_step`` column: checkpointed with the rest,
0 for keys no step has updated yet).  :func:`expire` removes, in one pass over
the index, every key not updated in the last N steps; call it when you choose
(every step, every K steps), between training steps: a key a concurrent step
updates after the pass read it is still removed.  :func:`prune_small` removes the
keys whose row's L2 norm is below a threshold.  Removed keys leave with every
column.  CPU and CUDA tables alike (:mod:`jit_kernels.cuda_columns` runs the CPU's
per-slot bodies on the device).

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=1, steps_to_live=2)
>>> for step, ids in enumerate([[1, 2], [2], [2], [3]], start=1):
...     ne.optimizers.apply_gradients(v, ne.optimizers.SGD(0.1), np.array(ids),
...                                   np.ones((len(ids), 1)), step=step)
>>> expire(v), sorted(v.export()[0].tolist())     # 1: last updated at step 1 of 4
(1, [2, 3])
"""
import numpy as np

from jit_kernels import columns as k
from jit_kernels.initializers import ZEROS

from . import _checks

__all__ = ["expire", "prune_small", "STEP"]

STEP = "updated_step"


def add_step_column(variable):
    """Create the ``updated_step`` column on every shard (``steps_to_live`` tables)."""
    for shard in variable.shards:
        if STEP not in shard.columns:
            shard.add_column(STEP, 1, np.int64, (ZEROS, 0.0, 0.0, 0, np.zeros(1)))


def _on_gpu(shard):
    return hasattr(shard, "cuda")       # a CudaShard: jit_kernels.cuda_columns' drivers


def mark_updated(shard, rows, step):
    """``updated_step`` of ``rows`` = ``step`` (an optimizer step, caller holds the lock;
    rows -1 are skipped)."""
    col = shard.columns.get(STEP)
    if col is not None:
        if _on_gpu(shard):
            from jit_kernels import cuda_columns
            cuda_columns.set_rows(col.data, rows, step)
        else:
            k.set_rows(col.data, rows, step)


def _pick(shard, name, *args):
    """The keys (host int64) that ``name`` (a pass of :mod:`jit_kernels.columns`, on the
    CPU or the shard's GPU) picks from ``shard``'s index, in slot order."""
    if _on_gpu(shard):
        from jit_kernels import cuda_columns
        with shard.on():
            out = shard.cuda.device_array(shard.capacity, np.int64)
            n = getattr(cuda_columns, name)(shard.slots, *args, out)
            return out.copy_to_host()[:n]
    out = np.empty(shard.capacity, np.int64)
    return out[:getattr(k, name)(shard.slots, *args, out)]


def _remove_picked(variable, pick):
    """Remove the keys ``pick(shard) -> keys`` chooses in each shard (one pass over its
    index, under the read lock), through ``variable.remove`` (which also forgets a
    string table's names).  Returns how many were removed.  On a table split across MPI
    ranks this is not collective: each rank removes the keys it owns."""
    with variable._lock.read():
        picked = [pick(shard) for shard in variable.shards]
    keys = np.concatenate(picked) if picked else np.empty(0, np.int64)
    if keys.shape[0]:        # a split table's keys are this rank's own: removed locally
        getattr(variable, "local", variable).remove(keys.astype(variable._id_dtype, copy=False))
    return int(keys.shape[0])


def expire(variable, step=None):
    """Remove the keys that no optimizer step updated in the last ``steps_to_live``
    steps before ``step`` (default: the variable's last optimizer step): those whose
    ``updated_step <= step - steps_to_live``.  Returns how many were removed."""
    ttl = getattr(variable, "steps_to_live", None)
    if ttl is None:
        raise ValueError("expire needs a table made with steps_to_live")
    step = variable._last_step if step is None else _checks.positive_int(step, "step", 0)
    threshold = step - ttl + 1

    return _remove_picked(variable, lambda shard: _pick(
        shard, "keys_below", shard.columns[STEP].data, np.int64(threshold)))


def prune_small(variable, min_norm):
    """Remove the keys whose row (``values``) has an L2 norm below ``min_norm``; returns
    how many were removed."""
    if isinstance(min_norm, (bool, np.bool_)) or \
            not isinstance(min_norm, (int, float, np.integer, np.floating)):
        raise TypeError(f"min_norm must be a number, got {type(min_norm).__name__}")
    min_norm = float(min_norm)
    if not min_norm >= 0.0:
        raise ValueError(f"min_norm must be a number >= 0, got {min_norm}")

    return _remove_picked(variable, lambda shard: _pick(
        shard, "keys_with_small_rows", shard.values, min_norm ** 2))
