"""The CUDA drivers of a bounded table (``jit_kernels.cuda_bounded``) against the CPU
kernels they mirror: the same table and call give the same index, scores, score
copies, call marks, rows, evictions and deferred positions, bit for bit (serial pass
and ranges; every policy, extreme keys, repeats, keys present at the start, ranges
that defer many keys).  GPU or simulator."""
import numpy as np
import pytest

from jit_kernels import bounded as kb
from jit_kernels.slots import first_slot
from tests.cuda_support import needs_cuda
from tests.jit_kernels.test_bounded_ranges import CAP, FILL, POOL, Table

pytestmark = [pytest.mark.cuda, needs_cuda]
STATE = ("slots", "scores", "mscore", "mark")


@pytest.fixture(scope="module")
def kbc():
    from jit_kernels import cuda_bounded, cuda_table
    cuda_table.cuda_api()
    return cuda_bounded


def run(table, keys, scores, clock, n_ranges, drivers, to_device):
    """One call through ``drivers`` (CPU module or CUDA drivers): every output, host."""
    d = {name: to_device(getattr(table, name)) for name in STATE}
    n = keys.shape[0]
    keys_d, scores_d = to_device(keys), to_device(scores)
    rows, where = to_device(np.empty(n, np.int64)), to_device(np.empty(n, np.int64))
    new, late = to_device(np.zeros(n, np.bool_)), to_device(np.zeros(n, np.int64))
    ev_k, ev_r = to_device(np.zeros(n, np.int64)), to_device(np.zeros(n, np.int64))
    table.batch += 1
    drivers.find_present(d["slots"], CAP - 1, keys_d, rows, where, d["mscore"], d["mark"],
                         table.batch, table.hold)
    args = (d["slots"], CAP - 1, keys_d, scores_d, d["scores"], d["mscore"], d["mark"],
            table.batch, table.hold, rows, where, new, to_device(np.concatenate([table.free, [-1]])),
            table.free.shape[0], table.fresh, table.size)
    if n_ranges:
        out = drivers.bounded_insert_ranges(*args, n_ranges, table.limit, table.window,
                                            table.policy, 3, clock, False, ev_k, ev_r, late)
    else:
        out = drivers.bounded_insert(*args, table.limit, table.window, table.policy, 3, clock,
                                     False, ev_k, ev_r)
    n_ev = out[1]
    drivers.restore_scores(d["slots"], CAP - 1, keys_d, where, d["scores"], d["mscore"])
    host = (lambda a: a) if drivers is kb else (lambda a: a.copy_to_host())
    got = {name: host(a) for name, a in d.items()}
    got.update(rows=host(rows), where=host(where), new=host(new), out=tuple(out),
               ev_k=host(ev_k)[:n_ev], ev_r=host(ev_r)[:n_ev])
    if n_ranges:
        got["late"] = host(late)
    return got


def check_same(table, keys, scores, n_ranges, kbc):
    cuda = kbc.ct.cuda
    want = run(table.copy(), keys, scores, 7, n_ranges, kb, lambda a: a.copy())
    got = run(table.copy(), keys, scores, 7, n_ranges, kbc, cuda.to_device)
    assert got.keys() == want.keys()
    for name, a in want.items():
        if isinstance(a, tuple):
            assert got[name] == a, name
        else:
            np.testing.assert_array_equal(got[name], a, err_msg=name)
    return want


@pytest.mark.parametrize("n_ranges", [0, 4])
def test_same_as_the_cpu_on_random_calls(kbc, n_ranges):
    """(The simulator runs the ranges' scans slowly: 2-4 s a call, so few calls.)"""
    rng = np.random.default_rng(n_ranges)
    deferred = evicted = 0
    for ex in range(5 if n_ranges else 20):
        window = [1, 2, 4, 8, 16][ex % 5]
        policy = sorted(kb.POLICIES.values())[ex % 5]
        table = Table(window, policy, ex, limit=(100, 160)[ex % 2])
        if policy == kb.LRU and ex % 2:     # the call's keys hold its clock (7) in mscore
            table.hold = 7
        n = int(rng.integers(120, 200))
        keys = np.where(rng.random(n) < 0.1, rng.choice(POOL, n), rng.integers(-300, 300, n))
        present = table.slots[0::2][table.slots[1::2] >= 0]
        keys = np.concatenate([keys, rng.choice(present, 20)]).astype(np.int64)
        want = check_same(table, keys, rng.integers(0, 9, keys.shape[0]), n_ranges, kbc)
        deferred += want.get("late", np.zeros(1, bool)).sum()
        evicted += want["ev_k"].shape[0]
    assert evicted > 100 and (deferred > 10 or not n_ranges)


@pytest.mark.parametrize("n_ranges", [0, 4])
def test_same_as_the_cpu_while_the_table_fills(kbc, n_ranges):
    """Calls that cannot fill the table (rows handed out after the ranges, on the
    device a thread a position): free rows, tombstones, repeats, present keys."""
    rng = np.random.default_rng(10 + n_ranges)
    deferred = 0
    for ex in range(3):
        table = Table([1, 4, 16][ex], sorted(kb.POLICIES.values())[2 * ex], ex,
                      **FILL)
        n = int(rng.integers(100, 150))
        keys = np.where(rng.random(n) < 0.1, rng.choice(POOL, n), rng.integers(-300, 300, n))
        present = table.slots[0::2][table.slots[1::2] >= 0]
        keys = np.concatenate([keys, rng.choice(present, 5)]).astype(np.int64)
        want = check_same(table, keys, rng.integers(0, 9, keys.shape[0]), n_ranges, kbc)
        assert want["out"][0] > 50 and want["out"][1] == 0    # rows taken, none evicted
        deferred += (want.get("late", np.zeros(1, np.int64)) > 0).sum()
    assert deferred > 5 or not n_ranges


def test_same_as_the_cpu_when_a_range_defers_past_its_list(kbc):
    table = Table(2, kb.LRU, 0)
    pool = np.arange(-200000, 200000, dtype=np.int64)
    homes = np.array([first_slot(k, CAP - 1) for k in pool])
    near_end = pool[(homes >= CAP // 2 - 1) & (homes < CAP // 2)][:kb.DEFER_KEYS + 5]
    keys = np.concatenate([near_end, pool[homes < 8][:20]])
    want = check_same(table, keys, np.zeros(keys.shape[0], np.int64), 2, kbc)
    assert want["late"][:near_end.shape[0]].all()


def test_sync_and_forget_match_the_cpu(kbc):
    cuda = kbc.ct.cuda
    table = Table(4, kb.LFU, 3)
    mscore, mark = np.zeros(CAP, np.int64), np.ones(CAP, kb.MARK)
    kb.sync_meta(table.slots, table.scores, mscore, mark)
    d_ms, d_mark = cuda.to_device(np.zeros(CAP, np.int64)), cuda.to_device(mark * 0 + 1)
    kbc.sync_meta(cuda.to_device(table.slots), cuda.to_device(table.scores), d_ms, d_mark)
    np.testing.assert_array_equal(d_ms.copy_to_host(), mscore)
    np.testing.assert_array_equal(d_mark.copy_to_host(), mark)
    keys = np.concatenate([table.slots[0::2][table.slots[1::2] >= 0][:7], [-2**63]])
    kb.forget(table.slots, CAP - 1, keys, mscore)
    kbc.forget(cuda.to_device(table.slots), CAP - 1, cuda.to_device(keys), d_ms)
    np.testing.assert_array_equal(d_ms.copy_to_host(), mscore)
    assert (mscore == kb.MAX).sum() >= 7
