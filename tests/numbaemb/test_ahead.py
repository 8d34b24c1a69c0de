"""A cold start's helper process (numbaemb._ahead): what it compiles, when it starts."""
import json
import os
import subprocess
import sys

import numpy as np

import numbaemb as ne
from numbaemb import _ahead
from tests.compile_log import log, needs_locks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# inserts and lookups, then (with the helper done) an optimizer step: a float64 table
# with uniform initial values and FTRL, so the plan must carry each of them; the step's
# new ids make its insert count the absent ones first
JOB = """
import json
import numpy as np
import numbaemb as ne
from numbaemb import _ahead
""" + log() + """
v = ne.Variable(dim=5, value_dtype="float64", initializer=ne.initializers.RandomUniform(seed=2))
opt = ne.optimizers.Ftrl(learning_rate=0.3)
ids = np.array([0, -1, 2**63 - 1, -2**63, 9, 9, 4], np.int64)
v.find_or_insert(ids)
first = v.lookup(ids).tolist()
helper = _ahead.helper()
code = None if helper is None else helper.wait(timeout=300)
step_ids = np.concatenate([ids, np.arange(100, 140)])    # new ids: the insert counts them
ne.optimizers.apply_gradients(v, opt, step_ids, np.arange(235.0).reshape(47, 5), step=1)
print(json.dumps({"compiled": compiled, "helper": code, "first": first,
                  "after": v.lookup(ids).tolist()}))
"""


def _job(cache_dir, ahead):
    proc = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True,
                          timeout=600, cwd=ROOT,
                          env=dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir),
                                   NUMBAEMB_COMPILE_AHEAD=ahead))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().split("\n")[-1])


@needs_locks
def test_a_cold_process_loads_the_step_kernels_its_helper_compiled(tmp_path):
    alone = _job(tmp_path / "alone", "0")        # turned off: no helper, it compiles all
    helped = _job(tmp_path / "helped", "1")
    assert alone["helper"] is None and helped["helper"] == 0     # it ran and ended well
    assert helped["first"] == alone["first"] and helped["after"] == alone["after"]
    step = {"jit_kernels.optimizers._ftrl_rows__serial", "jit_kernels.segment._unique_serial",
            "jit_kernels.segment._segment_sum_serial", "jit_kernels.cpu_table.find_rows__serial"}
    assert step <= set(alone["compiled"])
    assert not step & set(helped["compiled"])           # loaded what the helper compiled
    # a warm process starts no helper
    warm = _job(tmp_path / "helped", "1")
    assert warm["helper"] is None and warm["compiled"] == []


def test_the_plan_follows_the_last_table_and_optimizer(monkeypatch):
    monkeypatch.setattr(_ahead, "_LAST", dict(_ahead._LAST))
    v = ne.Variable(dim=3, value_dtype=np.float64,
                    initializer=ne.initializers.TruncatedNormal(stddev=0.2, seed=7))
    opt = ne.optimizers.RMSprop(learning_rate=0.2, centered=True)
    v.find_or_insert(np.arange(70, dtype=np.int64))
    plan = json.loads(json.dumps(_ahead.plan()))       # (JSON, as the helper gets it)
    assert plan["n"] == 70 and plan["dim"] == 3 and plan["value_dtype"] == "float64"
    assert ne.initializers.from_config(plan["initializer"]) == v.initializer
    name, fields = plan["optimizer"]
    assert getattr(ne.optimizers, name)(**fields) == opt
    del v, opt                                          # the plan does not keep them alive
    import gc
    gc.collect()
    assert _ahead.plan()["optimizer"] == ["Adam", {}] and _ahead.plan()["dim"] == 8


def test_the_plan_skips_tables_no_optimizer_trains(monkeypatch):
    """A string table makes its own int64 table of spans after itself: the plan keeps
    the string table's settings (and an int table is never its subject)."""
    monkeypatch.setattr(_ahead, "_LAST", dict(_ahead._LAST))
    v = ne.Variable(dim=6, key_dtype="string", value_dtype=np.float64)
    counts = ne.Variable(dim=2, value_dtype=np.int32)
    plan = _ahead.plan()
    assert (plan["dim"], plan["value_dtype"]) == (6, "float64")
    del v, counts


def test_enabled_only_with_two_cpus_and_not_under_mpi(monkeypatch):
    monkeypatch.setenv("NUMBAEMB_COMPILE_AHEAD", "1")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert _ahead.enabled()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert not _ahead.enabled()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())
    assert not _ahead.enabled()
    monkeypatch.delitem(sys.modules, "mpi4py.MPI")
    monkeypatch.setenv("NUMBAEMB_COMPILE_AHEAD", "0")
    assert not _ahead.enabled()


# tables looked up together (numbaemb.multi): the helper first compiles the kernel that
# steps them together; SGD from constant rows, so the result is known by hand
MULTI = """
import json
import numpy as np
import numbaemb as ne
from numbaemb import _ahead
from numbaemb.multi import apply_many, lookup_many
""" + log() + """
a, b = ne.Variable(dim=2, initializer=1.0), ne.Variable(dim=3, initializer=1.0)
opt = ne.optimizers.SGD(learning_rate=0.5)
keys = [np.array([2**63 - 1, -1]), np.array([0, -2**63, 0])]
looked = lookup_many([a, b], keys, unique=True)
helper = _ahead.helper()
code = None if helper is None else helper.wait(timeout=600)
uniq = [np.array([2**63 - 1, -1]), np.array([0, -2**63])]
apply_many([a, b], opt, uniq, [np.ones((2, 2), np.float32), np.ones((3, 3), np.float32)],
           [np.array([0, 1]), np.array([0, 1, 0])], [None, None], step=1)
print(json.dumps({"compiled": compiled, "helper": code,
                  "a": a.lookup(uniq[0]).tolist(), "b": b.lookup(uniq[1]).tolist()}))
"""


@needs_locks
def test_tables_looked_up_together_get_their_joint_step_compiled_ahead(tmp_path):
    proc = subprocess.run([sys.executable, "-c", MULTI], capture_output=True, text=True,
                          timeout=600, cwd=ROOT,
                          env=dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path),
                                   NUMBAEMB_COMPILE_AHEAD="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().split("\n")[-1])
    assert out["helper"] == 0
    assert "jit_kernels.multi.lookup_tables" in out["compiled"]
    assert "jit_kernels.multi.apply_tables" not in out["compiled"]     # the helper's
    assert out["a"] == [[0.5, 0.5], [0.5, 0.5]]
    assert out["b"] == [[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]


def test_a_disabled_process_starts_no_helper(monkeypatch):
    """What the warmup does for itself (it compiles every kernel), without touching the
    environment its caller keeps."""
    monkeypatch.setattr(_ahead, "_LAST", dict(_ahead._LAST, helper=None))
    monkeypatch.setattr(_ahead, "enabled", lambda: True)
    env = dict(os.environ)
    _ahead.disable()
    assert _ahead.start() is None and _ahead.helper() is None
    assert dict(os.environ) == env
