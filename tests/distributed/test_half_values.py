"""16-bit float tables (float16, bfloat16) split across ranks against one process: the
ranks' batches, concatenated in rank order, applied to a one-process table of the same
dtype give the same bits (values travel as their bits; float32 is the control)."""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb import _checks
from numbaemb import optimizers as O

from .conftest import COMM, RANK, WORLD, agree, multi_rank

pytestmark = multi_rank
DTYPES = [np.float32, np.float16] + (["bfloat16"] if _checks.BFLOAT16 is not None else [])


def bits(a):
    """The bits of a float array (equal arrays, NaNs included, have equal bits)."""
    return a.view(f"u{a.dtype.itemsize}")


def everyone(x):
    """Every rank's array, concatenated in rank order."""
    return np.concatenate(COMM.allgather(np.asarray(x)))


@pytest.mark.parametrize("value_dtype", DTYPES)
def test_half_tables_equal_one_process(value_dtype):
    init = ne.initializers.RandomNormal(seed=3)
    v = ne.Variable(3, comm=COMM, value_dtype=value_dtype, initializer=init, name="half")
    one = ne.Variable(3, value_dtype=value_dtype, initializer=init, name="half")
    assert v.value_dtype == one.value_dtype       # configuration: the same on every rank
    rng = np.random.default_rng(10 + RANK)
    for step in range(1, 5):
        keys = rng.integers(-6, 6, 5)
        vals = rng.standard_normal((5, 3)).astype(np.float32)
        v.upsert(keys[:2], vals[:2])
        one.upsert(everyone(keys[:2]), everyone(vals[:2]))
        grads = rng.standard_normal((5, 3)).astype(np.float32)
        O.apply_gradients(v, O.Adam(0.05), keys, grads, step=step)
        # one process: each rank's duplicates summed first, then the ranks' sums in order
        sums = []
        for r in range(WORLD):
            k, g = COMM.bcast((keys, grads) if r == RANK else None, root=r)
            u, inv = np.unique(k, return_inverse=True)
            s = np.zeros((u.shape[0], 3), np.float32)
            np.add.at(s, inv, g)
            sums.append((u, s))
        allk = np.concatenate([u for u, _ in sums])
        u, inv = np.unique(allk, return_inverse=True)
        total = np.zeros((u.shape[0], 3), np.float32)
        for j, (i, row) in enumerate(zip(inv, np.concatenate([s for _, s in sums]))):
            total[i] += row
        O.apply_gradients(one, O.Adam(0.05), u, total, step=step, assume_unique=True)
        probe = np.arange(-6, 6)
        got = v.lookup(probe)
        agree(got.dtype == one.value_dtype, "dtype")
        agree(np.array_equal(bits(got), bits(one.lookup(probe))),
              f"rows differ at step {step}")
    old = v.lookup(np.arange(2))
    v.accum(np.arange(2), old, old.astype(np.float32) + 1, np.ones(2, bool))
    for _ in range(WORLD):          # every rank sent the same (old, new): in rank order
        one.accum(np.arange(2), old, old.astype(np.float32) + 1, np.ones(2, bool))
    agree(np.array_equal(bits(v.lookup(np.arange(2))), bits(one.lookup(np.arange(2)))), "accum")
