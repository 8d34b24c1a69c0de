"""The bucketed-index studies (``benchmarks/study_buckets.py``, ``study_bucket_probing.py``)
against their oracles.

The study times a layout that issue 17 may adopt; its kernels must do what the
oracle does, or its timings mean nothing.
"""
import importlib.util
import pathlib

import numpy as np
import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def study():
    return _load("study_buckets")


def test_bucket_local_probing_matches_its_oracle():
    probing = _load("study_bucket_probing")
    assert probing.check(seed=2, capacity=512, calls=8) == 8


@pytest.mark.parametrize("seed, interleave", [(0, True), (1, False)])
def test_kernels_match_the_oracle(study, seed, interleave):
    assert study.check(seed=seed, capacity=512, calls=8, interleave=interleave) == 8


def test_a_full_bucket_evicts_its_lowest_score_and_keeps_this_calls_keys(study):
    t = study.Buckets(study.B // 2)         # one bucket of 32 slots, capacity 16
    keys = np.arange(16, dtype=np.int64) * 7 - 50
    t.fill(keys, 1)
    t.bscore[:16] = np.arange(16) + 1       # the first key scores lowest ...
    t.bscore[0] = 5                         # ... after the second (2) once moved up
    rows, ek, er = t.call(np.array([1000, 1001], np.int64), 100)
    assert ek.tolist() == [keys[1], keys[2]]
    assert er.tolist() == [1, 2] and rows.tolist() == [1, 2]
    rows, ek, er = t.call(np.full(40, 5000, np.int64), 101)     # repeats of one new key
    assert (rows == rows[0]).all() and (er[1:] == -1).all()
    assert int((t.dig != 0).sum()) == 16


def test_stream_hit_rate_matches_a_bucket_lru_oracle(study):
    rng = np.random.default_rng(5)
    stream = (rng.zipf(1.2, 6000) + np.repeat(np.arange(60), 100) * 7).astype(np.int64)
    stream[::97] = np.iinfo(np.int64).min
    nb, capacity, batch = 8, 150, 100
    buckets, where = [[None] * study.B for _ in range(nb)], {}
    size = hits = 0
    for clock, lo in enumerate(range(0, stream.shape[0], batch), 1):
        ids = stream[lo:lo + batch].tolist()
        for k in ids:
            if k in where:
                hits += 1
                b, j = where[k]
                buckets[b][j][1] = clock
        for k in ids:
            if k in where:
                continue
            b = int(study._split(np.int64(k), np.int64(nb - 1))[0])
            if size < capacity and None in buckets[b]:
                j, size = buckets[b].index(None), size + 1
            else:
                score = [study.MAX if e is None else e[1] for e in buckets[b]]
                j = int(np.argmin(score))
                if score[j] >= clock:
                    continue
                del where[buckets[b][j][0]]
            buckets[b][j], where[k] = [k, clock], (b, j)
    assert hits > 0 and size == capacity
    assert study.stream_hits(stream, nb, capacity, batch) == hits / stream.shape[0]
