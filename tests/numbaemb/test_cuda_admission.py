"""Admission filters on CUDA tables against the same CPU tables: the filter counts on
the host (its own structure), the table on the device; reads, upserts and device
optimizer steps admit, drop and count exactly as on the CPU.  GPU or simulator."""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb import optimizers as O
from tests.cuda_support import assert_same_floats, needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]
EXTREMES = np.array([-2**63, 2**63 - 1, -1, 0])


def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def exported(v):
    keys, vals = (host(a) for a in v.export())
    order = np.argsort(keys)
    return keys[order], vals[order]


@pytest.mark.parametrize("make, bound", [
    (lambda: ne.admission.CounterFilter(min_count=2), {}),
    (lambda: ne.admission.BloomFilter(min_count=3, capacity=64),
     {"max_capacity": 12, "evict_window": 4}),
    (lambda: ne.admission.RandomFilter(0.5, seed=3), {})],
    ids=["counter-plain", "bloom-bounded", "random-plain"])
def test_filtered_gpu_table_matches_the_cpu(make, bound):
    gpu = ne.Variable(2, device="cuda", admit=make(), seed=2, **bound)
    cpu = ne.Variable(2, admit=make(), seed=2, **bound)
    rng = np.random.default_rng(4)
    for step in range(1, 6):
        keys = np.concatenate([EXTREMES, rng.integers(-8, 8, 10)])
        got = gpu.find_or_insert(keys, return_exists=True)
        want = cpu.find_or_insert(keys, return_exists=True)
        for a, b in zip(got, want):      # values after device steps, and exists
            assert_same_floats(host(a), b)
        vals = rng.standard_normal((5, 2)).astype(np.float32)
        gpu.upsert(keys[4:9], vals)
        cpu.upsert(keys[4:9], vals)
        ids = rng.integers(-12, 12, 8)
        grads = rng.standard_normal((8, 2)).astype(np.float32)
        O.apply_gradients(gpu, O.Adagrad(0.3), ids, grads, step=step)
        O.apply_gradients(cpu, O.Adagrad(0.3), ids, grads, step=step)
        (gk, gv), (ck, cv) = exported(gpu), exported(cpu)
        np.testing.assert_array_equal(gk, ck)
        assert_same_floats(gv, cv)
    assert 0 < cpu.size() < np.unique(np.concatenate([EXTREMES, np.arange(-12, 12)])).size
