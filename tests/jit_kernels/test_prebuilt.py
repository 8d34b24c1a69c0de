"""Prebuilt kernels (jit_kernels.prebuilt): Numba cache files merged, shipped and seeded."""
import glob
import json
import os
import subprocess
import sys
import time

import pytest

from jit_kernels import _build, _cache, prebuilt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_locators = pytest.mark.skipif(
    bool(os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES")) or _cache._locators()[0] is None,
    reason="Numba's own cache locators are in use")

FUNC = """
from numba import njit

@njit(cache=True)
def f(x):
    return x * 2 + 1
"""

CALL = """
import sys
sys.path.insert(0, {tmp!r})
import mod
for a in sys.argv[1:]:
    print(mod.f(int(a) if a.isdigit() else float(a)))
print(sum(mod.f.stats.cache_hits.values()), sum(mod.f.stats.cache_misses.values()))
"""


def _run(code, *args, env=None, cwd=ROOT):
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split("\n")


def _only_dir(cache):
    (sub,) = glob.glob(os.path.join(cache, "*"))
    return sub


def test_merge_joins_the_signatures_several_caches_compiled(tmp_path):
    """Two processes, two caches, one signature each: the merged cache serves both."""
    (tmp_path / "mod.py").write_text(FUNC)
    code = CALL.format(tmp=str(tmp_path))
    for name, arg in (("a", "3"), ("b", "1.5")):
        out = _run(code, arg, env={"NUMBA_CACHE_DIR": str(tmp_path / name)})
        assert out[-2] == "0 1"                                  # compiled here
    merged = tmp_path / "merged"
    assert prebuilt.merge([_only_dir(tmp_path / "a"), _only_dir(tmp_path / "b")],
                          str(merged)) == 1
    target = tmp_path / "c"
    os.makedirs(target)
    # the same sub-directory Numba picks for mod.py under c/
    sub = target / os.path.basename(_only_dir(tmp_path / "a"))
    os.rename(merged, sub)
    out = _run(code, "3", "1.5", env={"NUMBA_CACHE_DIR": str(target)})
    assert out[:2] == ["7", "4.0"] and out[-2] == "2 0"         # both loaded, none compiled
    # merging again adds nothing; a merge into a cache keeps the entries it has
    assert prebuilt.merge([_only_dir(tmp_path / "a")], str(sub), first=prebuilt.live_start()) == 0
    assert len(glob.glob(str(sub / "*.nbc"))) == 2


def test_merge_skips_indexes_of_other_sources(tmp_path):
    (tmp_path / "mod.py").write_text(FUNC)
    code = CALL.format(tmp=str(tmp_path))
    _run(code, "3", env={"NUMBA_CACHE_DIR": str(tmp_path / "a")})
    (tmp_path / "mod.py").write_text(FUNC.replace("x * 2 + 1", "x * 2 + 2"))
    _run(code, "1.5", env={"NUMBA_CACHE_DIR": str(tmp_path / "b")})
    merged = str(tmp_path / "merged")
    prebuilt.merge([_only_dir(tmp_path / "b"), _only_dir(tmp_path / "a")], merged)
    (index,) = glob.glob(os.path.join(merged, "*.nbi"))
    # the stale source's signature is not taken: one entry, the current source's
    assert len(prebuilt._read_index(index)[2]) == 1
    assert len(glob.glob(os.path.join(merged, "*.nbc"))) == 1


JOB = """
import json, sys, numpy as np
import numbaemb as ne
from numba.core.dispatcher import Dispatcher
from jit_kernels import prebuilt
ids = np.array([-2**63, 2**63 - 1, -1, 0, 5, 5, 17])
v = ne.Variable(dim=4, initializer=ne.initializers.RandomNormal(seed=3))
v.find_or_insert(ids)
out = v.lookup(ids)
if len(sys.argv) > 1:
    print(prebuilt.collect(sys.argv[1]), file=sys.stderr)
seen = {d for m in list(sys.modules.values()) if m is not None
        and m.__name__.startswith(("jit_kernels", "numbaemb"))
        for o in vars(m).values()           # (a BySize driver holds two dispatchers)
        for d in (o, getattr(o, "serial", None), getattr(o, "parallel", None))
        if isinstance(d, Dispatcher)}
print(json.dumps({"out": out.tolist(),
                  "hits": sum(sum(d.stats.cache_hits.values()) for d in seen),
                  "misses": sum(sum(d.stats.cache_misses.values()) for d in seen)}))
"""


@needs_locators
def test_a_prebuilt_set_starts_an_empty_cache_warm(tmp_path):
    pre = str(tmp_path / "prebuilt")
    env = {"NUMBAEMB_PREBUILT": "0"}
    made = json.loads(_run(JOB, pre, env=dict(env, NUMBA_CACHE_DIR=str(tmp_path / "a")))[-2])
    assert made["misses"] > 0
    manifest = json.load(open(os.path.join(pre, "manifest.json")))
    assert manifest["functions"] > 5 and manifest["numba"] and manifest["magic"]
    # a new process, an empty cache, the prebuilt set: nothing compiles, same values
    env = {"NUMBAEMB_PREBUILT": pre, "NUMBA_CACHE_DIR": str(tmp_path / "b")}
    got = json.loads(_run(JOB, env=env)[-2])
    assert got["misses"] == 0 and got["hits"] > 0 and got["out"] == made["out"]
    assert glob.glob(str(tmp_path / "b" / "*" / ".numbaemb-prebuilt-*"))
    # without it (the control): the same job compiles
    env = {"NUMBAEMB_PREBUILT": "0", "NUMBA_CACHE_DIR": str(tmp_path / "c")}
    assert json.loads(_run(JOB, env=env)[-2])["misses"] > 0


SEED = """
import sys
from jit_kernels import prebuilt
print(prebuilt.seed(sys.argv[1]), prebuilt.seed(sys.argv[1]))
"""


@needs_locators
@pytest.mark.parametrize("field", ["magic", "numba", "fingerprint", None])
def test_a_prebuilt_set_for_another_machine_is_left_alone(tmp_path, field):
    """Seeding copies only where the manifest matches this process, and only once."""
    pre = tmp_path / "prebuilt"
    (tmp_path / "mod.py").write_text(FUNC)
    _run(CALL.format(tmp=str(tmp_path)), "3", env={"NUMBA_CACHE_DIR": str(tmp_path / "a")})
    for package in prebuilt.PACKAGES:            # any cache files will do here
        prebuilt.merge([_only_dir(tmp_path / "a")], str(pre / package))
    prebuilt.write_manifest(str(pre), 1)
    if field:
        manifest = json.load(open(pre / "manifest.json"))
        manifest[field] = "another"
        (pre / "manifest.json").write_text(json.dumps(manifest))
    cache = tmp_path / "cache"
    out = _run(SEED, str(pre), env={"NUMBA_CACHE_DIR": str(cache)})
    copied = glob.glob(str(cache / "*" / "*.nbi"))
    if field:
        assert out[0] == "0 0" and not copied
    else:
        assert out[0] == "2 0" and len(copied) == 2              # once, into both packages


def test_seeding_is_off_with_the_variable_at_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBAEMB_PREBUILT", "0")
    assert prebuilt.seed(str(tmp_path)) == 0
    monkeypatch.setenv("NUMBAEMB_PREBUILT", str(tmp_path))       # no manifest there
    assert prebuilt.seed() == 0


def test_a_build_that_cannot_compile_ships_no_prebuilt_set(tmp_path, capsys, monkeypatch):
    """The wheel hook: a failing warmup leaves no partial set behind and does not fail
    the build.  The warmup here is a stand-in found on ``PYTHONPATH`` (where pip's
    isolated build environment puts Numba), which the hook must keep."""
    build = tmp_path / "build"
    (build / "jit_kernels" / "prebuilt").mkdir(parents=True)
    (build / "jit_kernels" / "prebuilt" / "half.nbi").write_text("")
    (tmp_path / "env" / "numbaemb").mkdir(parents=True)
    (tmp_path / "env" / "numbaemb" / "__init__.py").write_text("")
    (tmp_path / "env" / "numbaemb" / "warmup.py").write_text("raise RuntimeError('no numba')")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "env"))
    assert _build.prebuild(str(build), timeout=120) is False
    assert not (build / "jit_kernels" / "prebuilt").exists()
    err = capsys.readouterr().err
    assert "no prebuilt kernels" in err and "no numba" in err


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("NUMBAEMB_LONG"), reason="NUMBAEMB_LONG=1 (minutes)")
def test_a_wheel_ships_the_prebuilt_kernels(tmp_path):
    import zipfile
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), ROOT], check=True, timeout=1800)
    (wheel,) = glob.glob(str(tmp_path / "*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    manifest = json.loads(zipfile.ZipFile(wheel).read("jit_kernels/prebuilt/manifest.json"))
    assert manifest == dict(manifest, **prebuilt.this_process())
    assert sum(n.endswith(".nbi") for n in names) == manifest["functions"] > 50


@needs_locators
def test_processes_seeding_one_cache_at_once_copy_it_once(tmp_path):
    """The ranks of a job importing numbaemb together: one merges, the others wait for
    it and find the marker; no second copy of the files is left behind."""
    pre = tmp_path / "prebuilt"
    (tmp_path / "mod.py").write_text(FUNC)
    _run(CALL.format(tmp=str(tmp_path)), "3", env={"NUMBA_CACHE_DIR": str(tmp_path / "a")})
    for package in prebuilt.PACKAGES:
        prebuilt.merge([_only_dir(tmp_path / "a")], str(pre / package))
    prebuilt.write_manifest(str(pre), 1)
    cache = tmp_path / "cache"
    from numba.core.caching import UserProvidedCacheLocator
    first = cache / UserProvidedCacheLocator.get_suitable_cache_subpath(
        os.path.join(prebuilt.PACKAGES["jit_kernels"], "__init__.py"))
    first.mkdir(parents=True)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    with _cache.locked(str(first / ".numbaemb-prebuilt.lock")):   # held: they must wait
        procs = [subprocess.Popen([sys.executable, "-c", SEED, str(pre)], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True) for _ in range(4)]
        time.sleep(4)
        assert not glob.glob(str(cache / "*" / "*.nbc"))
    outs = sorted(p.communicate(timeout=300)[0].split()[0] for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(o) for o in outs) == 2                    # one function, two packages
    assert len(glob.glob(str(cache / "*" / "*.nbc"))) == 2
