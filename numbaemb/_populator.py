"""A native thread that maps the pages of row arenas ahead of need, without the GIL.

A growing table writes its new rows into pages never used before, and the first
write to such a page is a page fault (on the 2-core VM this was measured on,
4 ms of a 20 ms Keras training step early in training).  This thread takes
those faults ahead of the writer, on a core that would otherwise idle.

* It is a POSIX thread started with ``pthread_create`` (through ctypes) on a
  Numba ``cfunc``: it never runs Python code, so it never asks for the GIL.  (A
  Python thread did, between two calls, while Keras' loop held it: the
  ``tf.numpy_function`` hand-offs of a training step grew from 0.8 to 2-4 ms.)
* It runs under ``SCHED_IDLE``: only on a core nothing else wants.
* It maps a page by a compare-exchange of one of its words with the value just
  read: a write (the fault maps the page, a huge page where the arena has them)
  that cannot change the contents even while the table writes rows there.  Page
  faults take only the arena's own VMA lock (Linux 6.4+), whereas
  ``madvise(MADV_POPULATE_WRITE)`` holds the process's ``mmap_lock``, and every
  ``mmap``/``munmap`` of the interpreter then waited for it (hand-offs grew from
  0.7 to 3-6 ms a step with it).

Requests go through a ring in one shared ``int64`` array::

    ctl[HEAD]   requests published (written by Python, release)
    ctl[TAIL]   requests done      (written by the thread, release)
    ctl[STOP]   1: the thread returns at its next page
    ctl[POLICY] scheduling policy the thread sets for itself (0: leave it)
    ctl[RING + 2 i], ctl[RING + 2 i + 1]   address and byte count of request i % SLOTS

The thread polls: every 0.1 ms while requests come, every 2 ms after 20 quiet
ms, every 20 ms after a quiet second.  Python keeps each request's mapping alive
until the thread has passed it (touching an unmapped page would be a crash),
stops and joins the thread at exit and when the populator is collected, and
starts a new thread in a forked child.

>>> import mmap
>>> p = NativePopulator(enabled=True)
>>> mm = mmap.mmap(-1, 1 << 22)
>>> a = np.frombuffer(mm, np.uint8)
>>> a[12345] = 7
>>> p.submit(mm, a.ctypes.data, 1 << 22), p.wait(), p.pending, int(a[12345])
(True, None, 0, 7)
>>> p.stop()
"""
import atexit
import collections
import ctypes
import functools
import os
import sys
import threading
import time

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from jit_kernels.atomics import load_acquire, store_release

PAGE = 4096                 # one word per page is touched (a huge page maps on its first)
SLOTS = 64                  # requests in flight at most
HEAD, TAIL, STOP, POLICY, ZERO, RING = 0, 1, 2, 3, 4, 8
CTL_LEN = RING + 2 * SLOTS
SCHED_IDLE = 5              # linux/sched.h

_usleep = types.ExternalFunction("usleep", types.intc(types.uintc))
_sched_setscheduler = types.ExternalFunction(
    "sched_setscheduler", types.intc(types.intc, types.intc, types.voidptr))


@intrinsic
def _touch(typingctx, addr):
    """``compare_exchange(*(int32*)addr, v, v)`` after loading ``v``: a write to the page
    at ``addr`` (its fault maps it) that cannot change its contents, even against
    concurrent writers.  (An ``atomicrmw add 0`` would not do: LLVM lowers that
    idempotent RMW to a fenced load on x86, and a read fault maps only the zero page.)"""
    sig = types.void(types.int64)

    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(32).as_pointer())
        seen = builder.load_atomic(ptr, "monotonic", 4)
        builder.cmpxchg(ptr, seen, seen, "monotonic", "monotonic")
        return context.get_dummy_value()

    return sig, codegen


def _worker(arg):
    """The thread's body: serve requests from the ring at ``arg`` until ``ctl[STOP]``."""
    ctl = carray(arg, CTL_LEN, np.int64)
    if ctl[POLICY] != 0:     # struct sched_param {int priority} = 0: ctl[ZERO]
        _sched_setscheduler(0, ctl[POLICY], ctl[ZERO:].ctypes.data)
    idle = 0
    while load_acquire(ctl, STOP) == 0:
        tail = ctl[TAIL]
        if load_acquire(ctl, HEAD) == tail:
            _usleep(100 if idle < 200 else (2000 if idle < 700 else 20000))
            idle += 1
            continue
        idle = 0
        at = RING + 2 * (tail % SLOTS)
        addr, nbytes = ctl[at], ctl[at + 1]
        off = 0
        while off < nbytes and load_acquire(ctl, STOP) == 0:
            _touch(addr + off)
            off += PAGE
        store_release(ctl, TAIL, tail + 1)
    return arg


