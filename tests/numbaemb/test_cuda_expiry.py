"""``steps_to_live`` and ``prune_small`` on CUDA tables against the same CPU tables:
device optimizer steps mark ``updated_step`` (ids a bounded table refuses too: not),
and the passes pick the same keys in slot order (``jit_kernels.cuda_columns`` runs
the CPU's per-slot bodies).  GPU or simulator."""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb import expiry
from numbaemb import optimizers as O
from tests.cuda_support import needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]
EXTREMES = np.array([-2**63, 2**63 - 1, -1, 0])


def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def exported(v, column="values"):
    keys, vals = (host(a) for a in v.export(column))
    order = np.argsort(keys)
    return keys[order], vals[order]


@pytest.mark.parametrize("kw", [{}, {"max_capacity": 20, "evict": "lfu", "evict_window": 4},
                                {"max_hbm_bytes": 96}], ids=["plain", "bounded", "hybrid"])
def test_expire_and_prune_match_the_cpu(kw):
    gpu = ne.Variable(2, device="cuda", steps_to_live=2, seed=3, **kw)
    cpu = ne.Variable(2, steps_to_live=2, seed=3,
                      **{k: v for k, v in kw.items() if k != "max_hbm_bytes"})
    rng = np.random.default_rng(0)
    removed = 0
    for step in range(1, 7):
        ids = np.concatenate([EXTREMES[step % 4:step % 4 + 1], rng.integers(-20, 20, 8)])
        grads = rng.standard_normal((ids.shape[0], 2)).astype(np.float32)
        O.apply_gradients(gpu, O.SGD(0.5), ids, grads, step=step)
        O.apply_gradients(cpu, O.SGD(0.5), ids, grads, step=step)
        for a, b in zip(exported(gpu), exported(cpu)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(exported(gpu, expiry.STEP), exported(cpu, expiry.STEP)):
            np.testing.assert_array_equal(a, b)
        if step % 2 == 0:
            n = expiry.expire(gpu)
            assert n == expiry.expire(cpu)
            removed += n
    assert removed > 0
    n = expiry.prune_small(gpu, 0.8)
    assert n == expiry.prune_small(cpu, 0.8) > 0
    for a, b in zip(exported(gpu), exported(cpu)):
        np.testing.assert_array_equal(a, b)
    left = gpu.size()
    assert expiry.expire(gpu, step=100) == left > 0 and gpu.size() == 0
