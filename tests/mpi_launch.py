"""For tests that launch ``mpiexec`` jobs in a subprocess: where ``mpiexec`` is, and the
marks that skip them without it (or when already running under mpiexec)."""
import os
import shutil
import sys

import pytest

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))
MARKS = [pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)"),
         pytest.mark.skipif("PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ,
                            reason="already under mpiexec")]
