"""setuptools hook (``[tool.setuptools.cmdclass]`` in pyproject.toml): a wheel build
compiles numbaemb's kernels into ``jit_kernels/prebuilt/`` (see :mod:`jit_kernels.prebuilt`).

After ``build_py`` has copied the sources, ``python -m numbaemb.warmup --prebuilt``
runs on that copy with an empty, temporary ``NUMBA_CACHE_DIR`` and its cache files
go into the wheel.  Skipped for editable installs (their sources change; Numba's
cache beside them does the job), with ``NUMBAEMB_PREBUILD=0``, or where the build
environment cannot compile (no Numba): the wheel is then the plain sources and the
kernels compile on first use.  setuptools loads this file by path, so it imports
nothing from the package.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    from setuptools.command.build_py import build_py as _build_py
except ImportError:             # imported outside a build (e.g. by doctest collection)
    _build_py = object


class BuildPy(_build_py):
    """``build_py``, then the prebuilt kernels into the build directory."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False) or os.environ.get("NUMBAEMB_PREBUILD") == "0":
            return
        prebuild(self.build_lib)


def prebuild(build_lib, timeout=3600):
    """Compile the kernels of the package copy in ``build_lib`` into
    ``build_lib/jit_kernels/prebuilt``; True if it worked (a failure leaves none)."""
    build_lib = os.path.abspath(build_lib)
    out = os.path.join(build_lib, "jit_kernels", "prebuilt")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    print("numbaemb: compiling the kernels into the wheel (NUMBAEMB_PREBUILD=0 skips it)",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="numbaemb-prebuild-") as cache:
        # (pip's isolated build environment is on PYTHONPATH: keep it, the copy first)
        path = os.pathsep.join(p for p in (build_lib, os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, PYTHONPATH=path, NUMBA_CACHE_DIR=cache, NUMBAEMB_PREBUILT="0")
        env.pop("NUMBA_CACHE_LOCATOR_CLASSES", None)
        try:
            proc = subprocess.run([sys.executable, "-m", "numbaemb.warmup", "-q",
                                   "--prebuilt", out], cwd=build_lib, env=env,
                                  capture_output=True, text=True, timeout=timeout)
            ok, why = proc.returncode == 0, proc.stderr[-2000:]
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, why = False, str(e)
    if not ok:
        shutil.rmtree(out, ignore_errors=True)
        print(f"numbaemb: no prebuilt kernels (they compile on first use): {why}",
              file=sys.stderr, flush=True)
        return False
    print(f"numbaemb: kernels prebuilt in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
          flush=True)
    return True
