"""Concurrent use of one Variable from several Python threads.

Writers fill every element of a row with one number (the write's generation),
so a reader that ever sees a row whose elements differ has seen a torn write.
Readers run while the table grows (rehash and arena growth), shrinks (remove)
and is overwritten; afterwards the contents must be exactly right.  Each test
runs for well under a second.
"""
import threading
import time

import numpy as np
import pytest

import numbaemb as ne
from numbaemb import initializers as I

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
DIM = 16
MISSING = -7.0                   # initial value of absent keys: also a uniform row


def warm_up(**config):
    """Compile every kernel the threads use first (a cold compile takes seconds)."""
    w = ne.Variable(dim=DIM, **config)
    k = np.array([1, 2, 2, INT64_MIN])
    w.upsert(k, np.ones((4, DIM), np.float32))
    w.find_or_insert(np.arange(40))
    w.accum(k, np.ones((4, DIM), np.float32), np.ones((4, DIM), np.float32), np.ones(4, bool))
    w.lookup(k, return_exists=True)
    w.remove(k)
    w.export()


def run_threads(readers, writers, seconds=120.0):
    """Start everything, wait for the writers, stop the readers; re-raise any error.
    ``seconds`` only bounds a hang: the writers finish in well under a second."""
    stop = threading.Event()
    errors = []

    def guard(fn, *args):
        def body():
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                stop.set()
        return body

    rs = [threading.Thread(target=guard(r, stop)) for r in readers]
    ws = [threading.Thread(target=guard(w)) for w in writers]
    for t in rs + ws:
        t.start()
    deadline = time.monotonic() + seconds
    for t in ws:
        t.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    for t in rs:
        t.join(5)
    assert not any(t.is_alive() for t in rs + ws), "a thread hung"
    if errors:
        raise errors[0]


def check_rows(out, where):
    """Every returned row has all elements equal."""
    flat = out.reshape(-1, DIM)
    torn = np.nonzero((flat != flat[:, :1]).any(axis=1))[0]
    assert torn.size == 0, f"torn row in {where}: {flat[torn[0]].tolist()}"
    return flat[:, 0]


@pytest.mark.parametrize("num_shards", [1, 3])
def test_lookups_never_see_torn_rows(num_shards):
    warm_up(num_shards=num_shards)
    v = ne.Variable(dim=DIM, num_shards=num_shards, initializer=I.Constant(MISSING))
    hot = np.array([INT64_MIN, INT64_MAX, -1, 0, 1, 2, 3, 1 << 40], np.int64)
    rng = np.random.default_rng(0)
    growth = rng.integers(INT64_MIN, INT64_MAX, size=6000, dtype=np.int64)
    growth = np.setdiff1d(growth, hot)
    n_gen = 60
    seen = {"reads": 0, "gens": set()}
    last = {}

    reading = threading.Event()

    def writer():
        assert reading.wait(60), "no reader started"
        for g in range(1, n_gen + 1):
            v.upsert(hot, np.full((hot.size, DIM), g, np.float32))
            chunk = growth[(g - 1) * 100:g * 100]            # grows the index as it goes
            v.upsert(chunk, np.full((chunk.size, DIM), -g, np.float32))
            if g % 10 == 0:
                v.remove(growth[(g - 10) * 100:(g - 5) * 100])   # tombstones + free list
                v.remove(hot[:2])
                v.find_or_insert(hot[:2])                      # back with initial values
            last["g"] = g

    def reader(stop):
        q = np.concatenate([hot, growth[::50]])
        prev = np.full(hot.size, -np.inf)
        while not stop.is_set():
            out, ex = v.lookup(q, return_exists=True)
            vals = check_rows(out, "lookup")
            h = vals[:hot.size]
            fresh = ex[:hot.size]
            # generations of the hot keys never go backwards (except re-inserted ones)
            ok = (h >= prev) | (h == MISSING)
            assert ok.all(), (h.tolist(), prev.tolist())
            prev = np.where(fresh & (h != MISSING), h, prev)
            assert (vals[~ex] == MISSING).all()
            seen["reads"] += 1
            reading.set()
            seen["gens"].update(np.unique(h).tolist())

    def exporter(stop):
        while not stop.is_set():
            keys, vals = v.export()
            check_rows(vals, "export")
            assert keys.shape[0] == vals.shape[0] and len(np.unique(keys)) == keys.shape[0]
            assert 0 <= v.size() and all(v.size(i) >= 0 for i in range(num_shards))

    run_threads([reader, reader, exporter], [writer])
    assert last["g"] == n_gen and seen["reads"] > 0
    # final contents are exactly those of the sequential writer
    want = {}
    for g in range(1, n_gen + 1):
        for x in growth[(g - 1) * 100:g * 100].tolist():
            want[x] = -g
        if g % 10 == 0:
            for x in growth[(g - 10) * 100:(g - 5) * 100].tolist():
                want.pop(x, None)
    for x in hot.tolist():
        want[x] = n_gen
    for x in hot[:2].tolist():
        want[x] = MISSING
    keys, vals = v.export()
    got = dict(zip(keys.tolist(), check_rows(vals, "final export").tolist()))
    assert got == want
    assert v.size() == len(want)


