"""Horovod's names over MPI: ``from tf_bridge import distributed as hvd``.

Data-parallel dense layers (gradients averaged over the ranks) and model-parallel
dynamic tables (each id's row on rank ``id mod size``), the way SOK and TFRA
users train under Horovod, on ``mpi4py`` with nothing to compile::

    import tensorflow as tf, tf_bridge as de
    from tf_bridge import distributed as hvd
    hvd.init()                                   # world size 1 without mpiexec
    emb = de.keras.layers.Embedding(16, name="item", distributed=True)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3))
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)     # dense grads averaged, table grads / size
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables))   # table rows updated on their owners
    hvd.broadcast_variables(model.variables, root_rank=0)

Run ``mpiexec -n 2 python -m mpi4py train.py``.  Every rank must run the same
program: the same tables created in the same order, the same number of steps.

**Collective order.**  Every collective (a distributed table's lookup or optimizer
step, an allreduce, a broadcast) is one ``tf.numpy_function`` op, and inside a
graph each is created with a control dependency on the previous collective of
the same graph (:func:`tf_bridge.dlpack.numpy_call` with ``collective=True``), so
TensorFlow runs them one at a time in the order the program created them, on
every rank alike, however many tables a step has and whatever else runs
concurrently (``tf.data`` prefetching, independent ops).  (Inside
``tf.function`` TF's automatic control dependencies order stateful ops too;
the explicit chain also holds in TF1 graphs and does not rely on that.)  Every collective opens
with a small header exchange: ranks that reach different collectives, or the
same one with different shapes, raise ``CollectiveMismatch`` (a ``ValueError``)
on every rank instead of hanging.

**Gradients of tables.**  A distributed lookup sends each distinct id to its
owner and brings its row back; its gradient stays keyed by this rank's ids.  The
optimizer step (``de.DynamicEmbeddingOptimizer``) sends each id's summed gradient
to its owner, which sums what every rank sent and applies one update per id.
With ``op=Average`` (the default) ``DistributedGradientTape`` and
``DistributedOptimizer`` divide table gradients by ``size()`` as they average
dense ones, so N ranks each fed 1/N of a global batch train what one process
trained on the whole batch would.
"""
import os
import threading

import numpy as np
import tensorflow as tf

from ..dlpack import numpy_call
from ..variable import owner_of

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "mpi_enabled", "mpi_built", "comm",
           "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression",
           "allreduce", "grouped_allreduce", "allgather", "broadcast", "broadcast_variables",
           "broadcast_object", "allgather_object", "DistributedGradientTape",
           "DistributedOptimizer", "callbacks", "reduce_gradients"]

# Horovod's reduce ops (hvd.Average, ...)
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}
_MPI_OP = {Average: "sum", Sum: "sum", Min: "min", Max: "max", Product: "prod"}
_ENV_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.initialized = False
        self.user_comm = None      # mpi4py communicator (None: one process)
        self.comm = None           # numbaemb's duplicate of it (numbaemb._mpi.Comm)
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1


_STATE = _State()


def _launched_size():
    for name in _ENV_SIZE:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 1


def init(comm=None, process_sets=None):
    """Start (MPI through mpi4py; idempotent).

    Args:
      comm: an mpi4py communicator (default ``MPI.COMM_WORLD``); Horovod's list of
        ranks is not supported.
      process_sets: must be None (one global process set).

    Without mpi4py and outside ``mpiexec`` the world is this process (size 1);
    under ``mpiexec -n N`` (N > 1) without mpi4py it raises ImportError.
    """
    if process_sets is not None:
        raise ValueError("process_sets are not supported: every collective runs on all ranks")
    if comm is not None and not hasattr(comm, "Alltoallv"):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    with _STATE.lock:
        if _STATE.initialized and (comm is None or comm is _STATE.user_comm):
            return
        if comm is None:
            try:
                from mpi4py import MPI
            except ImportError:
                n = _launched_size()
                if n > 1:
                    raise ImportError(f"launched as one of {n} MPI processes but mpi4py is "
                                      "not installed: pip install 'numbaemb[mpi]'") from None
                _STATE.user_comm = None
                _STATE.initialized = True
                return
            comm = MPI.COMM_WORLD
        from mpi4py import MPI
        from numbaemb._mpi import Comm
        size_ = comm.Get_size()
        _STATE.user_comm = comm if size_ > 1 else None
        _STATE.comm = Comm.of(comm) if size_ > 1 else None
        _STATE.rank, _STATE.size = comm.Get_rank(), size_
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        _STATE.local_rank, _STATE.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        _STATE.initialized = True


