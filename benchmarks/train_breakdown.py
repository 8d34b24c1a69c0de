"""The per-step breakdown of ``bench_train.py``'s numbaemb training step.

Timers (``time.perf_counter``) around every numpy-side piece of the step (forward
unique and lookup, the optimizer's pieces, the wait for a deferred update, the Python
function inside each ``tf.numpy_function``), and TF op times from ``tf.profiler``;
:func:`breakdown` profiles a ``bench_train.Runner``'s model after its timed chunks and
:func:`breakdown_rows` orders the pieces for the report.  Used by ``bench_train.py``
(without ``--no-breakdown``); not a script of its own.
"""
import collections
import glob
import os
import shutil
import tempfile
import time


class Timers:
    """Wall time (perf_counter) accumulated per label by wrapped functions; for the
    kernels (``keep=True``) also, while ``keeping``, each function's last call and its
    number of calls, to replay alone (:func:`alone`).  (Off while the profiled steps
    run: a kept output buffer would not go back to the variable's pool.)"""

    def __init__(self):
        self.total = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.last = collections.defaultdict(dict)     # label -> {attr: [fn, a, k, calls]}
        self.patched = []
        self.keeping = False

    def wrap(self, obj, attr, label, keep=False):
        fn = getattr(obj, attr, None)
        if fn is None:                   # an older tree: nothing to time there
            return
        total, calls, last, timers = self.total, self.calls, self.last[label], self

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                total[label] += time.perf_counter() - t
                calls[label] += 1
                if keep and timers.keeping:
                    n = last[attr][3] + 1 if attr in last else 1
                    last[attr] = [fn, a, k, n]

        timed.__wrapped__ = fn
        setattr(obj, attr, timed)
        self.patched.append((obj, attr, fn))

    def restore(self):
        for obj, attr, fn in reversed(self.patched):
            setattr(obj, attr, fn)
        self.patched.clear()

    def reset(self):
        self.total.clear()
        self.calls.clear()
        for calls in self.last.values():
            calls.clear()


def alone(timers, steps, reps=7):
    """{label: ms a step} of the kernels' pieces run alone: each wrapped function's last
    call of the ``steps`` steps run while ``timers.keeping``, replayed ``reps`` times on
    an idle process (the deferred update waited for first), the caches evicted before
    each (a 64 MB read), the median scaled by its calls a step.  The replays act on the
    table again (an Adam step on the same rows, a find of keys now present: the probe
    without the insert), so this runs after the model's timed work only.  Against the
    same pieces' times inside the step it shows what sharing the cores with TensorFlow
    costs them."""
    import numpy as np
    from train_floor import median_ms

    import numbaemb._deferred as dfr
    dfr.wait_all()
    junk = np.ones(8 << 20)
    out = {}
    for label, fns in timers.last.items():
        if fns:
            out[label] = sum(median_ms(lambda: fn(*a, **k), before=junk.sum, n=reps) * n / steps
                             for fn, a, k, n in fns.values())
    return out


def patch_for_breakdown(timers):
    """Timers around every numpy-side piece of a numbaemb training step."""
    import numbaemb._deferred as dfr
    import numbaemb.optimizers as ne_opt
    import tf_bridge.lookup as lk
    import tf_bridge.optimizer as op
    import tf_bridge.variable as tv
    from jit_kernels import cpu_table
    from jit_kernels import optimizers as jk

    w = timers.wrap
    w(lk, "unique_inverse", "forward: unique (Numba)", keep=True)
    w(tv.Variable, "_np_lookup",
      "forward: table lookup (probe, rows copied out, initial rows of absent ids)", keep=True)
    w(lk, "gather_rows", "forward: spread rows to positions (Numba)")
    w(lk, "segment_sum_into", "backward: segment-sum per distinct id (Numba)")
    fused = "apply: unique + segment-sum (of the lookup's gradient rows, fused)"
    w(ne_opt, "unique_inverse", fused, keep=True)
    w(ne_opt, "segment_sum", fused, keep=True)
    w(cpu_table, "find_or_insert_rows", "apply: find_or_insert (probe, insert)", keep=True)
    w(cpu_table, "init_rows", "apply: initial rows of new ids (other columns, draws)",
      keep=True)
    w(jk, "adam_rows", "apply: Adam row update (new rows started in the same pass)",
      keep=True)
    # a deferred update (tf_bridge.optimizer.DEFERRED) runs on numbaemb's worker thread: the
    # whole of it, and the time the next lookup waits for it
    w(op, "_run_parts", "apply: the whole update")
    w(dfr.Job, "wait", "forward: wait for the previous step's deferred update")
    # the python function inside each tf.numpy_function (to get the hand-off)
    for mod in (lk, tv, op):
        orig = mod.numpy_call

        def numpy_call(fn, inputs, tout, name=None, _orig=orig, **kw):
            label = f"py:{name or 'numpy_call'}"

            def inner(*a):
                t = time.perf_counter()
                try:
                    return fn(*a)
                finally:
                    timers.total[label] += time.perf_counter() - t
                    timers.calls[label] += 1
            return _orig(inner, inputs, tout, name=name, **kw)

        timers.patched.append((mod, "numpy_call", orig))
        mod.numpy_call = numpy_call