def test_concurrent_writers_on_disjoint_keys_and_readers():
    warm_up(num_shards=2)
    v = ne.Variable(dim=DIM, num_shards=2, initializer=I.Constant(MISSING))
    sets = [np.arange(t, 8000, 4, dtype=np.int64) - 4000 for t in range(4)]
    n_rounds = 15

    def writer(t):
        def body():
            ks = sets[t]
            for r in range(1, n_rounds + 1):
                part = ks[: ks.size * r // n_rounds]
                v.upsert(part, np.full((part.size, DIM), 100 * t + r, np.float32))
                v.accum(part[:10], np.zeros((10, DIM), np.float32),
                        np.ones((10, DIM), np.float32), np.ones(10, bool))
        return body

    def reader(stop):
        q = np.concatenate([s[::97] for s in sets])
        while not stop.is_set():
            check_rows(v.lookup(q), "lookup")
            check_rows(v.find_or_insert(np.array([INT64_MIN, INT64_MAX])), "find_or_insert")

    run_threads([reader, reader], [writer(t) for t in range(4)])
    keys, vals = v.export()
    got = dict(zip(keys.tolist(), check_rows(vals, "export").tolist()))
    want = {INT64_MIN: MISSING, INT64_MAX: MISSING}
    for t in range(4):
        ks = sets[t]
        for r in range(1, n_rounds + 1):
            part = ks[: ks.size * r // n_rounds]
            for x in part.tolist():
                want[x] = 100 * t + r
            for x in part[:10].tolist():
                want[x] += 1
    assert got == want


def test_many_threads_insert_same_keys():
    """Racing find_or_insert of the same keys: one row per key, size exact."""
    warm_up(num_shards=3, initializer=I.RandomNormal(seed=1))
    v = ne.Variable(dim=DIM, num_shards=3, initializer=I.RandomNormal(seed=1))
    keys = np.concatenate([np.array([INT64_MIN, INT64_MAX, -1, 0]),
                           np.arange(1, 3000, dtype=np.int64) * 7919])
    outs = []

    def writer(seed):
        def body():
            perm = np.random.default_rng(seed).permutation(keys.size)
            for chunk in np.array_split(perm, 10):
                out = v.find_or_insert(keys[chunk])
                outs.append((chunk, out))
        return body

    run_threads([], [writer(s) for s in range(4)])
    ref = ne.Variable(dim=DIM, initializer=I.RandomNormal(seed=1)).lookup(keys)
    for chunk, out in outs:
        np.testing.assert_array_equal(out, ref[chunk])
    assert v.size() == keys.size
    ek, ev = v.export()
    order = np.argsort(ek)
    np.testing.assert_array_equal(ek[order], np.sort(keys))
    np.testing.assert_array_equal(ev[order], ref[np.argsort(keys)])


@pytest.mark.parametrize("window", [8, "bucket"])
def test_bounded_table_evicting_under_readers(monkeypatch, window):
    """A full bounded table evicting on every insert (also in ranges of its index, or in
    stretches of its buckets) while readers look up: each key's row holds the key
    itself, so a reader that got a row must get its own key's, whole, or the initial
    value; never the evicted key's row under the new key."""
    from jit_kernels import bounded as kb
    from numbaemb import bounded as nb
    monkeypatch.setattr(kb, "RANGE_SLOTS", 256)       # calls of 64+ keys take ranges
    monkeypatch.setattr(kb, "RANGES_MIN", 64)
    monkeypatch.setattr(nb, "stretches_for", lambda: 2)
    config = dict(max_capacity=3000, evict="lru", evict_window=window,
                  initializer=I.Constant(MISSING))
    warm_up(**config)
    v = ne.Variable(dim=DIM, **config)
    assert window == "bucket" or kb.ranges_for(v.shards[0].capacity, 8) > 1
    universe = np.arange(20_000, dtype=np.int64)

    def writer(seed):
        def body():
            rng = np.random.default_rng(seed)
            for _ in range(20):
                k = np.unique(rng.choice(universe, 500))
                v.upsert(k, np.repeat(k.astype(np.float32)[:, None], DIM, axis=1))
                k = rng.choice(universe, 300)          # evicting finds: their own or MISSING
                got = check_rows(v.find_or_insert(k), "find_or_insert")
                assert ((got == k) | (got == MISSING)).all()
        return body

    def reader(stop):
        rng = np.random.default_rng(99)
        while not stop.is_set():
            k = rng.choice(universe, 400)
            got = check_rows(v.lookup(k), "lookup")
            assert ((got == k) | (got == MISSING)).all(), "a row under another key"

    run_threads([reader, reader], [writer(s) for s in range(3)])
    keys, vals = v.export()
    assert 0 < keys.size <= 3000
    got = check_rows(vals, "export")
    assert ((got == keys) | (got == MISSING)).all()


@pytest.mark.parametrize("given, want", [
    ({}, ("PASSIVE", "3000")),                                  # the default: a short spin
    ({"OMP_WAIT_POLICY": "ACTIVE"}, ("ACTIVE", None)),           # the user's policy wins
    ({"OMP_WAIT_POLICY": "PASSIVE"}, ("PASSIVE", None)),         # (no spin: as asked)
    ({"GOMP_SPINCOUNT": "50"}, ("PASSIVE", "50")),               # the user's spin count wins
])
def test_import_sets_the_openmp_wait_unless_the_user_did(given, want):
    """``import numbaemb`` sets ``GOMP_SPINCOUNT=3000`` (and ``OMP_WAIT_POLICY=PASSIVE``
    for other OpenMP runtimes) only where the user set neither (a fresh process each)."""
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(given)
    code = ("import json, os, numbaemb; print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('GOMP_SPINCOUNT')]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__)))))
    assert tuple(json.loads(out.stdout.strip().splitlines()[-1])) == want
