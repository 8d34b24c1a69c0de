"""What a distributed job does when a rank dies or raises: it ends, it does not hang.

Each test launches ``mpiexec -n 2`` in a subprocess (with a time limit) on a small
script; skipped without mpi4py and its ``mpiexec``.  Not run under mpiexec itself.
"""
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("mpi4py")
from tests.mpi_launch import MARKS, MPIEXEC  # noqa: E402

pytestmark = MARKS

PRELUDE = """
import os, sys, numpy as np, numbaemb as ne
from mpi4py import MPI
c = MPI.COMM_WORLD
v = ne.Variable(4, comm=c, name="t")
v.find_or_insert(np.arange(100) + c.rank)
"""


def launch(tmp_path, body, module=True):
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    cmd = [MPIEXEC, "-n", "2", sys.executable] + (["-m", "mpi4py"] if module else []) + [str(script)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("module", [True, False])
def test_a_rank_that_dies_ends_the_job(tmp_path, module):
    """Rank 1 exits hard while rank 0 waits in a collective: mpiexec ends both."""
    proc, took = launch(tmp_path, """
        if c.rank == 1:
            os._exit(7)
        v.lookup(np.arange(10))          # rank 0 waits here for rank 1
        print("unreachable", flush=True)
    """, module)
    assert proc.returncode != 0 and "unreachable" not in proc.stdout
    assert took < 100


def test_an_uncaught_exception_aborts_under_m_mpi4py(tmp_path):
    proc, took = launch(tmp_path, """
        if c.rank == 1:
            raise RuntimeError("boom on rank 1")
        v.lookup(np.arange(10))
        print("unreachable", flush=True)
    """)
    assert proc.returncode != 0 and "boom on rank 1" in proc.stderr
    assert "unreachable" not in proc.stdout and took < 100


def test_bad_input_is_an_exception_on_every_rank_and_the_job_goes_on(tmp_path):
    proc, _ = launch(tmp_path, """
        try:
            v.upsert(np.array([1.5] if c.rank else [1]), np.ones((1, 4)))
        except TypeError as e:
            print(f"rank {c.rank} caught: {e}", flush=True)
        print(f"rank {c.rank} size {v.size()}", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    for r in (0, 1):
        assert f"rank {r} caught: rank 1 of 2: keys must hold integers" in proc.stdout
        assert f"rank {r} size 101" in proc.stdout