@functools.lru_cache(maxsize=None)
def _worker_address():
    """The compiled thread body's address (compiled on first use, not at import)."""
    return cfunc(types.voidptr(types.voidptr), nogil=True, cache=True)(_worker).address


@njit(nogil=True, cache=True)
def _publish(ctl, head, addr, nbytes):
    """Write request ``head`` into the ring, then make it visible (release)."""
    at = RING + 2 * (head % SLOTS)
    ctl[at] = addr
    ctl[at + 1] = nbytes
    store_release(ctl, HEAD, head + 1)


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(None)            # the process: glibc/musl export pthread_*
        lib.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p]
        lib.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
        return lib
    except (OSError, AttributeError):
        return None


class NativePopulator:
    """Queue byte ranges of anonymous private mappings for the native thread to map.

    ``enabled``: False makes :meth:`submit` a no-op (and no thread is started);
    ``policy``: the thread's scheduling policy (default ``SCHED_IDLE``; 0 keeps the
    caller's)."""

    def __init__(self, enabled, policy=SCHED_IDLE):
        self.enabled = bool(enabled)
        self._lock = threading.Lock()
        self._policy = int(policy)
        self._held = collections.deque()    # (request number, mapping) not yet passed
        self._forget()

    def _forget(self):
        """No thread, an empty ring, no mapping held."""
        self._tid = None
        self._ctl = np.zeros(CTL_LEN, np.int64)
        self._ctl[POLICY] = self._policy
        self._held.clear()

    def _start(self):
        lib = _libc()
        tid = ctypes.c_ulong()
        if lib is None or lib.pthread_create(ctypes.byref(tid), None, _worker_address(),
                                             self._ctl.ctypes.data) != 0:
            self.enabled = False
            return False
        self._tid, self._lib = tid.value, lib
        return True

    def _release_done(self):
        done = int(self._ctl[TAIL])
        while self._held and self._held[0][0] < done:
            self._held.popleft()
        return done

    def submit(self, mm, addr, nbytes):
        """Ask for the ``nbytes`` at ``addr`` (inside mapping ``mm``, kept alive until done)
        to be mapped; False when off or when ``SLOTS`` requests are in flight.  ``addr``
        must be 4-byte aligned (a touched word then never spans two pages)."""
        if addr % 4 or nbytes < 0:
            raise ValueError(f"addr must be 4-byte aligned and nbytes >= 0, got {addr}, {nbytes}")
        with self._lock:
            if not self.enabled or (self._tid is None and not self._start()):
                return False
            done = self._release_done()
            head = int(self._ctl[HEAD])
            if head - done >= SLOTS:
                return False
            self._held.append((head, mm))
            _publish(self._ctl, head, addr, nbytes)
            return True

    @property
    def pending(self):
        """Requests not yet done."""
        return int(self._ctl[HEAD] - self._ctl[TAIL])

    @property
    def held(self):
        """Mappings kept alive for requests the thread has not passed yet."""
        with self._lock:
            self._release_done()
            return len(self._held)

    def wait(self):
        """Block until every request is done (tests)."""
        while self._tid is not None and self.pending:
            time.sleep(0.0005)
        with self._lock:
            self._release_done()

    def stop(self):
        """Stop and join the thread (a request in flight ends at its next page)."""
        with self._lock:
            if self._tid is None:
                return
            self._ctl[STOP] = 1
            self._lib.pthread_join(self._tid, None)   # ctypes releases the GIL here
            self._forget()

    __del__ = stop             # the thread must not outlive the ring it reads

    def _after_fork(self):
        """In a forked child: the thread is gone; start afresh on the next request."""
        self._lock = threading.Lock()
        self._forget()


def make_populator(enabled):
    """A :class:`NativePopulator` that is stopped at exit and reset in forked children."""
    p = NativePopulator(enabled)
    atexit.register(p.stop)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=p._after_fork)
    return p
