"""A readers-writer lock: many lookups at once, mutations alone; and the table's
deferred work (:mod:`numbaemb._deferred`), which every taker of the lock waits for."""
import threading
from contextlib import contextmanager

from ._deferred import latest, on_worker

# .n: RWLocks the thread holds (of any table); .since: the latest deferred job's seq when
# it took the first of them
_held = threading.local()


class RWLock:
    """Writer-preferring readers-writer lock.

    ``deferred``: the last job deferred on the table (or None).  Taking the lock first
    waits for it (and raises its error), unless the calling thread is the worker that
    runs the jobs, or already holds a table's lock and the job was deferred after it
    took the first one: a job deferred before needs none of the locks held (had it
    touched their tables, taking them would have waited for it), one deferred after
    may, and runs as a concurrent writer would.

    >>> lock = RWLock()
    >>> with lock.read():
    ...     pass
    >>> with lock.write():
    ...     pass
    """

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self.deferred = None

    def settle(self):
        """Wait for the table's deferred work (see the class docstring)."""
        self._before()

    def _settle(self, n, since):
        job = self.deferred
        if job is None or on_worker() or (n and job.seq > since):
            return
        try:
            job.wait()
        finally:
            if self.deferred is job:
                self.deferred = None

    def _before(self):
        """Settle before taking the lock; returns what :meth:`_taken` records."""
        n = getattr(_held, "n", 0)
        since = _held.since if n else latest()      # (read before the settle)
        self._settle(n, since)
        return since

    @staticmethod
    def _taken(since):
        n = getattr(_held, "n", 0)
        if not n:
            _held.since = since
        _held.n = n + 1

    @contextmanager
    def read(self):
        since = self._before()
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        self._taken(since)
        try:
            yield
        finally:
            _held.n -= 1
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self):
        since = self._before()
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        self._taken(since)
        try:
            yield
        finally:
            _held.n -= 1
            with self._cond:
                self._writer = False
                self._cond.notify_all()
