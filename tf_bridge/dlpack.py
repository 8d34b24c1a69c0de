"""Zero-copy hand-off between numpy and TensorFlow on the CPU, through DLPack.

* ``to_tf(array)``: numpy -> ``tf.Tensor`` sharing the buffer.  TensorFlow
  aborts the process on a buffer that is not 64-byte aligned, so an array that
  is not aligned, not C-contiguous or read-only is first copied into an aligned
  buffer (counted in ``STATS``); ``tf.experimental.dlpack.from_dlpack`` never
  sees anything else.  TF takes only the unversioned capsule (``__dlpack__()``).
* ``from_tf(tensor)``: ``tf.Tensor`` -> read-only numpy view (``np.from_dlpack``).
  String tensors (no DLPack for them) come and go as object arrays of ``bytes``,
  copied; bfloat16 ones (not in DLPack either) as their bits (int16, zero-copy),
  seen as ``ml_dtypes.bfloat16``.
* ``numpy_call(fn, inputs, tout)``: run a numpy function on tensors; eagerly it
  goes through DLPack, inside ``tf.function`` through ``tf.numpy_function``
  (which hands its inputs over without a copy and keeps 64-byte aligned
  C-contiguous outputs without a copy, so outputs are aligned first).

>>> import numpy as np
>>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
>>> t = to_tf(a)
>>> t.shape, bool(from_tf(t).ctypes.data % 64 == 0)
(TensorShape([2, 3]), True)
"""
import threading
import weakref
from dataclasses import dataclass, fields

import numpy as np
import tensorflow as tf

from numbaemb import aligned_empty, is_aligned

__all__ = ["to_tf", "from_tf", "aligned", "numpy_call", "STATS", "reset_stats"]

_tf_from_dlpack = tf.experimental.dlpack.from_dlpack     # module attribute: tests spy on it
_BF16 = np.dtype(tf.bfloat16.as_numpy_dtype)              # ml_dtypes.bfloat16


@dataclass
class CopyStats:
    """Counts of hand-offs and of the copies they needed (process-wide)."""
    to_tf: int = 0            # arrays handed to TF (to_tf, or returned from numpy_call)
    to_tf_copies: int = 0     # ... that had to be copied into an aligned buffer first
    from_tf: int = 0          # tensors viewed as numpy
    from_tf_copies: int = 0   # ... that had to be copied (not on the CPU)

    def as_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


STATS = CopyStats()
_lock = threading.Lock()


def _count(name):
    with _lock:
        setattr(STATS, name, getattr(STATS, name) + 1)


def reset_stats():
    """Zero every counter of ``STATS``."""
    with _lock:
        for f in fields(STATS):
            setattr(STATS, f.name, 0)


def aligned(array) -> np.ndarray:
    """``array`` itself when it is 64-byte aligned, C-contiguous and writable (or empty),
    else an aligned copy (counted as a copy in ``STATS.to_tf_copies``)."""
    arr = np.asarray(array)
    if arr.dtype.kind in "OSU":      # strings: TF copies them whatever we do
        return arr
    _count("to_tf")
    if arr.size == 0 or (arr.flags.c_contiguous and arr.flags.writeable and is_aligned(arr)):
        return arr
    _count("to_tf_copies")
    out = aligned_empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


def to_tf(array) -> tf.Tensor:
    """A CPU ``tf.Tensor`` over ``array``'s buffer (after ``aligned``: never unaligned).

    The tensor keeps the buffer alive; do not write to ``array`` afterwards.
    """
    arr = aligned(array)
    if arr.dtype.kind in "OSU":      # strings (bytes): no DLPack for them, TF copies
        return tf.constant(arr, tf.string)
    if arr.dtype == _BF16:           # no bfloat16 in DLPack: its bits go, as int16
        return tf.bitcast(to_tf(arr.view(np.int16)), tf.bfloat16)
    if arr.size == 0:              # no buffer to share (and numpy's may be unaligned)
        return tf.zeros(arr.shape, tf.as_dtype(arr.dtype))
    assert arr.ctypes.data % 64 == 0 and arr.flags.c_contiguous
    return _tf_from_dlpack(arr.__dlpack__())


def from_tf(tensor) -> np.ndarray:
    """A read-only numpy view of an eager CPU tensor (a copy for other devices).

    numpy arrays pass through unchanged; other Python values go through ``np.asarray``.
    """
    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, tf.Variable):
        tensor = tensor.read_value()
    if not isinstance(tensor, tf.Tensor):
        return np.asarray(tensor)
    if tensor.dtype == tf.string:    # no DLPack for strings: an object array of bytes
        return tensor.numpy()
    if tensor.dtype == tf.bfloat16:  # no bfloat16 in DLPack: its bits, seen as bfloat16
        return from_tf(tf.bitcast(tensor, tf.int16)).view(_BF16)
    _count("from_tf")
    if "CPU" not in tensor.device.upper():
        _count("from_tf_copies")
        with tf.device("/CPU:0"):
            tensor = tf.identity(tensor)
    return np.from_dlpack(tensor)


# per graph, the last collective op created in it (see numpy_call(collective=True))
_LAST_COLLECTIVE = weakref.WeakKeyDictionary()


def numpy_call(fn, inputs, tout, name=None, collective=False, stateful=True):
    """``fn(*arrays) -> tuple of arrays`` applied to tensors; returns a list of tensors.

    Eager: inputs are numpy views (``from_tf``), outputs go out through ``to_tf``.
    In a graph: one stateful ``tf.numpy_function`` op (outputs of unknown shape;
    callers set static shapes).  ``fn`` must not write into its inputs.

    ``collective``: ``fn`` talks to the other MPI ranks (a distributed table's
    exchange, an allreduce).  Such calls must run in the same order on every rank,
    so in a graph each gets a control dependency on the previous collective call
    created in the same graph: TensorFlow then runs them one at a time, in program
    order, whatever it runs concurrently around them.  Eagerly, calls run in
    program order anyway.  (With no outputs the op itself is returned.)

    ``stateful=False``: ``fn`` is a pure function of its inputs, so a graph may skip
    the op when nothing uses its outputs (a ``tf.function`` prunes it).
    """
    if tf.executing_eagerly():
        outs = fn(*[from_tf(x) for x in inputs])
        return [to_tf(o) for o in outs]

    def run(*arrays):
        return [aligned(o) for o in fn(*arrays)]

    if not collective:
        return tf.numpy_function(run, list(inputs), list(tout), stateful=stateful, name=name)
    graph = tf.compat.v1.get_default_graph()
    last = _LAST_COLLECTIVE.get(graph)
    with tf.control_dependencies([last] if last is not None else []):
        out = tf.numpy_function(run, list(inputs), list(tout), stateful=True, name=name)
    _LAST_COLLECTIVE[graph] = out if isinstance(out, tf.Operation) else out[0].op
    return out
