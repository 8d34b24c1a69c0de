"""Deferred table work (numbaemb._deferred): every later call on a table sees the work
done, in order; errors reach the first waiter; held locks never deadlock on it."""
import os
import sys
import threading
import time

import numpy as np
import pytest

import numbaemb as ne
from numbaemb._deferred import defer, on_worker, wait_all

KEYS = np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max])


def _table():
    return ne.Variable(dim=2, initializer=0.0)


def _slow_upsert(v, value, delay=0.2, log=None):
    def job():
        time.sleep(delay)                # the caller has long returned by now
        v.upsert(KEYS, np.full((KEYS.size, 2), value, np.float32))
        if log is not None:
            log.append(value)
    return job


def _in_thread(fn, timeout=20):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it deadlocks."""
    box = {}

    def body():
        try:
            box["out"] = fn()
        except BaseException as e:       # re-raised below
            box["err"] = e
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "deadlock: the call never returned"
    if "err" in box:
        raise box["err"]
    return box.get("out")


@pytest.mark.parametrize("read", ["lookup", "export", "size", "epoch", "block_until_ready"])
def test_every_read_waits_for_the_deferred_work(read):
    v = _table()
    defer([v._lock], _slow_upsert(v, 3.0), "a test job")
    if read == "lookup":
        assert v.lookup(KEYS).tolist() == [[3.0, 3.0]] * 4
    elif read == "export":
        assert sorted(v.export()[0].tolist()) == sorted(KEYS.tolist())
    elif read == "size":
        assert v.size() == 4
    else:
        getattr(v, read) if read == "epoch" else v.block_until_ready()
        assert v._lock.deferred is None and v.lookup(KEYS)[0, 0] == 3.0


def test_jobs_run_in_the_order_they_were_deferred_on_one_thread():
    a, b, log = _table(), _table(), []
    defer([a._lock], _slow_upsert(a, 1.0, 0.2, log), "first")
    defer([b._lock], _slow_upsert(b, 2.0, 0.0, log), "second")
    b.block_until_ready()
    assert log == [1.0, 2.0]
    assert not on_worker()


def test_a_failed_job_raises_once_in_the_first_waiter_naming_it():
    v = _table()

    def boom():
        raise ValueError("no room")
    defer([v._lock], boom, "the optimizer step 7 of table 'x'")
    with pytest.raises(RuntimeError, match="step 7 of table 'x' failed.*no room") as e:
        v.lookup(KEYS)
    assert isinstance(e.value.__cause__, ValueError)
    assert v.lookup(KEYS).tolist() == [[0.0, 0.0]] * 4          # raised once, then clear


def test_a_job_deferred_while_a_lock_is_held_does_not_deadlock():
    """The thread holds a's lock; a job on a and b (it needs a's write lock) is deferred;
    taking b's lock must not wait for that job (it would wait forever)."""
    a, b = _table(), _table()

    def body():
        with a._lock.read():
            defer([a._lock, b._lock], _slow_upsert(a, 5.0, 0.0), "a job on both")
            with b._lock.read():
                pass
        return a.lookup(KEYS)            # no lock held: waits for the job
    assert _in_thread(body).tolist() == [[5.0, 5.0]] * 4


def test_a_job_deferred_before_the_first_lock_is_waited_for_under_it():
    """A job on b alone, deferred before the thread takes a's lock, needs no lock the
    thread holds: taking b's lock inside waits for it (program order)."""
    a, b = _table(), _table()
    defer([b._lock], _slow_upsert(b, 6.0), "a job on b")

    def body():
        with a._lock.read():
            with b._lock.read():
                return b.shards[0].size
    assert _in_thread(body) == 4


def test_the_worker_never_waits_for_its_own_job():
    v = _table()
    seen = []

    def job():
        v.upsert(KEYS, np.ones((4, 2), np.float32))
        seen.append(v.lookup(KEYS).sum())          # the job's own table: no wait
        seen.append(on_worker())
    defer([v._lock], job, "self-reading job")
    _in_thread(v.block_until_ready)
    assert seen == [8.0, True]


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                    reason="os.fork (POSIX; macOS forks poorly with threads)")
def test_fork_waits_for_the_deferred_work():
    v = _table()
    defer([v._lock], _slow_upsert(v, 2.0, 0.3), "a job before a fork")
    pid = os.fork()
    if pid == 0:                                   # the child: the job ran before the fork
        os._exit(10 + v.shards[0].size)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 14
    wait_all()
