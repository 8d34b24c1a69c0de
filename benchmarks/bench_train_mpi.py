"""Distributed Keras training under ``mpiexec -n R``: ids/s per rank and in total, the
step split into exchange, table kernels, allreduce and TF, and the exchange against a
bare ``Alltoallv`` of the same bytes.  Run through ``bench_train.py --ranks``:

    python benchmarks/bench_train.py --ranks 1,2,4           # R = 1, 2, 4 (4: oversubscribed)
    python benchmarks/bench_train.py --ranks 1,2 --steps 30 --quick
    mpiexec -n 2 python benchmarks/bench_train_mpi.py --steps 20   # one world size, JSON

The job is bench_train's, per rank (weak scaling, as SOK and TFRA report): each rank
trains on its own batches of 16,384 rows x 4 ids (65,536 ids a step, Zipf(1.2) modulo
1M, a different stream per rank), ``de.keras.layers.Embedding(64, distributed=True)``
(rows on the rank that owns the key) -> Flatten -> Dense(1, sigmoid), compiled with
``hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(Adam(1e-3)))``, ``model.fit``.
R = 1 is one plain process (a plain table, no exchange): the baseline.  Each rank gets
``cpus // R`` TF and Numba threads; with more ranks than cores the ranks take turns on
the cores and the row measures correctness under overlap, not speed (flagged).

Two phases per world size, after ``--warmup`` steps (tracing, compiling, first rows):

* throughput: ``--steps`` steps timed from the start of the first batch to the end of
  the last (Keras callbacks), the slowest rank counts; ids/s per rank = 65,536 / step,
  in total = R x that;
* breakdown: ``--profile-steps`` more steps with ``Comm.sync`` (a ``Barrier`` before
  every MPI call, timed apart as "wait": load imbalance) and timers around every
  numpy-side function of the step.  "exchange": the tables' MPI calls (headers and
  ``Alltoallv``); "allreduce": the dense gradient allreduce (header included); "table":
  the rest of the numpy side (planning, batch-order passes, the owner's kernels, the
  backward's local sums); "TF and the rest": the step minus the numpy side (TF's ops,
  the hand-off to Python, Keras).  After every step the step's ``Alltoallv`` calls are
  replayed with their exact byte counts as bare ``Alltoallv`` calls on raw bytes (the
  limit: what MPI costs for the bytes the exchange must move).  Mean over ranks of
  the per-step means.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

TARGET_EXCHANGE = 1.3       # exchange / bare Alltoallv of the same bytes


def numpy_side_timer():
    """Patch ``numpy_call`` where the bridge uses it: every numpy-side function's wall
    time is added to the returned one-element list.  Call before building the model."""
    import tf_bridge.dlpack as dl
    import tf_bridge.distributed as dist
    import tf_bridge.lookup as lk
    import tf_bridge.optimizer as op
    import tf_bridge.variable as tv
    acc = [0.0]
    orig = dl.numpy_call

    def timed_call(fn, inputs, tout, name=None, collective=False):
        def timed(*arrays):
            t0 = time.perf_counter()
            try:
                return fn(*arrays)
            finally:
                acc[0] += time.perf_counter() - t0
        return orig(timed, inputs, tout, name=name, collective=collective)

    for m in (lk, op, tv, dist):
        m.numpy_call = timed_call
    return acc


def build():
    import keras
    import tf_bridge as de
    from tf_bridge import distributed as hvd
    from bench_train import DIM, FEATURES
    inp = keras.Input((FEATURES,), dtype="int64")
    emb = de.keras.layers.Embedding(DIM, name="emb", distributed=True)
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(emb(inp)))
    model = keras.Model(inp, out)
    opt = hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(1e-3)))
    model.compile(optimizer=opt, loss="binary_crossentropy")
    return model


def child(args):
    cores = os.cpu_count()
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    import numpy as np
    import tensorflow as tf
    import keras
    from mpi4py import MPI
    from tf_bridge import distributed as hvd
    from bench_distributed import replay_bare
    from bench_train import IDS_PER_STEP, make_ids, dataset
    from numbaemb._mpi import Comm
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    threads = max(1, cores // world)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    acc = numpy_side_timer()
    model = build()
    n = args.warmup + args.steps + args.profile_steps
    x, y = make_ids(n, seed=rank)
    c = Comm.of(hvd.comm()) if world > 1 else None
    world_comm = MPI.COMM_WORLD

    class Steps(keras.callbacks.Callback):
        """Per-step wall time, numpy-side time, Comm phases and the bare replay."""

        def __init__(self, breakdown):
            super().__init__()
            self.breakdown, self.rows, self.first, self.last = breakdown, [], None, None

        def on_train_batch_begin(self, batch, logs=None):
            if c is not None and self.breakdown:
                c.reset_stats()
                c.record = []
            acc[0] = 0.0
            self.t0 = time.perf_counter()
            self.first = self.first or self.t0

        def on_train_batch_end(self, batch, logs=None):
            t = self.last = time.perf_counter()
            if not self.breakdown:
                return
            phases = dict(c.times) if c is not None else {}
            bare = replay_bare(c, world_comm) if c is not None else 0.0
            ex, dense, wait = (phases.get(k, 0.0) for k in ("exchange", "dense", "wait"))
            side = acc[0]
            self.rows.append([t - self.t0, ex, dense, side - ex - dense - wait, wait,
                              t - self.t0 - side, bare])

    def fit(a, b, cb):
        model.fit(dataset(x[a:b], y[a:b], False), epochs=1, steps_per_epoch=b - a, verbose=0,
                  callbacks=[cb], shuffle=False)

    fit(0, args.warmup, Steps(False))
    timed = Steps(False)
    fit(args.warmup, args.warmup + args.steps, timed)
    # the first batch's begin is the origin: steps - 1 full steps + the last one
    step = (timed.last - timed.first) / args.steps
    if c is not None:
        c.sync = True
    prof = Steps(True)
    fit(args.warmup + args.steps, n, prof)
    if c is not None:
        c.sync = False
    parts = np.mean(np.array(prof.rows), axis=0)
    worst = world_comm.allreduce(step, op=MPI.MAX)
    mean_parts = world_comm.allreduce(parts, op=MPI.SUM) / world
    if rank == 0:
        print(json.dumps({"world": world, "step": worst, "ids_per_step": IDS_PER_STEP,
                          "parts": mean_parts.tolist(), "threads": threads}), flush=True)


def run_all(args):
    """Launch one ``mpiexec -n R`` child per world size; print the table."""
    cores = os.cpu_count()
    results = []
    for r in map(int, args.ranks.split(",")):
        cmd = ["mpiexec", "-n", str(r), sys.executable, os.path.abspath(__file__),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--profile-steps", str(args.profile_steps)]
        env = dict(os.environ, NUMBA_NUM_THREADS=str(max(1, cores // r)), PYTHONUNBUFFERED="1")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
        if out.returncode:
            sys.exit(f"R={r} failed:\n{out.stderr[-3000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"R={r} done", file=sys.stderr, flush=True)
    print_table(results, args, cores)


def print_table(results, args, cores):
    import mpi4py
    import numba
    import tensorflow as tf
    print(f"Per rank per step: 16,384 rows x 4 ids = 65,536 ids (Zipf(1.2) mod 1M, a stream "
          f"per rank), dim 64, Adam; {args.steps} timed steps after {args.warmup}, breakdown "
          f"over {args.profile_steps} more; cpus {cores}, TF and Numba threads per rank "
          f"cpus // R; TF {tf.__version__}, numba {numba.__version__}, mpi4py "
          f"{mpi4py.__version__}; load average {os.getloadavg()[0]:.1f}")
    print()
    print("| R | step ms (slowest rank) | ids/s per rank | ids/s total | total vs R=1 | "
          "exchange ms | bare Alltoallv ms | exchange / bare | table ms | allreduce ms | "
          "wait ms | TF and the rest ms | note |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    base = None
    for res in results:
        r, step = res["world"], res["step"]
        per_rank = res["ids_per_step"] / step
        total = r * per_rank
        base = base or (total if r == 1 else None)
        _, ex, dense, table, wait, tf_rest, bare = res["parts"]
        ratio = f"{ex / bare:.2f}x" if bare > 0 else "—"
        if bare > 0:
            ratio += " PASS" if ex / bare <= TARGET_EXCHANGE else " MISS"
        note = f"oversubscribed: {r} ranks on {cores} cores" if r > cores else ""
        vs = f"{total / base:.2f}x" if base else "—"
        print(f"| {r} | {1e3 * step:.1f} | {per_rank / 1e6:.2f}M | {total / 1e6:.2f}M | {vs} | "
              f"{1e3 * ex:.2f} | {1e3 * bare:.2f} | {ratio} | {1e3 * table:.2f} | "
              f"{1e3 * dense:.2f} | {1e3 * wait:.2f} | {1e3 * tf_rest:.2f} | {note} |")
    print()
    print(f"Target: exchange within {TARGET_EXCHANGE}x a bare Alltoallv of the same bytes. "
          "Breakdown columns are per-step means of the breakdown phase (a Barrier before each "
          "MPI call), averaged over ranks; they need not add up to the throughput step.")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--profile-steps", type=int, default=20)
    args = ap.parse_args(argv)
    child(args)


if __name__ == "__main__":
    main()
