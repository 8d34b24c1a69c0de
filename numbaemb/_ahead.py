"""Compile ahead: a cold process's training-step kernels, compiled on another core.

A process that starts with an empty cache compiles each kernel when it first
calls it, one after the other on one core: a table's first ``find_or_insert``,
then ``lookup``, then the optimizer step (the unique / segment-sum pass and the
optimizer's row loop).  Numba compiles under one process-wide lock, so a thread
cannot compile beside it; another process can.  At this process's first compile
of one of numbaemb's kernels (:func:`jit_kernels._compile_lock.on_first_miss`),
:func:`start` launches ``python -m numbaemb._ahead PLAN``, which compiles, into
the same cache, what the process will need after its inserts and lookups, in
the reverse of the order a step needs them: the optimizer's row loop (the last
optimizer created, else Adam; where tables were looked up together, only the
kernel that steps them together), a table's inserts and its count of absent ids
(for the last table created: its value dtype, dim and initializer), the segment
sum, then the unique pass, for the size of the batch about to run.  The two
processes never compile one kernel twice: whichever comes second waits for the
first one's and loads it (:mod:`jit_kernels._compile_lock`), so they meet in the
middle: this process compiles the step's first kernels while the helper is still
on its last ones (the cold table job's Adam step: 0.30 -> 0.15 s).  A kernel the helper
guessed wrong is compiled on the side core for nothing and costs this process
nothing.

It starts only on a cache miss (never in a warm process), once a process, with
two CPUs or more, not under MPI (``mpi4py.MPI`` imported: ranks already share
their compiles through the locks), not in a frozen application and not with
``NUMBAEMB_COMPILE_AHEAD=0``.  The helper runs detached and silent, and ends when
its list is done.

>>> plan()["optimizer"][0] in ("Adam", "SGD", "Adagrad", "Ftrl", "RMSprop")
True
"""
import dataclasses
import json
import os
import subprocess
import sys
import threading
import weakref

_LAST = {"table": None, "optimizer": None, "helper": None, "multi": False}


def note_table(variable):
    """Remember ``variable`` (a CPU table with integer or string keys) for the plan,
    if an optimizer can train it (float values: not a string table's own int64 map
    of spans, made after it)."""
    from ._checks import compute_dtype
    if compute_dtype(variable.value_dtype).kind == "f":
        _LAST["table"] = weakref.ref(variable)


def note_optimizer(optimizer):
    """Remember ``optimizer`` (a ``numbaemb.optimizers.Optimizer``) for the plan."""
    _LAST["optimizer"] = weakref.ref(optimizer)


def note_multi():
    """Remember that tables are looked up together (:mod:`numbaemb.multi`): the helper
    then compiles only the kernel that steps them together."""
    _LAST["multi"] = True


def _last(name):
    ref = _LAST[name]
    return None if ref is None else ref()


def enabled():
    """True where a cold start may start a helper (see the module docstring)."""
    from jit_kernels._compile_lock import switched_off
    if switched_off("NUMBAEMB_COMPILE_AHEAD"):
        return False
    if "mpi4py.MPI" in sys.modules or getattr(sys, "frozen", False) or not sys.executable:
        return False            # (a frozen app's executable is the app, not Python)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus >= 2


def plan():
    """What the helper compiles, as JSON-able data: the batch size, the last table's
    settings (or the defaults) and the last optimizer (or Adam)."""
    from jit_kernels.segment import last_size
    table, opt = _last("table"), _last("optimizer")
    out = {"n": int(max(last_size(), 1)), "dim": 8, "value_dtype": "float32",
           "initializer": None, "optimizer": ["Adam", {}], "multi": _LAST["multi"]}
    if table is not None:
        out.update(dim=int(table.dim), value_dtype=str(table.value_dtype),
                   initializer=table.initializer.get_config())
    if opt is not None:
        out["optimizer"] = [type(opt).__name__, dataclasses.asdict(opt)]
    return out


def start():
    """Launch the helper for :func:`plan` (once a process; nothing where not
    :func:`enabled`)."""
    if _LAST["helper"] is not None or not enabled():
        return None
    _LAST["helper"] = False
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBAEMB_COMPILE_AHEAD="0",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "numbaemb._ahead", json.dumps(plan())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, cwd=root,
                            start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True).start()     # reaped when it ends
    _LAST["helper"] = proc
    return proc


def disable():
    """No helper for this process (one that compiles every kernel itself: the warmup)."""
    if _LAST["helper"] is None:
        _LAST["helper"] = False


def helper():
    """The helper this process launched (a ``subprocess.Popen``), or None."""
    return _LAST["helper"] or None


def run(spec):
    """The helper's work (in the helper process): the kernels of :func:`plan`'s
    step, in the order that leaves this process's first calls to it."""
    import numba
    import numpy as np

    from jit_kernels.segment import PARALLEL_MIN, segment_sum, unique_inverse
    from . import initializers, optimizers
    from ._checks import compute_dtype
    from .variable import Variable
    n, dim, value_dtype = spec["n"], spec["dim"], spec["value_dtype"]
    dtype = compute_dtype(value_dtype)
    name, fields = spec["optimizer"]
    opt = getattr(optimizers, name)(**fields)
    init = None if spec["initializer"] is None else initializers.from_config(spec["initializer"])

    def table():
        return Variable(dim, value_dtype=value_dtype, initializer=init)

    if spec.get("multi"):       # one kernel steps every table (any count): 4-5 s to compile
        from .multi import apply_many, trains_with_others
        t = table()
        if trains_with_others(t):
            apply_many([t], opt, [np.arange(2)], [np.zeros((3, dim), dtype)],
                       [np.array([0, 1, 1])], [None], step=1)
            return              # (the tables' steps need nothing else)
    # every driver picks its build by the batch's size (and a cost a row): PARALLEL_MIN
    # picks the parallel build at any cost, as n does.  One key / row repeated keeps the
    # table, sums and rows one row long, and the zero gradients are never written, so
    # they stay unbacked pages: the helper needs little memory at any n.
    m = min(n, PARALLEL_MIN)
    same, grads = np.zeros(m, np.int64), np.zeros((m, dim), dtype)
    if np.dtype(value_dtype) == dtype:                  # (16-bit storage: not guessed)
        cols = {slot: np.zeros((1, dim), dtype) for slot, _ in opt.slots()}
        opt._update(np.zeros((1, dim), dtype), cols, same, grads, 0.01, 1)
    t = table()
    t.find_or_insert(same)
    for shard in t.shards:              # (the next insert's count of its absent ids)
        shard._count_absent(same)
    segment_sum(grads, same, 1, numba.get_num_threads())
    unique_inverse(same)

if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
