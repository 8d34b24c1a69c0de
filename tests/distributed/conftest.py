"""Tests of tables split across MPI ranks: run them under ``mpiexec`` (``tox -e mpi``
runs ``mpiexec -n 2`` and ``mpiexec -n 3``, each under a time limit).

Every rank runs every test in the same order; hypothesis is derandomized (and keeps
no example database) so the ranks draw the same examples, and every check is a
collective verdict (:func:`agree`), so a failure fails, and shrinks, on every rank
alike instead of leaving the others waiting in a collective.  Under a plain
``pytest`` (one rank) the multi-rank tests skip.
"""
import os

import pytest
from hypothesis import HealthCheck, settings

MPI = pytest.importorskip("mpi4py.MPI", reason="needs mpi4py (pip install '.[mpi]')")
COMM = MPI.COMM_WORLD
RANK, WORLD = COMM.Get_rank(), COMM.Get_size()
LONG = os.environ.get("NUMBAEMB_LONG") == "1"

settings.register_profile("mpi", max_examples=300 if LONG else 15,
                          stateful_step_count=30 if LONG else 12, deadline=None,
                          derandomize=True, database=None, print_blob=False,
                          suppress_health_check=list(HealthCheck))

multi_rank = pytest.mark.skipif(WORLD < 2, reason="run under mpiexec -n 2 or more (tox -e mpi)")


def agree(ok, what=""):
    """Assert ``ok`` on every rank at once (all fail if any rank's check failed);
    ``what`` a string or a function that gives one (called only on a failure)."""
    oks = COMM.allgather(bool(ok))
    if not all(oks):
        what = what() if callable(what) else what
        assert False, f"check failed on ranks {[r for r, o in enumerate(oks) if not o]}: {what}"


def shared_tmpdir(tmp_path_factory):
    """A directory every rank sees (rank 0's temporary directory)."""
    return COMM.bcast(str(tmp_path_factory.mktemp("ckpt")) if RANK == 0 else None)


def pytest_configure(config):
    if RANK > 0:                # one rank's report is enough; every rank's exit code counts
        config.option.verbose = -1
