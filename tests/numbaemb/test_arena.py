"""Row arenas: growth in place and background page population (numbaemb._arena)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from numbaemb import _arena
from numbaemb._arena import POPULATOR, Column, arena_empty, arena_grow, prefault
from numbaemb.shard import Shard
from jit_kernels.initializers import NORMAL

needs_populate = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                    reason="the prefault thread is Linux-only")


@pytest.fixture(autouse=True)
def populate_on(monkeypatch):
    """Prefaulting is on by default on Linux (NUMBAEMB_PREFAULT=0 switches it off): made
    sure it is on for these tests whatever the environment says."""
    monkeypatch.setattr(POPULATOR, "enabled", sys.platform.startswith("linux"))
    yield
    POPULATOR.wait()


@needs_populate
def test_prefault_keeps_rows_written_meanwhile():
    """The thread maps pages while this thread writes rows into the same pages; every
    row written keeps its value (nothing is written over afterwards)."""
    col = Column(arena_empty(1 << 17, 64, np.float32), None)
    rows = np.arange(1 << 17, dtype=np.float32)[:, None] + np.arange(64, dtype=np.float32)
    assert prefault(col, 0) is not None              # the first pages, ahead of the writes
    for lo in range(0, 1 << 17, 1 << 11):            # rows land while it works
        col.data[lo:lo + (1 << 11)] = rows[lo:lo + (1 << 11)]
        prefault(col, lo + (1 << 11))
    POPULATOR.wait()
    np.testing.assert_array_equal(col.data, rows)


@needs_populate
def test_prefault_runs_ahead_once_and_again_when_used_up():
    col = Column(arena_empty(1 << 14, 64, np.float32), None)
    first = prefault(col, 1000)
    assert first is not None and first[0] <= 1000 * 256 and first[1] >= 1000 * 256 + _arena.PREFAULT_MIN
    assert prefault(col, 1001) is None              # still far enough ahead
    rows_used_up = col.populated // 256 - 10
    second = prefault(col, rows_used_up)
    assert second is not None and second[0] == first[1] and col.populated == second[1]
    POPULATOR.wait()
    assert POPULATOR.pending == 0 and POPULATOR.held == 0


def test_prefault_ignores_small_columns_and_copies():
    small = Column(np.empty((10, 4), np.float32), None)
    assert prefault(small, 5) is None
    col = Column(arena_empty(1 << 16, 8, np.float32, reserve_bytes=0), None)
    col.populated = 123
    arena_grow(col, 1 << 16, 1 << 17)                # outgrew its mapping: a new one
    assert col.populated == 0


def test_shard_growth_with_prefault_keeps_every_row():
    """Insert in batches (the arena grows and is populated ahead); rows stay exact."""
    s = Shard(dim=64, dtype=np.float32, init=(NORMAL, 0.0, 1.0, 3, np.zeros(64)))
    keys = np.random.default_rng(0).permutation(60_000).astype(np.int64) - 30_000
    for part in np.array_split(keys, 12):
        s.upsert(part, np.repeat(part[:, None].astype(np.float32), 64, axis=1))
    POPULATOR.wait()
    got_keys, got = s.export()
    np.testing.assert_array_equal(np.sort(got_keys), np.sort(keys))
    np.testing.assert_array_equal(got, np.repeat(got_keys[:, None].astype(np.float32), 64, axis=1))


LINUX = sys.platform.startswith("linux")


@pytest.mark.parametrize("flag,want", [("0", False), (None, LINUX), ("1", LINUX)])
def test_prefault_is_on_unless_switched_off(flag, want):
    code = ("from numbaemb._arena import POPULATOR, Column, arena_empty, prefault;"
            "import numpy as np;"
            "c = Column(arena_empty(1 << 16, 64, np.float32), None);"
            "print(POPULATOR.enabled, prefault(c, 10) is not None)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBAEMB_PREFAULT"}
    if flag is not None:
        env["NUMBAEMB_PREFAULT"] = flag
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__)))))
    assert out.stdout.split() == [str(want), str(want)]


def test_init_size_faults_rows_in_up_front_and_the_table_works():
    """init_size: rows of every column are populated at creation (RSS grows by about
    init_size x row bytes), the table is still empty and behaves as one."""
    import numbaemb as ne
    from numbaemb import optimizers as opt

    def rss():                               # resident bytes now (Linux), else None
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return None

    before = rss()
    v = ne.Variable(dim=64, init_size=200_000)
    if before is not None:
        assert rss() - before >= 0.8 * 200_000 * 64 * 4     # the value column, at least
    assert v.size() == 0
    keys = np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max])
    assert not v.lookup(keys, return_exists=True)[1].any()
    opt.apply_gradients(v, opt.Adam(0.1), keys, np.ones((4, 64), np.float32), step=1)
    assert v.size() == 4
    np.testing.assert_allclose(v.lookup(keys), -0.1, rtol=1e-5)    # zeros - lr * sign
    v.clear()
    assert v.size() == 0


def test_populate_small_and_plain_arrays():
    from numbaemb._arena import populate
    a = np.ones((10, 4), np.float32)          # not a mapping: written with zeros
    populate(a)
    assert not a.any()
    populate(np.empty((0, 4), np.float32))


def test_a_first_batch_into_an_empty_index_is_not_counted(monkeypatch):
    """An empty shard sizes its index for its first batch without the count of absent
    positions (every position is absent there: no compile of that kernel on a cold
    start); later batches that must grow the index are counted, as before."""
    counted = []
    real = Shard._count_absent
    monkeypatch.setattr(Shard, "_count_absent", lambda self, k: counted.append(k.size) or
                        real(self, k))
    s = Shard(dim=4, dtype=np.float32, init=(NORMAL, 0.0, 1.0, 3, np.zeros(4)))
    first = np.array([7, 7, -1, 0, np.iinfo(np.int64).min, np.iinfo(np.int64).max] * 500)
    rows, new = s.find_or_insert(first)
    assert counted == [] and s.size == 5 and int(new.sum()) == 5
    assert s.capacity == 4096                  # room for every position, as the count gave
    more = np.arange(100, 100 + 3 * s.capacity, dtype=np.int64)
    s.find_or_insert(more)
    assert counted == [more.size] and s.size == 5 + more.size
    keys, _ = s.export()
    assert sorted(keys.tolist()) == sorted(set(first.tolist()) | set(more.tolist()))
