"""Tables split across MPI ranks: a training step's table ops, split into planning,
MPI exchange and the owner's local kernel, against a bare ``Alltoallv`` of the same bytes.

    python benchmarks/bench_distributed.py                  # R = 1, 2, 4: one table
    python benchmarks/bench_distributed.py --ranks 1,2 --steps 20
    mpiexec -n 2 python benchmarks/bench_distributed.py --child   # one world size, JSON
    python benchmarks/bench_distributed.py --device cuda --ranks 1,2   # split GPU tables

Each rank, each step: 64K ids (``--ids``) drawn Zipf(``--zipf``) over ``--vocab`` ids
and hashed over the whole int64 range (a different stream per rank), dim 64,
float32, ``RandomNormal`` initial rows.  The step is the training path's table
work: ``find_or_insert(ids)`` (forward), ``apply_gradients(Adam, ids, grads)``
(backward), plus an inference ``lookup(ids)``.  Each op is timed per step
(``time.perf_counter``) and split by the library's own counters
(``Comm.times``): planning (unique, owners, bucketing), order (the rows back
into batch order; the per-rank gradient sums or values in send order: passes
over the batch's 16 MB of rows that a one-process table makes inside its own
kernels), exchange (the header ``Alltoall`` plus
the data ``Alltoallv`` calls) and local (the owner's table op).  The benchmark
sets ``Comm.sync``: a ``Barrier`` before every MPI call, timed apart as "wait"
(load imbalance: a rank that is done waits for one with more keys to own or
more to plan), so that "exchange" is what the MPI calls cost once every rank
is in them.  The slowest
rank of each step counts (``MAX`` over ranks), median over steps after
``--warmup`` steps (the table grows in every step; the first steps compile).

The limit: every data ``Alltoallv`` of the op is recorded with its exact byte
counts per rank pair and replayed right after the op as bare
``Alltoallv`` calls on raw bytes (same communicator, same order) — what MPI
costs for the bytes the op has to move, with no planning, no header and no
table.  Bytes per id: bytes this rank sent in the op's data messages divided
by its ids.  R = 1 is one plain process (no exchange).  With more ranks than
cores (R = 4 on a 2-core machine) the ranks take turns on the cores: such
rows measure correctness of the overlap, not speed, and are flagged.

``--device cuda``: each rank's table on GPU ``rank mod #GPUs``, ids and gradients
handed in as device arrays, every op ended by ``cuda.synchronize()``; the plan runs
on the GPU.  The transport (NCCL, or MPI through host copies: see
``numbaemb._exchange``; ``NUMBAEMB_DEVICE_EXCHANGE``) is printed.  The bare
``Alltoallv`` replay stays MPI on host buffers: the limit of the staged transport,
not of NCCL's links.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

OPS = ("find_or_insert", "lookup", "apply_gradients")


def replay_bare(c, comm):
    """Replay the ``Alltoallv`` calls recorded in ``c.record`` (a numbaemb ``Comm``) as
    bare ``Alltoallv`` calls of raw bytes with the same counts, on the same
    communicator, after a ``Barrier``; stops recording; returns their wall time (s)."""
    from mpi4py import MPI
    log, c.record = c.record, None
    comm.Barrier()
    t1 = time.perf_counter()
    for sb, rb in log:
        s = np.empty(int(sb.sum()), np.uint8)
        r = np.empty(int(rb.sum()), np.uint8)
        sd = np.concatenate([[0], np.cumsum(sb)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rb)[:-1]])
        c.comm.Alltoallv([s, (sb, sd), MPI.BYTE], [r, (rb, rd), MPI.BYTE])
    return time.perf_counter() - t1


def child(args):
    from mpi4py import MPI
    import numbaemb as ne
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    gpu = args.device == "cuda"
    if gpu:
        from numba import cuda
        device = f"cuda:{rank % len(cuda.gpus)}"
        here = cuda.to_device
    else:
        device, here = "cpu", (lambda a: a)
    v = ne.Variable(args.dim, comm=comm, name="bench", device=device,
                    initializer=ne.initializers.RandomNormal(stddev=0.05, seed=1))
    opt = ne.optimizers.Adam(1e-3)
    rng = np.random.default_rng(100 + rank)
    mult = np.uint64(0x9E3779B97F4A7C15)

    def batch():
        z = (rng.zipf(args.zipf, args.ids) % args.vocab).astype(np.uint64)
        return (z * mult).view(np.int64)

    grads = here(rng.standard_normal((args.ids, args.dim)).astype(np.float32))
    c = getattr(v, "_comm", None)
    rows = {op: [] for op in OPS}
    for step in range(args.warmup + args.steps):
        ids = here(batch())
        calls = {"find_or_insert": lambda: v.find_or_insert(ids),
                 "lookup": lambda: v.lookup(ids),
                 "apply_gradients": lambda: ne.optimizers.apply_gradients(
                     v, opt, ids, grads, step=step + 1)}
        for op in OPS:
            if c is not None:
                comm.Barrier()
                c.reset_stats()
                c.record = []
                c.sync = True
            t0 = time.perf_counter()
            calls[op]()
            if gpu:
                cuda.synchronize()
            total = time.perf_counter() - t0
            parts = dict(c.times) if c is not None else {"plan": 0.0, "order": 0.0, "wait": 0.0,
                                                          "exchange": 0.0, "local": total}
            sent = c.bytes_sent if c is not None else 0
            bare = replay_bare(c, comm) if c is not None else 0.0
            vals = np.array([total, parts["plan"], parts["exchange"], parts["local"], bare,
                             parts["wait"], parts["order"]])
            worst = np.empty_like(vals)
            comm.Allreduce(vals, worst, op=MPI.MAX)
            if step >= args.warmup:
                rows[op].append(worst.tolist()[:6] + [sent / args.ids, worst[6]])  # slowest rank
    size = v.size()
    if rank == 0:
        med = {op: [statistics.median(r[i] for r in rows[op]) for i in range(8)] for op in OPS}
        print(json.dumps({"world": world, "size": size, "ops": med,
                          "transport": getattr(v, "transport", "none (one process)")}),
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help="run one world size (under mpiexec)")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--ids", type=int, default=65536)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=10_000_000)
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    if args.child:
        return child(args)
    cores = os.cpu_count()
    results = []
    for r in map(int, args.ranks.split(",")):
        cmd = ["mpiexec", "-n", str(r), sys.executable, os.path.abspath(__file__), "--child",
               "--ids", str(args.ids), "--dim", str(args.dim), "--vocab", str(args.vocab),
               "--zipf", str(args.zipf), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                             env=dict(os.environ, NUMBA_NUM_THREADS=str(max(1, cores // r))))
        if out.returncode:
            sys.exit(f"R={r} failed:\n{out.stderr[-3000:]}")
        results.append(last_json(out.stdout))
    import mpi4py
    import numba
    print(f"ids per rank per step {args.ids}; dim {args.dim}; Zipf({args.zipf}) over "
          f"{args.vocab:,} ids; median of {args.steps} steps after {args.warmup}; cpus {cores}; "
          f"numba threads per rank cpus // R; mpi4py {mpi4py.__version__}; numba {numba.__version__}; "
          f"device {args.device}; transport {results[-1]['transport']}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print()
    print("| R | op | step ms | plan ms | order ms | wait ms | exchange ms | local ms | "
          "bare Alltoallv ms | exchange / bare | plan / step | bytes sent / id | note |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for res in results:
        r = res["world"]
        note = f"oversubscribed: {r} ranks on {cores} cores" if r > cores else ""
        for op in OPS:
            total, plan, ex, local, bare, wait, per_id, order = res["ops"][op]
            ratio = f"{ex / bare:.2f}x" if bare > 0 else "—"
            print(f"| {r} | {op} | {1e3 * total:.2f} | {1e3 * plan:.2f} | {1e3 * order:.2f} | "
                  f"{1e3 * wait:.2f} | "
                  f"{1e3 * ex:.2f} | "
                  f"{1e3 * local:.2f} | {1e3 * bare:.2f} | {ratio} | {plan / total:.0%} | "
                  f"{per_id:.0f} | {note} |")
    print()
    print("Targets: exchange within 1.3x the bare Alltoallv of the same bytes; planning under "
          "20% of the step.")


def last_json(stdout):
    """The child's JSON line: its last line that holds one once terminal colour codes are
    taken out (pytest or Open MPI may print a colour reset after it)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in stdout.splitlines()]
    return json.loads([line for line in lines if line.startswith("{")][-1])


if __name__ == "__main__":
    main()
