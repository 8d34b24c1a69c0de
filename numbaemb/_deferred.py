"""Table work that runs after its caller returns: a training step's sparse update.

In a Keras step the optimizer's update of a dynamic table is the step's last op, and
nothing reads the table again until the next step's lookup, a millisecond or more of
Python and TensorFlow later (Keras' loop, the next batch, the distinct ids).
:func:`defer` runs such an update on one worker thread instead, so that it overlaps
that time, and every other operation on the tables it touches waits for it first: a
table's lock (:class:`numbaemb._lock.RWLock`) settles its deferred work before it is
taken, and so does :meth:`numbaemb.Variable.block_until_ready`.  What any caller reads
is therefore what it would read had the update run in place, bit for bit; only when
the work happens moves.

Order: one worker runs the jobs in the order they were deferred.  A job's error is
raised by the first wait on one of its tables (the next lookup, ``block_until_ready``,
the end of ``model.fit``), wrapped in a ``RuntimeError`` that names the job; an error
nobody waited for is printed at exit.  A ``fork`` first waits for every job (the child
starts with none in flight).

>>> import threading
>>> seen = []
>>> lock = __import__("numbaemb._lock", fromlist=["RWLock"]).RWLock()
>>> defer([lock], lambda: seen.append(threading.current_thread().name), "a test")
>>> with lock.read():            # waits for the job
...     seen[0].startswith("numbaemb-deferred")
True
"""
import atexit
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["defer", "on_worker", "wait_all", "latest", "Job"]

_state = threading.Lock()
_pool = None            # (pid, executor)
_worker = [None]        # ident of the worker thread while it runs a job
_last = [None]          # the latest job deferred (waiting for it waits for all)
_count = [0]            # jobs deferred so far (a job's seq: its number)
_unreported = []        # failed jobs whose error no waiter has raised yet


class Job:
    """One deferred call: ``wait()`` blocks until it ran and raises its error once."""

    def __init__(self, fn, what, seq=0):
        self.fn, self.what, self.seq = fn, what, seq
        self.done = threading.Event()
        self.error = None

    def run(self):
        _worker[0] = threading.get_ident()
        try:
            self.fn()
        except BaseException as e:          # kept for the first waiter
            self.error = e
            with _state:
                _unreported.append(self)
        finally:
            self.fn = None                  # (its arrays: free them now)
            _worker[0] = None
            self.done.set()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            with _state:
                if self not in _unreported:
                    return
                _unreported.remove(self)
            raise RuntimeError(f"{self.what} failed after its call returned (it ran "
                               f"deferred): {self.error!r}") from self.error


def on_worker() -> bool:
    """Whether the calling thread is running a deferred job (it must never wait for one:
    the jobs after it cannot run before it ends)."""
    return _worker[0] == threading.get_ident()


def defer(locks, fn, what):
    """Run ``fn()`` on the worker thread after every job deferred before it; until it
    has run, taking any of ``locks`` (the tables' :class:`~numbaemb._lock.RWLock`)
    waits for it.  ``what`` names the job in its error.  Returns at once."""
    global _pool
    with _state:
        _count[0] += 1
        job = Job(fn, what, _count[0])
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="numbaemb-deferred"))
        for lock in locks:                  # registered first: no wait can miss it
            lock.deferred = job
        _last[0] = job
        _pool[1].submit(job.run)


def latest() -> int:
    """The ``seq`` of the latest job deferred (0: none yet); every job up to it is
    registered on its tables' locks."""
    with _state:
        return _count[0]


def wait_all():
    """Block until every deferred job has run (their errors stay for their waiters)."""
    job = _last[0]
    if job is not None and not on_worker():
        job.done.wait()


def _report_at_exit():
    wait_all()
    for job in list(_unreported):
        print(f"numbaemb: {job.what} failed after its call returned (it ran deferred) and "
              f"no later call on its tables raised it: {job.error!r}", file=sys.stderr)


def _forked():
    """In a forked child: no worker yet, a fresh lock (another thread may have held the
    parent's at the fork), and the parent's errors are the parent's."""
    global _pool, _state
    _pool, _state = None, threading.Lock()
    _unreported.clear()


atexit.register(_report_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait_all, after_in_child=_forked)