def shutdown():
    """Forget the communicator (MPI itself finalizes at exit)."""
    with _STATE.lock:
        _STATE.__init__()


def is_initialized():
    return _STATE.initialized


def _need():
    if not _STATE.initialized:
        init()
    return _STATE


def rank():
    """This process's rank in ``[0, size())``."""
    return _need().rank


def size():
    """Number of processes."""
    return _need().size


def local_rank():
    """Rank among the processes of this machine."""
    return _need().local_rank


def local_size():
    return _need().local_size


def cross_rank():
    """Index of this machine (ranks with local rank 0 counted in rank order)."""
    s = _need()
    return s.rank // max(s.local_size, 1)


def cross_size():
    s = _need()
    return -(-s.size // max(s.local_size, 1))


def mpi_enabled():
    return _need().user_comm is not None


def mpi_built():
    return True


def comm():
    """The mpi4py communicator the tables use, or None for one process."""
    return _need().user_comm


def _dense_comm():
    return _need().comm


# ---- compression (Horovod's hvd.Compression) ------------------------------------------------
class _NoneCompressor:
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compressor:
    """Floating tensors travel as float16 (half the bytes) and are summed in float16."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """``Compression.none`` (default) or ``Compression.fp16``."""
    none = _NoneCompressor
    fp16 = _FP16Compressor


# ---- collectives on tensors ------------------------------------------------------------------
_WIRE = {tf.float32, tf.float64, tf.int32, tf.int64, tf.float16}


def _check_op(op, average=None):
    if average is not None:
        if op is not None:
            raise ValueError("pass either op or average (deprecated), not both")
        op = Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise NotImplementedError("op=Adasum is not supported; use Average or Sum")
    if op not in _MPI_OP:
        raise ValueError(f"op must be one of hvd.Average, Sum, Min, Max, Product, got {op!r}")
    return op


def _on_wire(t, what):
    """``t`` in a dtype MPI reduces (bfloat16 travels as float32)."""
    if t.dtype == tf.bfloat16:
        return tf.cast(t, tf.float32)
    if t.dtype not in _WIRE:
        raise TypeError(f"{what}: cannot reduce a {t.dtype.name} tensor (float16/32/64, "
                        "bfloat16, int32 or int64)")
    return t


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, name=None):
    """:func:`allreduce` of a list of dense tensors in one fused message (one op)."""
    op = _check_op(op, average)
    _check_process_set(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    if op == Average and any(t.dtype.is_integer for t in tensors):
        raise TypeError("op=Average needs floating tensors; use op=Sum for integers")
    n = size()
    pre, post = float(prescale_factor), float(postscale_factor) / (n if op == Average else 1)
    sent, ctxs, dtypes = [], [], [t.dtype for t in tensors]
    for t in tensors:
        if pre != 1.0:
            t = t * tf.cast(pre, t.dtype)
        c, ctx = compression.compress(t)
        sent.append(_on_wire(c, name or "allreduce"))
        ctxs.append(ctx)
    if n > 1:
        mpi_op, what = _MPI_OP[op], f"allreduce {name or ''}".strip()
        out = _same_shapes_call(
            lambda arrays: _dense_comm().allreduce_arrays(arrays, mpi_op, what), sent,
            name or "allreduce")
    else:
        out = sent
    result = []
    for o, ctx, dt in zip(out, ctxs, dtypes):
        o = compression.decompress(o, ctx)
        o = tf.cast(o, dt) if o.dtype != dt else o
        if post != 1.0:
            o = o * tf.cast(post, dt)
        result.append(o)
    return result


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=None, ignore_name_scope=False):
    """``tensor`` reduced over the ranks (default ``op=Average``); differentiable
    (the gradient is the same reduction of the output gradient).

    A ``tf.IndexedSlices`` is allgathered instead (its values divided by ``size()``
    for Average), as Horovod does.
    """
    op = _check_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        values, indices = allgather(tensor.values), allgather(tensor.indices)
        if op == Average:
            values = values / tf.cast(size(), values.dtype)
        elif op != Sum:
            raise ValueError("a tf.IndexedSlices can only be summed or averaged")
        return tf.IndexedSlices(values, indices, tensor.dense_shape)
    kw = dict(compression=compression, op=op, prescale_factor=prescale_factor,
              postscale_factor=postscale_factor, process_set=process_set, name=name)

    @tf.custom_gradient
    def reduce(x):
        def grad(dy):
            if op not in (Average, Sum):
                raise NotImplementedError(f"no gradient for op={_OP_NAMES[op]}")
            return grouped_allreduce([dy], **kw)[0]
        return grouped_allreduce([x], **kw)[0], grad

    return reduce(tf.convert_to_tensor(tensor))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Every rank's ``tensor`` concatenated along axis 0, in rank order (first
    dimensions may differ)."""
    _check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        tensor = tf.reshape(tensor, [1])
    if size() == 1:
        return tf.identity(tensor)
    what = f"allgather {name or ''}".strip()

    def run(a):
        return tuple(_dense_comm().allgather_arrays([a], what))

    out, = numpy_call(run, [tensor], [tensor.dtype], name=name or "allgather", collective=True)
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    return out


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """``tensor`` of rank ``root_rank`` on every rank."""
    return _broadcast_list([tf.convert_to_tensor(tensor)], root_rank, name)[0]


def _check_root(root_rank):
    n = size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or not (
            0 <= root_rank < n):
        raise ValueError(f"root_rank must be an int in [0, {n}), got {root_rank!r}")
    return int(root_rank)


def _broadcast_list(tensors, root_rank, name=None):
    root = _check_root(root_rank)
    if size() == 1 or not tensors:
        return [tf.identity(t) for t in tensors]
    what = f"broadcast {name or ''}".strip()
    return _same_shapes_call(lambda arrays: _dense_comm().broadcast_arrays(arrays, root, what),
                             tensors, name or "broadcast")


def _same_shapes_call(fn, tensors, name):
    """One collective op: ``fn(list of arrays) -> arrays`` of the same shapes and dtypes."""
    out = numpy_call(lambda *arrays: tuple(fn(list(arrays))), tensors,
                     [t.dtype for t in tensors], name=name, collective=True)
    for o, t in zip(out, tensors):
        o.set_shape(t.shape)
    return out


def _check_process_set(process_set):
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise ValueError("only the global process set is supported")


def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assign rank ``root_rank``'s values to ``variables`` on every rank (one fused
    message).  Dynamic tables and their trainable handles are skipped: their rows
    are split across the ranks, not replicated.  Returns the assign op in a graph,
    None eagerly."""
    _check_process_set(process_set)
    variables = [v for v in variables if owner_of(v) is None]
    values = _broadcast_list([tf.convert_to_tensor(v) for v in variables], root_rank,
                             "broadcast_variables")
    ops = [v.assign(x) for v, x in zip(variables, values)]
    return None if tf.executing_eagerly() else tf.group(*ops)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """A picklable Python object of rank ``root_rank`` on every rank (eager)."""
    root = _check_root(root_rank)
    c = _dense_comm()
    return obj if c is None else c.comm.bcast(obj, root=root)


def allgather_object(obj, session=None, name=None, process_set=None):
    """The list of every rank's picklable ``obj``, in rank order (eager)."""
    c = _dense_comm()
    return [obj] if c is None else c.comm.allgather(obj)


