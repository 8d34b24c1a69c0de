"""Keras callbacks with Horovod's names (``hvd.callbacks``).

>>> import tf_bridge.distributed as hvd
>>> cb = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
>>> cb.root_rank
0
"""
import keras
import numpy as np

from . import _check_root, allgather_object, broadcast_variables, size

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback"]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Give every rank rank ``root_rank``'s model and optimizer variables: at the start
    of training and again after the first batch (optimizer slots that the first step
    created).  Dynamic tables are not broadcast (their rows are split, not copied)."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = _check_root(root_rank)
        self._done = False

    def _broadcast(self):
        variables = list(self.model.variables)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            variables += list(opt.variables)
        broadcast_variables(variables, self.root_rank)

    def on_train_begin(self, logs=None):
        if not self._done:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self._done:
            self._broadcast()
            self._done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replace every numeric entry of ``logs`` with its
    average over the ranks (validation metrics included).  Every rank must report
    the same metric names."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or size() == 1:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        mine = [float(logs[k]) for k in names]
        every = allgather_object((names, mine))
        if any(n != names for n, _ in every):
            raise ValueError(f"ranks report different metrics: {[n for n, _ in every]}")
        mean = np.mean(np.array([v for _, v in every], np.float64), axis=0)
        for k, m in zip(names, mean):
            logs[k] = float(m)
