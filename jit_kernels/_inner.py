"""``@inner``: ``@njit`` for helpers that only other kernels call.

Numba compiles every ``@njit`` function it meets with two wrappers beside the
function itself: a CPython wrapper (to call it from Python) and a C wrapper (to
pass it as a first-class function value), and turns both into machine code.  A
helper that only kernels call (``first_slot``, ``find_row``, an initializer's
fill, ...) never needs either, yet they are most of its compile: a one-line
helper compiles in about 35 ms, 11 ms without them (a kernel calling 24 such
helpers, cold: 1.03 -> 0.45 s).  A cold process compiles a few dozen of them.

``@inner`` builds the helper without the wrappers (Numba's ``no_cpython_wrapper``
and ``no_cfunc_wrapper`` flags, which its own ``@overload`` functions use) for
callers in compiled code, and hands a call *from Python* (a test, a doctest, the
CUDA simulator's bodies) to a twin compiled with them, so no call can reach the
missing entry point.  The twin has its own name (suffix ``__py``) and so its own
cache files: a wrapperless build is never loaded where a wrapper is needed.  GPU
kernels compile the helper's Python function for the GPU, as they do an
``@njit`` one (its target options are those of ``@njit``).

>>> @inner(cache=False)         # (a doctest's function has no file to cache in)
... def twice(x):
...     return 2 * x
>>> twice(21)                   # from Python: the twin
42
>>> from numba import njit
>>> njit(lambda x: twice(x) + 1)(20)   # from a kernel: the wrapperless build
41
"""
from numba.core import dispatcher as _dispatcher
from numba.core.registry import CPUDispatcher

from ._twins import twin_of


class _Compiler(_dispatcher._FunctionCompiler):
    def _customize_flags(self, flags):
        flags.no_cpython_wrapper = True
        flags.no_cfunc_wrapper = True
        return flags


class InnerDispatcher(CPUDispatcher):
    """A ``CPUDispatcher`` whose builds have no wrappers; Python calls go to
    :meth:`python_twin`."""

    def __init__(self, py_func, locals=None, targetoptions=None, **kw):
        super().__init__(py_func, locals, targetoptions, **kw)
        self._compiler = _Compiler(py_func, self.targetdescr, self.targetoptions,
                                   self.locals, self._compiler.pipeline_class)
        self._twin = None

    def python_twin(self):
        """The same function under ``@njit`` with its wrappers (built on first use)."""
        if self._twin is None:
            self._twin = twin_of(self, "__py")
        return self._twin

    def __call__(self, *args, **kws):
        return self.python_twin()(*args, **kws)


def inner(fn=None, *, cache=True, **options):
    """``@njit(nogil=True, cache=True, **options)`` without the Python-call wrappers
    (see the module doc); usable bare (``@inner``) or with options
    (``@inner(inline="always")``)."""
    def build(f):
        # (the target options njit(nogil=True, **options) gives)
        opts = {"nopython": True, "nogil": True, "boundscheck": None, **options}
        disp = InnerDispatcher(f, targetoptions=opts)
        if cache:
            disp.enable_caching()
        return disp
    return build if fn is None else build(fn)
