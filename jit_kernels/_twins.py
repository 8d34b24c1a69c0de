"""Serial twins of ``prange`` drivers, and drivers that pick one by the amount of work.

A parallel launch costs tens of microseconds on an idle machine and up to
a millisecond or more when the cores are busy (the workers sleep after a short
spin, see :mod:`numbaemb`), so small batches run a serial build of the same Python function
(:func:`serial_twin`); :class:`BySize` makes a driver that chooses per call,
by :func:`jit_kernels.segment.threads_for` (``PARALLEL_MIN``).
"""
import functools
import types

from numba import njit


def twin_of(dispatcher, suffix, helpers=None, **options):
    """An ``@njit`` build of ``dispatcher``'s Python function under the name + ``suffix``,
    with its options (and caching) but ``options``; ``helpers``: names of its module's
    globals bound to other functions in the twin (the same kernel on another layout,
    :mod:`jit_kernels.bucket_reads`).

    The copy gets its own ``__qualname__``: Numba's on-disk cache is named by qualname
    and keyed by signature, not by the build's flags, so a twin under the same name
    would load the other build's machine code.
    """
    fn = dispatcher.py_func
    names = fn.__globals__ if not helpers else {**fn.__globals__, **helpers}
    twin = types.FunctionType(fn.__code__, names, fn.__name__ + suffix,
                              fn.__defaults__, fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + suffix
    twin.__doc__ = fn.__doc__
    twin.__module__ = fn.__module__
    opts = {k: v for k, v in dispatcher.targetoptions.items() if k != "nopython"}
    opts.update(options)
    cached = type(dispatcher._cache).__name__ != "NullCache"
    return njit(cache=cached, **opts)(twin)


def serial_twin(dispatcher):
    """The ``parallel=False`` build of a ``@njit(parallel=True)`` driver (``prange`` is
    ``range`` there), from the same Python function (suffix ``__serial``)."""
    return twin_of(dispatcher, "__serial", parallel=False)


class BySize:
    """A parallel driver and its serial twin, called alike: the twin while the call's
    work (``args[n_arg].shape[0]`` items, each ``args[width_arg].shape[1] // 2`` units
    when given: a row of that width) is below ``PARALLEL_MIN``; ``serial_args(args)``,
    when given, the twin's arguments instead of ``args`` (e.g. one thread's share where
    the caller names a thread count).  Other attributes are the parallel dispatcher's.
    Either build compiles on its first use only."""

    def __init__(self, parallel, n_arg, width_arg=None, serial_args=None):
        self.parallel, self.serial = parallel, serial_twin(parallel)
        self._n, self._w, self._serial_args = n_arg, width_arg, serial_args
        functools.update_wrapper(self, parallel.py_func, updated=())

    def __call__(self, *args):
        from .segment import threads_for
        cost = 1 if self._w is None else max(1, args[self._w].shape[1] // 2)
        if threads_for(args[self._n].shape[0], cost) > 1:
            return self.parallel(*args)
        return self.serial(*(args if self._serial_args is None else self._serial_args(args)))

    def __getattr__(self, name):
        return getattr(self.parallel, name)