def profile_ops(logdir, steps):
    """{op name: ms per step} of the TF ops in the profile, plus the function's own time."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    files = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    ops, step_fn = collections.defaultdict(float), 0.0
    if not files:
        return ops, step_fn
    space = xplane_pb2.XSpace()
    with open(files[0], "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        meta = plane.event_metadata
        for line in plane.lines:
            for ev in line.events:
                name = meta[ev.metadata_id].name
                ms = ev.duration_ps / 1e9
                if line.name.startswith("tf_Compute") and ":" in name and "::" not in name:
                    ops[name] += ms / steps
                elif line.name == "python" and name.startswith("EagerLocalExecute: __inference_"):
                    step_fn += ms / steps
    return ops, step_fn


REPLAYED = 2    # steps whose kernel calls :func:`alone` replays


def steps(args):
    """Batches :func:`breakdown` trains: the retrace, the profiled steps, the replayed."""
    return min(args.warmup, 3) + args.profile_steps + REPLAYED


def breakdown(r, args):
    """Per-step pieces of runner ``r``'s training step (ms), the step's wall time, and
    the kernels' pieces run alone (:func:`alone`, on two more steps' calls).

    The timed model itself is profiled after its timed chunks, so its table has the
    size (and its rows the places in memory) of the timed steps; its step is traced
    again with the timers in place, then once more without them."""
    import tensorflow as tf
    timers = Timers()
    patch_for_breakdown(timers)
    try:
        r.model.train_function = None             # retrace: the timers are read at trace time
        r.fit(min(args.warmup, 3), record=False)     # (batches: see steps)
        timers.reset()
        logdir = tempfile.mkdtemp(prefix="bench_train_prof_")
        tf.profiler.experimental.start(logdir)
        try:
            step_s = r.fit(args.profile_steps, record=False)[0]
        finally:
            tf.profiler.experimental.stop()
        ops, fn_ms = profile_ops(logdir, args.profile_steps)
        shutil.rmtree(logdir, ignore_errors=True)
        n = args.profile_steps
        mine = {k: v * 1e3 / n for k, v in timers.total.items()}
        timers.keeping = True
        r.fit(REPLAYED, record=False)
        solo = alone(timers, REPLAYED)
    finally:
        timers.restore()
        r.model.train_function = None
    return mine, ops, fn_ms, step_s * 1e3, solo


def breakdown_rows(mine, ops, fn_ms, step_ms, solo=None):
    """[(piece, ms/step, ms/step alone or None)] in pipeline order (``solo``:
    :func:`alone`'s), plus the hand-off share."""
    rows = []
    solo = solo or {}

    def add(label, ms, tag=""):
        rows.append((label + tag, ms, solo.get(label)))

    def op_ms(pred):
        return sum(v for k, v in ops.items() if pred(k))

    pyfunc = {k: v for k, v in ops.items()
              if k.endswith((":PyFunc", ":PyFuncStateless", ":EagerPyFunc"))}
    wait = "forward: wait for the previous step's deferred update"
    lookup = "forward: table lookup (probe, rows copied out, initial rows of absent ids)"
    add("forward: unique (Numba)", mine.get("forward: unique (Numba)", 0.0))
    if mine.get(wait):
        add(wait, mine[wait])
    add(lookup, max(0.0, mine.get(lookup, 0.0) - mine.get(wait, 0.0)))
    add("forward: spread rows to positions (Numba)",
        mine.get("forward: spread rows to positions (Numba)", 0.0))
    add("backward: segment-sum per distinct id (Numba)",
        mine.get("backward: segment-sum per distinct id (Numba)", 0.0))
    apply_labels = ("apply: unique + segment-sum (of the lookup's gradient rows, fused)",
                    "apply: find_or_insert (probe, insert)",
                    "apply: initial rows of new ids (other columns, draws)",
                    "apply: Adam row update (new rows started in the same pass)")
    apply_py = sum(v for k, v in mine.items() if k.startswith("py:") and k.endswith("_apply"))
    whole = mine.get("apply: the whole update", 0.0)
    deferred = whole > apply_py        # the update ran after the op returned
    tag = " [deferred]" if deferred else ""
    for label in apply_labels:
        add(label, mine.get(label, 0.0), tag)
    add("apply: the rest (locks, table growth, copies, checks)",
        max(0.0, (whole if deferred else apply_py)
            - sum(mine.get(label, 0.0) for label in apply_labels)), tag)
    if deferred:
        add("apply op: its numpy call (the update deferred, not waited for)", apply_py)
    py_ms = sum(v for k, v in mine.items() if k.startswith("py:"))
    handoff = max(0.0, sum(pyfunc.values()) - py_ms)
    other = op_ms(lambda k: k not in pyfunc)
    add("TF graph: every other op (dense layer, loss, dense Adam, ...)", other)
    add("hand-off: tf.numpy_function in/out (op time - Python time)", handoff)
    add("Keras loop outside the graph (step - function time)", max(0.0, step_ms - fn_ms))
    return rows, handoff, sum(pyfunc.values()), py_ms
