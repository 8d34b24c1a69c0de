"""Cold start: import and the first call of each public operation, in fresh processes,
with an empty Numba cache (cold) and again with the cache the cold run filled (warm).

    python benchmarks/bench_compile.py                 # table, optimizers, TF layer, CUDA simulator
    python benchmarks/bench_compile.py --no-tf --no-cudasim

Each scenario runs in a new Python process with ``NUMBA_CACHE_DIR`` set to a new empty
directory and no prebuilt kernels (cold: a source checkout, an editable install, or a
wheel whose prebuilt kernels do not fit this machine), in a new process with another
empty directory and the prebuilt kernels a wheel build ships (prebuilt: a new user
after ``pip install``, a fresh container or node of an image; see
``jit_kernels.prebuilt``), then in a new process with the directory the cold run filled
(warm): what every later process pays.  "cold, no helper": cold with
``NUMBAEMB_COMPILE_AHEAD=0`` (no helper process compiling the step's kernels on
another core, ``numbaemb._ahead``): one core's compile.  ``--together N``: the table job
in N processes started at once on one empty cache, kernels compiled once across them
(``jit_kernels._compile_lock``) or by each; ``--ranks R,R``: the same job on a table
split across R MPI ranks (``mpiexec -n R``), the slowest rank's time.  The prebuilt set
is made first, as a wheel build makes it (``python -m numbaemb.warmup --prebuilt DIR``, one worker process a
CPU), and its time is reported: what ``pip install`` adds.

* ``table``: the issue's job: ``import numbaemb``; ``Variable(dim=8)`` (the default
  initializer, zeros); ``find_or_insert``, ``lookup`` and one ``Adam`` step on 1,000
  int64 ids.  Target: 2 s cold, 0.3 s warm.
* ``optimizers``: the table ops with ``RandomNormal`` initial values, then the first step
  of each optimizer (SGD, SGD with momentum, Adagrad, Adam, FTRL, RMSprop).
* ``strings``: a ``key_dtype="string"`` table's insert, lookup, Adam step and export.
* ``tf``: ``import tensorflow`` (TF's own start-up, not ours), ``import tf_bridge``, then
  the first ``model.fit`` step of ``de.keras.layers.Embedding(8)`` -> Dense(1) and,
  for comparison, of the same model with ``keras.layers.Embedding``.  Target: ours
  within 5 s cold beyond TF's start-up.
* ``tf_multi``: the first ``model.fit`` step of ``de.keras.layers.MultiEmbedding([8] * 3)``
  (three tables looked up and stepped by one kernel each, ``numbaemb.multi``).
* ``cudasim``: ``NUMBA_ENABLE_CUDASIM=1``: the GPU table's first ``find_or_insert`` and
  ``lookup`` (the simulator interprets the kernels: no compile, Python speed).

"specializations": the machine-code variants Numba compiled or loaded in the process
(every signature of every dispatcher in ``jit_kernels`` and ``numbaemb``); "cache":
loaded from / written to the cache.  The limit: a process that compiles nothing does
each step in milliseconds (the warm column is close to it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

T0 = time.perf_counter()        # (a child's start, for the MPI scenario's figure)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_TABLE_COLD, TARGET_TABLE_WARM, TARGET_TF_COLD = 2.0, 0.3, 5.0


def _dispatchers():
    """Every Numba dispatcher defined in jit_kernels and numbaemb modules."""
    from numba.core.dispatcher import Dispatcher
    out = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(("jit_kernels", "numbaemb")):
            continue
        for obj in vars(mod).values():
            # a driver that picks a build by size (jit_kernels._twins.BySize, the optimizer
            # drivers) holds its parallel and serial dispatchers
            for d in (obj, getattr(obj, "parallel", None), getattr(obj, "serial", None)):
                if isinstance(d, Dispatcher) and d not in out:
                    out.append(d)
    return out


def _counts():
    n = hits = misses = 0
    compile_s = {}
    for d in _dispatchers():
        n += len(d.signatures)
        hits += sum(d.stats.cache_hits.values())
        misses += sum(d.stats.cache_misses.values())
        for cres in d.overloads.values():
            timers = (getattr(cres, "metadata", None) or {}).get("timers", {})
            if timers:                  # compiled here (a cache load has no timers)
                name = f"{d.py_func.__module__.split('.')[-1]}.{d.py_func.__name__}"
                compile_s[name] = compile_s.get(name, 0.0) + timers.get("compiler_lock", 0.0)
    return {"specializations": n, "cache_hits": hits, "cache_misses": misses,
            "compile_s": compile_s}


def _timed(times, label, fn):
    t0 = time.perf_counter()
    out = fn()
    times[label] = time.perf_counter() - t0
    return out


def child(scenario):
    import numpy as np
    times = {}
    if scenario in ("tf", "tf_multi"):
        _timed(times, "import tensorflow", lambda: __import__("tensorflow"))
    if scenario == "cudasim":
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    ne = _timed(times, "import numbaemb", lambda: __import__("numbaemb"))
    ids = np.random.default_rng(0).integers(-2**62, 2**62, 1000)
    grads = np.ones((1000, 8), np.float32)
    if scenario in ("table", "optimizers"):
        # the issue's job: the default initializer (zeros); the optimizers' run: a normal one
        init = ne.initializers.RandomNormal(seed=1) if scenario == "optimizers" else None
        v = ne.Variable(dim=8, initializer=init)
        _timed(times, "find_or_insert", lambda: v.find_or_insert(ids))
        _timed(times, "lookup", lambda: v.lookup(ids))
        _timed(times, "Adam step", lambda: ne.optimizers.apply_gradients(
            v, ne.optimizers.Adam(1e-3), ids, grads, step=1))
        if scenario == "optimizers":
            opts = {"SGD": ne.optimizers.SGD(0.1),
                    "SGD momentum": ne.optimizers.SGD(0.1, momentum=0.9),
                    "Adagrad": ne.optimizers.Adagrad(0.1), "FTRL": ne.optimizers.Ftrl(0.1),
                    "RMSprop": ne.optimizers.RMSprop(0.1)}
            for name, opt in opts.items():
                w = ne.Variable(dim=8, name=f"opt_{name}")
                _timed(times, f"{name} step", lambda: ne.optimizers.apply_gradients(
                    w, opt, ids, grads, step=1))
    elif scenario == "strings":
        keys = ids.astype(str).astype(object)
        v = ne.Variable(dim=8, key_dtype="string")
        _timed(times, "find_or_insert", lambda: v.find_or_insert(keys))
        _timed(times, "lookup", lambda: v.lookup(keys))
        _timed(times, "Adam step", lambda: ne.optimizers.apply_gradients(
            v, ne.optimizers.Adam(1e-3), v.ids(keys, insert=True), grads, step=1))
        _timed(times, "export", v.export)
    elif scenario == "tf":
        import keras
        import numpy as np
        de = _timed(times, "import tf_bridge", lambda: __import__("tf_bridge"))
        x = np.random.default_rng(0).integers(0, 10**6, (256, 4))
        y = np.ones((256, 1), np.float32)

        def fit(layer, opt):
            inp = keras.Input((4,), dtype="int64")
            out = keras.layers.Dense(1)(keras.layers.Flatten()(layer(inp)))
            model = keras.Model(inp, out)
            model.compile(opt, loss="mse")
            model.fit(x, y, batch_size=256, epochs=1, verbose=0)

        _timed(times, "stock layer: first fit step", lambda: fit(
            keras.layers.Embedding(10**6, 8), keras.optimizers.Adam(1e-3)))
        _timed(times, "numbaemb layer: first fit step", lambda: fit(
            de.keras.layers.Embedding(8), de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(1e-3))))
    elif scenario == "tf_multi":
        import keras
        de = _timed(times, "import tf_bridge", lambda: __import__("tf_bridge"))
        x = np.random.default_rng(0).integers(0, 10**6, (256, 3))
        inp = keras.Input((3,), dtype="int64")
        rows = de.keras.layers.MultiEmbedding([8, 8, 8])([inp[:, i] for i in range(3)])
        model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Concatenate()(rows)))
        model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(1e-3)), loss="mse")
        _timed(times, "MultiEmbedding (3 tables): first fit step", lambda: model.fit(
            x, np.ones((256, 1), np.float32), batch_size=256, epochs=1, verbose=0))
    elif scenario == "mpi_table":      # under mpiexec: a split table's job, every rank
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        v = ne.Variable(dim=8, comm=comm)
        mine = np.random.default_rng(comm.rank).integers(-2**62, 2**62, 1000)
        v.find_or_insert(mine)
        v.lookup(mine)
        ne.optimizers.apply_gradients(v, ne.optimizers.Adam(1e-3), mine, grads, step=1)
        comm.Barrier()
        slowest = comm.allreduce(time.perf_counter() - T0, op=MPI.MAX)
        if comm.rank:
            return
        times["slowest rank, from its start"] = slowest
    elif scenario == "cudasim":
        v = ne.Variable(dim=8, device="cuda")
        _timed(times, "find_or_insert (cudasim)", lambda: v.find_or_insert(ids[:64]))
        _timed(times, "lookup (cudasim)", lambda: v.lookup(ids[:64]))
    from numbaemb import _ahead
    helper, t0 = _ahead.helper(), time.perf_counter()
    if helper is not None:          # (its kernels land in the cache the warm run reads)
        helper.wait(timeout=600)
    print(json.dumps({"times": times, "helper_wait": time.perf_counter() - t0, **_counts()}),
          flush=True)


def _env(cache_dir, prebuilt="0", extra_env=None):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, TF_CPP_MIN_LOG_LEVEL="3",
               NUMBAEMB_PREBUILT=prebuilt,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Python's own bytecode as an installed package has it (pip writes the .pyc files;
    # with PYTHONDONTWRITEBYTECODE, set in some shells, every import would compile
    # numbaemb's sources again: about 45 ms)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra_env or {})
    return env


def _start(scenario, cache_dir, prebuilt="0", extra_env=None):
    env = _env(cache_dir, prebuilt, extra_env)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", scenario],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)


def _result(scenario, proc, t0):
    out, err = proc.communicate(timeout=1800)
    if proc.returncode:
        sys.exit(f"{scenario} failed:\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["process"] = time.perf_counter() - t0 - res.get("helper_wait", 0.0)
    return res


def run(scenario, cache_dir, prebuilt="0", extra_env=None):
    t0 = time.perf_counter()
    return _result(scenario, _start(scenario, cache_dir, prebuilt, extra_env), t0)


def _lock_env(lock):
    return {"NUMBAEMB_COMPILE_LOCK": "1" if lock else "0"}


def _how(lock):
    return "once across them (default)" if lock else "by each (NUMBAEMB_COMPILE_LOCK=0)"


def run_ranks(n, lock):
    """The table job split across ``n`` MPI ranks (``mpiexec -n n``, one shared empty
    cache), kernels compiled once across the ranks or by each.  Returns the slowest
    rank's time from its start, or None without mpi4py / mpiexec."""
    import shutil
    if shutil.which("mpiexec") is None:
        return None
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = _env(cache, extra_env=_lock_env(lock))
        out = subprocess.run(["mpiexec", "-n", str(n), sys.executable, "-m", "mpi4py",
                              os.path.abspath(__file__), "--child", "mpi_table"],
                             capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
        if out.returncode:
            sys.exit(f"mpi_table failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])["times"]["slowest rank, from its start"]


def run_together(n, lock):
    """The table job in ``n`` processes started at once on one empty cache (ranks or
    test workers on a fresh node); ``lock``: kernels compiled once across them
    (``jit_kernels._compile_lock``, the default) or by every process (Numba's way).
    Returns (wall s, kernels compiled in all)."""
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        t0 = time.perf_counter()
        procs = [_start("table", cache, extra_env={**_lock_env(lock), "NUMBAEMB_COMPILE_AHEAD": "0"})
                 for _ in range(n)]
        res = [_result("table", p, t0) for p in procs]
        return time.perf_counter() - t0, sum(r["cache_misses"] for r in res)


def prebuild(build_dir):
    """Make the prebuilt set with the wheel build's own hook (``jit_kernels._build``:
    the checkout's sources come through ``PYTHONPATH``); returns ``(its directory,
    seconds)``."""
    sys.path.insert(0, ROOT)
    from jit_kernels import _build
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    if not _build.prebuild(build_dir):
        sys.exit("the prebuilt set could not be made (see above)")
    return os.path.join(build_dir, "jit_kernels", "prebuilt"), time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-tf", action="store_true")
    ap.add_argument("--no-cudasim", action="store_true")
    ap.add_argument("--no-prebuilt", action="store_true", help="skip the prebuilt column")
    ap.add_argument("--ranks", default="2,4", metavar="R,R",
                    help="also run the table job split across R MPI ranks on one empty cache "
                         "(mpiexec; empty: skip)")
    ap.add_argument("--together", type=int, default=4, metavar="N",
                    help="also run the table job in N processes at once on one empty cache "
                         "(0: skip)")
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    scenarios = ["table", "optimizers", "strings"] + ([] if args.no_tf else ["tf", "tf_multi"]) + (
        [] if args.no_cudasim else ["cudasim"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="numbaemb-prebuilt-") as tmp:
        pre, build_s = (None, None) if args.no_prebuilt else prebuild(tmp)
        for sc in scenarios:
            with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache, \
                    tempfile.TemporaryDirectory(prefix="numba-cache-") as fresh, \
                    tempfile.TemporaryDirectory(prefix="numba-cache-") as alone:
                cold = run(sc, cache)
                solo = run(sc, alone, extra_env={"NUMBAEMB_COMPILE_AHEAD": "0"})
                seeded = None if build_s is None else run(sc, fresh, prebuilt=pre)
                warm = run(sc, cache)
            rows.append((sc, cold, solo, seeded, warm))
            print(f"{sc} done", file=sys.stderr, flush=True)
    together = [(n, lock, *run_together(n, lock)) for n in sorted({1, args.together}) if n
                for lock in (True, False)] if args.together else []
    ranks = [(int(r), lock, run_ranks(int(r), lock)) for r in args.ranks.split(",") if r
             for lock in (True, False)]
    import numba
    print(f"Python {sys.version.split()[0]}, numba {numba.__version__}, cpus {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}; each column a new process, cold: empty "
          "NUMBA_CACHE_DIR, warm: the cache the cold run wrote")
    print()
    if build_s is not None:
        print(f"Prebuilt set (what a wheel build compiles: python -m numbaemb.warmup "
              f"--prebuilt, {os.cpu_count()} worker processes): {build_s:.1f} s")
    print()
    print("| scenario | step | cold s | cold, no helper s | prebuilt s | warm s | cold / warm |")
    print("|---|---|---:|---:|---:|---:|---:|")

    def cell(res, key):
        return "-" if res is None else f"{res['times'][key]:.2f}"

    def counts(res):
        return "-" if res is None else (f"{res['specializations']} ({res['cache_hits']} / "
                                        f"{res['cache_misses']})")

    for sc, cold, solo, seeded, warm in rows:
        for step, t in cold["times"].items():
            w = warm["times"][step]
            print(f"| {sc} | {step} | {t:.2f} | {cell(solo, step)} | {cell(seeded, step)} | "
                  f"{w:.2f} | {t / w if w > 0 else 0:.0f}x |")
        print(f"| {sc} | whole process | {cold['process']:.2f} | {solo['process']:.2f} | "
              f"{'-' if seeded is None else format(seeded['process'], '.2f')} | "
              f"{warm['process']:.2f} | |")
        print(f"| {sc} | specializations (cache loads / writes) | {counts(cold)} | "
              f"{counts(solo)} | {counts(seeded)} | {counts(warm)} | |")
    print()
    for sc, cold, solo, seeded, warm in rows:
        top = sorted(solo["compile_s"].items(), key=lambda kv: -kv[1])[:8]
        if top:
            print(f"{sc}, cold, no helper: compile time of the outermost kernels (their "
                  f"inlined and called kernels included), {sum(solo['compile_s'].values()):.1f} "
                  "s in all: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in top))
    print()
    if together:
        print("The table job in N processes started at once on one empty cache (ranks or "
              "test workers on a fresh node):")
        print()
        print("| N processes | kernels compiled | wall s | kernel signatures compiled in all |")
        print("|---:|---|---:|---:|")
        for n, lock, wall, compiled in together:
            print(f"| {n} | {_how(lock)} | {wall:.2f} | {compiled} |")
        print()
    if any(t is not None for *_, t in ranks):
        print(f"The table job split across R MPI ranks (Variable(comm=...); mpiexec, one empty "
              f"cache; {os.cpu_count()} CPUs: more ranks than CPUs oversubscribe them):")
        print()
        print("| R ranks | kernels compiled | slowest rank s |")
        print("|---:|---|---:|")
        for r, lock, t in ranks:
            if t is not None:
                print(f"| {r} | {_how(lock)} | {t:.2f} |")
        print()

    def verdict(t, target):
        return f"{t:.2f} s ({'PASS' if t <= target else 'MISS'} vs {target} s)"

    for sc, cold, solo, seeded, warm in rows:
        if sc == "table":
            c, w = sum(cold["times"].values()), sum(warm["times"].values())
            p = "" if seeded is None else (", after pip install (prebuilt) "
                                           + verdict(sum(seeded["times"].values()),
                                                     TARGET_TABLE_COLD))
            print(f"Target, import + find_or_insert + lookup + Adam step: cold "
                  f"{verdict(c, TARGET_TABLE_COLD)} (no helper {sum(solo['times'].values()):.2f}"
                  f" s){p}, warm {verdict(w, TARGET_TABLE_WARM)}")
        if sc == "tf":
            step = "numbaemb layer: first fit step"
            p = "" if seeded is None else (", after pip install (prebuilt) "
                                           + verdict(seeded["times"][step], TARGET_TF_COLD))
            print(f"Target, TF layer's first training step: cold "
                  f"{verdict(cold['times'][step], TARGET_TF_COLD)} (no helper "
                  f"{solo['times'][step]:.2f} s){p}; the stock layer's "
                  f"first step {cold['times']['stock layer: first fit step']:.2f} s, TF's "
                  f"import {cold['times']['import tensorflow']:.2f} s")


if __name__ == "__main__":
    main()