# ---- gradients ------------------------------------------------------------------------------
def reduce_gradients(grads, variables, op=Average, compression=Compression.none,
                     sparse_as_dense=False, gradient_predivide_factor=1.0, name=None):
    """What ``DistributedGradientTape`` / ``DistributedOptimizer`` do to gradients.

    Dense gradients: one fused allreduce (``op``; ``gradient_predivide_factor`` f
    divides by f before the sum and by size/f after).  ``tf.IndexedSlices`` of dense
    variables: allgathered (or made dense with ``sparse_as_dense``).  Gradients of
    dynamic tables (``tf.IndexedSlices`` keyed by this rank's ids): divided by
    ``size()`` for Average and left on this rank; the optimizer step sends them to
    the owners, which sum every rank's share.
    """
    op = _check_op(op)
    if op not in (Average, Sum):
        raise ValueError("gradients can only be averaged or summed (op=Average or Sum)")
    n = size()
    grads = list(grads)
    out = list(grads)
    dense = []
    for i, (g, v) in enumerate(zip(grads, variables)):
        if g is None:
            continue
        if owner_of(v) is not None:              # a dynamic table's rows
            if op == Average and n > 1 and isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(g.values / tf.cast(n, g.values.dtype),
                                     g.indices, g.dense_shape)   # (keeps the "distinct" tag)
            out[i] = g
        elif isinstance(g, tf.IndexedSlices) and not sparse_as_dense:
            out[i] = allreduce(g, op=op, compression=compression) if n > 1 else g
        else:
            dense.append(i)
    if dense and n > 1:
        f = float(gradient_predivide_factor)
        reduced = grouped_allreduce(
            [tf.convert_to_tensor(grads[i]) for i in dense], op=op, compression=compression,
            prescale_factor=1.0 / f if op == Average else 1.0,
            postscale_factor=f if op == Average else 1.0, name=name or "gradients")
        for i, r in zip(dense, reduced):
            out[i] = r
    elif dense:
        for i in dense:
            out[i] = tf.convert_to_tensor(grads[i]) if sparse_as_dense else grads[i]
    return out


