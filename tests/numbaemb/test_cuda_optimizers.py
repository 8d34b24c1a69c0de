"""``apply_gradients`` on ``Variable(device="cuda")`` against the same step on the CPU.

The device step sums each id's gradient rows in its update kernel (one tile per
distinct id, batch order) and runs the CPU's own row bodies, so under the
simulator the tables, slots included, agree with the CPU's bit for bit.
Batches stay small: the simulator runs every CUDA thread as a Python thread.
"""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb import initializers as I
from numbaemb.optimizers import SGD, Adagrad, Adam, Ftrl, RMSprop, apply_gradients, slot_values
from jit_kernels.segment import unique_inverse
from tests.cuda_support import SIMULATOR, assert_same_floats, needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]

DIM = 5                                   # not a multiple of a tile: strided lanes end early
RULES = {
    "sgd_nesterov": SGD(0.1, momentum=0.8, nesterov=True),
    "adagrad": Adagrad(0.1, initial_accumulator_value=0.2),
    "adam": Adam(0.05, beta_1=0.8),
    "amsgrad": Adam(0.05, amsgrad=True),
    "ftrl": Ftrl(0.2, learning_rate_power=-0.6, l1_regularization_strength=0.01,
                 l2_regularization_strength=0.05, l2_shrinkage_regularization_strength=0.02,
                 beta=0.1),
    "rmsprop_centered": RMSprop(0.01, momentum=0.3, centered=True),
    "sgd": SGD(0.1),
}


def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def batch(rng, step):
    ids = np.array([0, -1, 2**63 - 1, -2**63] + list(rng.integers(-50, 50, 20)), np.int64)
    ids = ids[rng.integers(0, ids.shape[0], 24)]              # repeats
    grads = (rng.standard_normal((24, DIM)) * 10.0 ** rng.integers(-3, 3, (24, 1)))
    return ids, grads.astype(np.float32)


def state(v, rule, keys):
    return [host(v.lookup(keys))] + [np.asarray(slot_values(v, rule, s, keys))
                                      for s, _ in rule.slots()]


@pytest.mark.parametrize("mode", ["repeats", "assume_unique", "inverse", "3 shards", "delta",
                                  "delta, 2 shards"])
@pytest.mark.parametrize("name", sorted(RULES))
def test_device_steps_match_the_cpu(name, mode):
    rule = RULES[name]
    shards = {"3 shards": 3, "delta, 2 shards": 2}.get(mode, 1)
    cpu, gpu = (ne.Variable(DIM, initializer=I.RandomNormal(0.0, 1.0), seed=3, device=d,
                            num_shards=shards) for d in ("cpu", "cuda"))
    rng = np.random.default_rng(7)
    seen = []
    for step in range(1, 4):
        ids, grads = batch(rng, step)
        seen.append(ids)
        if mode in ("repeats", "3 shards") or mode.startswith("delta"):
            for v in (cpu, gpu):        # (delta: bp_v2, the change added through accum)
                apply_gradients(v, rule, ids, grads, step=step, delta=mode.startswith("delta"))
        else:
            uniq, inverse = unique_inverse(ids)
            if mode == "inverse":
                for v in (cpu, gpu):
                    apply_gradients(v, rule, uniq, grads, step=step, inverse=inverse)
            else:
                from jit_kernels.segment import segment_sum
                sums = segment_sum(grads, inverse, uniq.shape[0], 1)
                for v in (cpu, gpu):
                    apply_gradients(v, rule, uniq, sums, step=step, assume_unique=True)
    keys = np.unique(np.concatenate(seen))
    assert cpu.size() == gpu.size() == keys.shape[0]
    assert [cpu.size(s) for s in range(shards)] == [gpu.size(s) for s in range(shards)]
    for a, b in zip(state(cpu, rule, keys), state(gpu, rule, keys)):
        assert_same_floats(b, a)


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("value_dtype", ["float16", "bfloat16"])
def test_device_steps_on_16_bit_tables_match_the_cpu(value_dtype, delta):
    rule = Adam(0.05)
    cpu, gpu = (ne.Variable(DIM, value_dtype=value_dtype, initializer=I.RandomNormal(0.0, 1.0),
                            seed=3, device=d) for d in ("cpu", "cuda"))
    rng = np.random.default_rng(8)
    for step in range(1, 3):
        ids, grads = batch(rng, step)
        for v in (cpu, gpu):
            apply_gradients(v, rule, ids, grads, step=step, delta=delta)
    keys = np.unique(ids)
    (w_cpu, *slots_cpu), (w_gpu, *slots_gpu) = state(cpu, rule, keys), state(gpu, rule, keys)
    w_cpu, w_gpu = np.asarray(w_cpu, np.float32), np.asarray(w_gpu, np.float32)
    if SIMULATOR:
        np.testing.assert_array_equal(w_gpu, w_cpu)
        for a, b in zip(slots_cpu, slots_gpu):
            np.testing.assert_array_equal(b, a)
    else:   # a GPU may fuse a multiply-add or round a division differently (float32 slots:
        # 1 ulp seen on an H200), which can move a 16-bit weight by one 16-bit step
        eps = float(np.finfo(np.float16).eps) if value_dtype == "float16" else 2.0 ** -7
        np.testing.assert_allclose(w_gpu, w_cpu, rtol=eps, atol=1e-7)
        for a, b in zip(slots_cpu, slots_gpu):
            assert_same_floats(b, a)


