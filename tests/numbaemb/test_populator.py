"""The native page-mapping thread (numbaemb._populator): maps pages, changes no byte,
keeps mappings alive while it works, stops, restarts after a fork."""
import gc
import mmap
import os
import sys
import weakref

import numpy as np
import pytest

from numbaemb._populator import SLOTS, NativePopulator, make_populator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the thread is started with Linux's pthread/sched calls")


def resident(a):
    """Bytes of ``a``'s pages that are mapped (mincore)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    n = (a.nbytes + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes), vec) == 0
    return sum(v & 1 for v in vec) * page


@pytest.fixture
def populator():
    p = NativePopulator(enabled=True)
    yield p
    p.stop()


def fresh(nbytes):
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    return mm, np.frombuffer(mm, np.uint8)


def test_maps_the_pages_asked_for_and_no_others(populator):
    mm, a = fresh(16 << 20)
    assert resident(a) == 0
    assert populator.submit(mm, a.ctypes.data + (4 << 20), 8 << 20)
    populator.wait()
    assert resident(a[4 << 20:12 << 20]) == 8 << 20
    assert resident(a[12 << 20:]) == 0
    assert not a.any()                              # mapped pages read as zeros


def test_changes_no_byte_written_before_or_meanwhile(populator):
    mm, a = fresh(32 << 20)
    words = a.view(np.int32)
    want = np.random.default_rng(1).integers(-2**31, 2**31 - 1, words.shape[0], dtype=np.int32)
    words[: words.shape[0] // 4] = want[: words.shape[0] // 4]     # before
    assert populator.submit(mm, a.ctypes.data, a.nbytes)
    for part in np.array_split(np.arange(words.shape[0] // 4, words.shape[0]), 64):
        words[part[0]:part[-1] + 1] = want[part[0]:part[-1] + 1]    # meanwhile
    populator.wait()
    np.testing.assert_array_equal(words, want)


def test_keeps_the_mapping_alive_until_done(populator):
    mm, a = fresh(64 << 20)
    gone = weakref.ref(mm)
    assert populator.submit(mm, a.ctypes.data, a.nbytes)
    del mm, a
    gc.collect()
    populator.wait()
    assert populator.held == 0
    gc.collect()
    assert gone() is None


def test_rejects_unaligned_addresses(populator):
    mm, a = fresh(1 << 20)
    with pytest.raises(ValueError, match="4-byte aligned"):
        populator.submit(mm, a.ctypes.data + 2, 4096)
    assert populator.pending == 0 and populator.held == 0


def test_off_means_no_thread_and_no_request():
    p = NativePopulator(enabled=False)
    mm, a = fresh(1 << 20)
    assert not p.submit(mm, a.ctypes.data, a.nbytes)
    assert p._tid is None and p.pending == 0 and p.held == 0


def test_refuses_more_than_slots_in_flight(populator):
    mms = [fresh(8 << 20) for _ in range(SLOTS + 8)]
    taken = [populator.submit(mm, a.ctypes.data, a.nbytes) for mm, a in mms]
    assert taken[0] and all(taken[:SLOTS])          # the ring holds SLOTS at least
    populator.wait()
    assert populator.pending == 0 and populator.held == 0
    mm, a = mms[-1]
    assert populator.submit(mm, a.ctypes.data, a.nbytes)     # room again


def test_stop_joins_and_the_next_request_starts_a_new_thread(populator):
    mm, a = fresh(4 << 20)
    assert populator.submit(mm, a.ctypes.data, 1 << 20)
    populator.stop()
    assert populator._tid is None and populator.held == 0
    populator.stop()                                # twice is harmless
    assert populator.submit(mm, a.ctypes.data + (1 << 20), 1 << 20)
    populator.wait()
    assert resident(a[1 << 20:2 << 20]) == 1 << 20


def test_runs_at_idle_priority(populator):
    mm, a = fresh(1 << 20)
    before = set(os.listdir("/proc/self/task"))
    assert populator.submit(mm, a.ctypes.data, a.nbytes)
    populator.wait()
    new = set(os.listdir("/proc/self/task")) - before
    policies = [int(open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()[38])
                for t in new]
    assert policies == [5]                          # SCHED_IDLE


def test_a_forked_child_starts_its_own_thread():
    POPULATOR = make_populator(True)                # reset in children, as numbaemb's own
    mm, a = fresh(4 << 20)
    assert POPULATOR.submit(mm, a.ctypes.data, 1 << 20)
    POPULATOR.wait()
    pid = os.fork()
    if pid == 0:                                    # child: the parent's thread is not here
        ok = False
        try:
            ok = (POPULATOR._tid is None
                  and POPULATOR.submit(mm, a.ctypes.data + (2 << 20), 1 << 20))
            POPULATOR.wait()
            ok = ok and resident(a[2 << 20:3 << 20]) == 1 << 20
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
