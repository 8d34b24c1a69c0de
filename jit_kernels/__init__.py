"""Stateless Numba kernels (NumPy + Numba only; never TensorFlow or CuPy).

Each algorithm is written once as a per-element ``@njit`` body
(``probing``, ``initializers``) and driven by ``prange`` loops on the CPU
(``cpu_table``) or grid-stride kernels on CUDA.
"""
import os as _os

from ._cache import register as _register

_register(_os.path.dirname(_os.path.abspath(__file__)))   # caches notice edits to inlined bodies