def test_device_step_takes_device_arrays_and_applies_nothing_on_bad_input():
    from jit_kernels import cuda_table
    cuda = cuda_table.cuda_api()
    v = ne.Variable(DIM, device="cuda")
    with pytest.raises(ValueError, match="grads"):
        apply_gradients(v, Adam(), np.array([1, 2]), np.ones((3, DIM), np.float32), step=1)
    with pytest.raises(ValueError, match="inverse"):
        apply_gradients(v, Adam(), np.array([1, 2]), np.ones((2, DIM), np.float32), step=1,
                        inverse=np.array([0, 2]))
    assert v.size() == 0
    ids = cuda.to_device(np.array([4, 4, 9], np.int64))
    grads = cuda.to_device(np.ones((3, DIM), np.float32))
    apply_gradients(v, SGD(1.0), ids, grads, step=1)            # repeats summed: 2 and 1
    np.testing.assert_array_equal(host(v.lookup(np.array([4, 9]))) - host(
        ne.Variable(DIM, device="cuda").lookup(np.array([4, 9]))), [[-2.0] * DIM, [-1.0] * DIM])


def test_device_steps_on_sharded_filtered_tables_and_a_bad_partitioner():
    """Two shards with a counter filter and a custom partitioner: the CPU's tables after
    Adam steps; a partitioner answer out of range raises before anything changes (no
    filter count, no row, no step recorded)."""
    rule = Adam(0.05)
    part = lambda keys, n: (keys.view(np.uint64) >> np.uint64(3)) % np.uint64(n)  # noqa: E731
    cpu, gpu = (ne.Variable(DIM, num_shards=2, partitioner=part, seed=4, device=d,
                            admit=ne.admission.CounterFilter(min_count=2))
                for d in ("cpu", "cuda"))
    rng = np.random.default_rng(9)
    for step in range(1, 4):
        ids, grads = batch(rng, step)
        for v in (cpu, gpu):
            apply_gradients(v, rule, ids, grads, step=step)
    keys = np.unique(cpu.export()[0])
    assert 0 < gpu.size() == keys.shape[0] and gpu.size(0) == cpu.size(0)
    for a, b in zip(state(cpu, rule, keys), state(gpu, rule, keys)):
        assert_same_floats(b, a)
    gpu.partitioner = lambda keys, n: np.full(keys.shape, n, np.int64)
    counted = gpu.admit.counts.size()
    with pytest.raises(ValueError, match="partitioner"):
        apply_gradients(gpu, rule, np.array([10**6, 10**6 + 1]), np.ones((2, DIM), np.float32),
                        step=4)
    assert gpu.admit.counts.size() == counted and gpu.size() == keys.shape[0]
    assert gpu._last_step == 3
