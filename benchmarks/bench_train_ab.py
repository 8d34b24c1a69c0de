"""Same-process A/B of the training step's two fusions (issue 18), on bench_train's job.

Four models of one kind (``numbaemb``: a growing table, or ``sized``:
``init_size=1_000_000``) train in one process, each with one combination of
``tf_bridge.optimizer.FUSED`` (the gradient summed inside the optimizer's update,
read when the step is traced) and ``tf_bridge.lookup.DIRECT_FORWARD`` (every
position's row looked up straight into the output, read at every step); they
alternate in chunks so that all see the same load.  Prints the median ms a step
of each.  (False, False) is the code before issue 18.

    python benchmarks/bench_train_ab.py                  # default layer
    python benchmarks/bench_train_ab.py --kind sized --chunks 10 --steps 40
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=["numbaemb", "sized"], default="numbaemb")
    ap.add_argument("--chunks", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40, help="steps a chunk")
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import bench_train as bt
    import tf_bridge.lookup as lk
    import tf_bridge.optimizer as top

    x, y = bt.make_ids(args.warmup + args.chunks * args.steps + 5)
    opts = bt.parse_args(["--quick"])
    models = {(f, d): bt.Runner(args.kind, x, y, opts) for f in (False, True)
              for d in (False, True)}
    times = {key: [] for key in models}

    def fit(key, steps, record):
        r = models[key]
        a, b = r.next, r.next + steps
        r.next = b
        top.FUSED, lk.DIRECT_FORWARD = key
        clock = bt.clock_callback()
        r.model.fit(bt.dataset(x[a:b], y[a:b], False), epochs=1, steps_per_epoch=steps,
                    verbose=0, callbacks=[clock], shuffle=False)
        if record:
            times[key].append(clock.span()[0] / steps * 1e3)

    for key in models:
        fit(key, args.warmup, False)
    for _ in range(args.chunks):
        for key in models:
            fit(key, args.steps, True)
    print(f"| FUSED | DIRECT_FORWARD | median ms a step ({args.kind}, {args.chunks} x "
          f"{args.steps} steps) | chunks |")
    print("|---|---|---:|---|")
    for (f, d), t in times.items():
        print(f"| {f} | {d} | {statistics.median(t):.2f} | "
              f"{', '.join(f'{v:.1f}' for v in t)} |")
    print(f"\nload average after: {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
