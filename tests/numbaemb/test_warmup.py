"""``python -m numbaemb.warmup`` fills the cache a later process's table ops load from."""
import json
import os
import subprocess
import sys

from numbaemb import warmup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COUNT = """
import json, sys
from numba.core.dispatcher import Dispatcher
from jit_kernels._twins import BySize
ours = [d for m in list(sys.modules.values()) if m is not None
        and m.__name__.startswith(("jit_kernels", "numbaemb")) for d in vars(m).values()]
# (a driver that picks its build by size holds both: the table ops' kernels)
seen = [d for d in ours if isinstance(d, Dispatcher)] + \
    [b for d in ours if isinstance(d, BySize) for b in (d.parallel, d.serial)]
print(json.dumps({"misses": sum(sum(d.stats.cache_misses.values()) for d in set(seen)),
                  "hits": sum(sum(d.stats.cache_hits.values()) for d in set(seen))}))
"""

JOB = """
import sys, numpy as np, numbaemb as ne
ids = np.random.default_rng(0).integers(-2**62, 2**62, int(sys.argv[1]))
mode = sys.argv[2] if len(sys.argv) > 2 else ""
bound = {"max_capacity": ids.size // 2} if mode == "bounded" else {}
# not the default initializer: kernels built for its kind
init = ne.initializers.RandomUniform(-0.1, 0.1) if mode == "uniform" else None
if mode == "strings":
    v = ne.Variable(dim=8, key_dtype="string")
    ids = ids.astype(str).astype(object)
else:
    v = ne.Variable(dim=8, initializer=init, **bound)
v.find_or_insert(ids); v.lookup(ids)
ne.optimizers.apply_gradients(v, ne.optimizers.Adam(1e-3),
                              v.ids(ids, insert=True) if mode == "strings" else ids,
                              np.ones((ids.size, 8), np.float32), step=1)
if mode == "strings":
    v.export()
if bound:                   # full: evicting inserts, in ranges of the index
    assert v.size() == ids.size // 2
    v.find_or_insert(ids[::-1].copy())
""" + COUNT


def run(*args, env=None):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


EVERY_GROUP = ("find_or_insert", "lookup", "upsert", "accum", "export", "remove", "SGD", "Adam",
               "Ftrl", "RMSprop", "Adagrad", "SGD momentum", "unique / segment-sum / spread",
               "table growth", "many tables in one kernel call", "bounded tables",
               "string keys: find_or_insert", "string keys: export")


def test_warmup_runs_every_group_and_then_the_table_job_compiles_nothing():
    """Small batches run the serial twins, large ones the parallel builds: both cached.
    (The warmup runs in one process here, on the shared cache the other tests fill:
    compiling everything again in private caches took 140 s of the suite.  It prints
    what it ran: an in-process ``warm()`` checking that as well took 37 s more.)"""
    proc = run("-m", "numbaemb.warmup", "--jobs", "1")
    assert "compiled and cached" in proc.stderr
    ran = {line.strip().rsplit(":", 1)[0] for line in proc.stdout.splitlines()
           if line.startswith("  ")}
    assert set(EVERY_GROUP) <= ran, set(EVERY_GROUP) - ran
    for args in (("1000",), ("300000",), ("1000", "bounded"), ("10000", "bounded"),
                 ("1000", "strings"), ("1000", "uniform"), ("300000", "uniform")):
        got = json.loads(run("-c", JOB, *args).stdout.strip().splitlines()[-1])
        assert got["misses"] == 0 and got["hits"] > 0, (args, got)


def test_a_warmup_in_worker_processes_fills_an_empty_cache(tmp_path):
    """``--jobs 2``: each worker compiles its share of the tasks in a cache of its own and
    the caches merge into this one; a later process there compiles nothing.  Two groups
    that compile fastest, a worker each: string keys (a job of string-keyed table ops
    and an Adam step) and the multi-table kernels (run again).  The whole warmup is the
    test above; this one with the table group's two builds took 73 s of the suite on a
    2-core VM, with the optimizers' group too 99 s."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "NUMBAEMB_PREBUILT": "0"}
    out = run("-m", "numbaemb.warmup", "-q", "--jobs", "2", "--groups",
              "string keys,many tables", env=env).stderr
    assert "(2 processes)" in out
    again = "from numbaemb import warmup; warmup.warm(groups=['many tables'])" + COUNT
    for args in (("-c", JOB, "1000", "strings"), ("-c", again)):
        got = json.loads(run(*args, env=env).stdout.strip().splitlines()[-1])
        assert got["misses"] == 0 and got["hits"] > 0, (args[2:], got)


def test_warmup_groups_are_checked():
    assert [t[3] for t in warmup.tasks(groups=["bounded"])] == ["bounded"]
    proc = subprocess.run([sys.executable, "-m", "numbaemb.warmup", "--groups", "tables"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "unknown group 'tables'" in proc.stderr
