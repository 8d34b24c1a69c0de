"""Every CUDA kernel launch the tables make compiles for a real GPU (PTX for sm_90).

The simulator runs kernels as Python and accepts code that NVVM rejects; this
test closes that gap on machines without a GPU.  ``tests/cuda_launches.py``
runs the CUDA tables' operations under the simulator in a subprocess and
records each launch's argument types; here each kernel is compiled for those
types with ``numba.cuda.compile_ptx`` (needs NVVM and NVRTC, e.g.
``pip install nvidia-nvvm nvidia-cuda-nvrtc``: ``tox -e ptx``; no GPU).
"""
import os
import pickle
import subprocess
import sys

import pytest

from tests.cuda_support import SIMULATOR

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CC = (9, 0)


def _compiler():
    """numba.cuda when it can compile PTX here (the real target, not the simulator)."""
    if SIMULATOR:
        return None
    try:
        from jit_kernels import cuda_table
        cuda = cuda_table.cuda_api()

        def probe(a):
            a[0] = 1
        cuda.compile_ptx(probe, "void(int64[:])", cc=CC)
        return cuda
    except Exception:  # noqa: BLE001 - no numba-cuda, NVVM or NVRTC here
        return None


CUDA = _compiler()
pytestmark = [pytest.mark.ptx, pytest.mark.skipif(
    CUDA is None, reason="needs numba-cuda with NVVM and NVRTC, without the simulator "
                         "(tox -e ptx)")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The launches of the workload's parts, each recorded by its own simulator process,
    all at once (on a 2-core VM 35 s each and 101 s for the whole workload in one; 19 and
    12 s alone since the simulator waits for its threads, `quiet_simulator_blocks`)."""
    from tests.cuda_launches import PARTS
    tmp = tmp_path_factory.mktemp("launches")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    outs = [tmp / f"launches{p}.pkl" for p in range(len(PARTS))]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.cuda_launches", str(out), str(p)],
                              cwd=ROOT, env=env) for p, out in enumerate(outs)]
    try:
        codes = [proc.wait(timeout=900) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert codes == [0] * len(PARTS), codes
    got = {"kernels": None, "launches": set(), "errors": []}
    for out in outs:
        with open(out, "rb") as f:
            part = pickle.load(f)
        assert got["kernels"] in (None, part["kernels"])   # every part saw the same kernels
        got["kernels"] = part["kernels"]
        got["launches"] |= part["launches"]
        got["errors"] += part["errors"]
    return got


def test_the_workload_launches_every_kernel(recorded):
    assert recorded["errors"] == []
    launched = {name for name, _ in recorded["launches"]}
    assert set(recorded["kernels"]) - launched == set(), \
        "extend tests/cuda_launches.workload so that it launches these kernels"
    assert len(recorded["launches"]) > len(recorded["kernels"])   # several type sets


class _Target:
    """What numba-cuda asks of the current device when it compiles a device function."""
    compute_capability = CC


def test_every_launch_compiles_for_a_gpu(recorded, monkeypatch):
    import importlib
    dispatcher = importlib.import_module(type(CUDA.jit(lambda: None)).__module__)
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: _Target)   # no GPU here
    from jit_kernels import cuda_table
    K = cuda_table._kernels()
    failed = []
    for name, types in sorted(recorded["launches"], key=str):
        try:
            ptx, _ = CUDA.compile_ptx(getattr(K, name).py_func, types, cc=CC)
            assert ".entry" in ptx
        except Exception as e:  # noqa: BLE001 - collect them all
            msg = " ".join(str(e).split())[:400]
            failed.append(f"{name}: {type(e).__name__}: {msg} (argument types {types})")
    assert failed == [], "\n".join(failed)
