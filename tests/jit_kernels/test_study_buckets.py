"""The bucketed-index study (``benchmarks/study_buckets.py``) against its oracle.

The study times a layout that issue 17 may adopt; its kernels must do what the
oracle does, or its timings mean nothing.
"""
import importlib.util
import pathlib

import numpy as np
import pytest

STUDY = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "study_buckets.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("study_buckets", STUDY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 1])
def test_kernels_match_the_oracle(study, seed):
    assert study.check(seed=seed, capacity=512, calls=8) == 8


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