class DistributedGradientTape(tf.GradientTape):
    """A ``tf.GradientTape`` whose ``gradient`` returns gradients reduced over the
    ranks (:func:`reduce_gradients`).  Wrap a tape after (or before) recording:
    ``tape = hvd.DistributedGradientTape(tape)``.  ``device_*``, ``num_groups``,
    ``groups`` and ``scale_local_gradients`` are accepted and ignored (every
    dense gradient travels in one fused message)."""

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False, op=Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None, process_set=None,
                 scale_local_gradients=True):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"gradtape must be a tf.GradientTape, got {type(gradtape).__name__}")
        _check_process_set(process_set)
        op = _check_op(op)
        super().__init__(persistent=gradtape._persistent,
                         watch_accessed_variables=gradtape._watch_accessed_variables)
        self.__dict__.update(gradtape.__dict__)        # the same recorded tape
        self._hvd = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                         gradient_predivide_factor=gradient_predivide_factor)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_src, flat_g = tf.nest.flatten(sources), tf.nest.flatten(grads)
        reduced = reduce_gradients(flat_g, flat_src, **self._hvd)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """A copy of Keras optimizer ``optimizer`` (from its config, as Horovod does) whose
    ``apply`` / ``apply_gradients`` first reduce the gradients over the ranks
    (:func:`reduce_gradients`).  For ``model.compile(hvd.DistributedOptimizer(opt))``;
    wrap a ``de.DynamicEmbeddingOptimizer`` when the model has dynamic tables.

    The copy is of the same class (the reduction is set on the instance), so a saved
    model names the plain optimizer: ``keras.models.load_model`` gives it back for
    serving or one process, :func:`load_model` gives it back distributed."""
    import keras
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer must be a Keras optimizer, got {type(optimizer).__name__}")
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step must be 1")
    _check_process_set(process_set)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return _distribute(type(optimizer).from_config(config), op=_check_op(op),
                       compression=compression, sparse_as_dense=sparse_as_dense,
                       gradient_predivide_factor=gradient_predivide_factor)


def _distribute(opt, **settings):
    """Make ``opt``'s ``apply`` / ``apply_gradients`` reduce the gradients first."""
    cls = type(opt)

    def apply(grads, trainable_variables=None):
        if trainable_variables is None:
            return cls.apply(opt, grads, trainable_variables)
        variables = list(trainable_variables)
        return cls.apply(opt, reduce_gradients(list(grads), variables, **settings), variables)

    def apply_gradients(grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        apply([g for g, _ in grads_and_vars], [v for _, v in grads_and_vars])
        return opt.iterations

    object.__setattr__(opt, "apply", apply)
    object.__setattr__(opt, "apply_gradients", apply_gradients)
    object.__setattr__(opt, "_hvd_settings", settings)
    return opt


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               **kwargs):
    """``keras.models.load_model(filepath)`` with the model's optimizer, and its restored
    state, made distributed (as :func:`DistributedOptimizer` does), Horovod's
    ``hvd.load_model``.  Call it on every rank; split tables keep the keys each rank
    owns.  ``custom_optimizers``: extra optimizer classes to know by name."""
    import keras
    objects = dict(custom_objects or {})
    objects.update({c.__name__: c for c in custom_optimizers or ()})
    model = keras.models.load_model(filepath, custom_objects=objects or None, **kwargs)
    opt = getattr(model, "optimizer", None)
    if isinstance(opt, keras.optimizers.Optimizer) and not hasattr(opt, "_hvd_settings"):
        _distribute(opt, op=Average, compression=compression, sparse_as_dense=False,
                    gradient_predivide_factor=1.0)
    return model


from . import callbacks  # noqa: E402
from .saving import Checkpoint, save_model  # noqa: E402

__all__ += ["Checkpoint", "save_model", "load_model"]
