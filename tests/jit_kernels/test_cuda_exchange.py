"""The exchange planned on a GPU (:mod:`jit_kernels.cuda_exchange`) against the CPU
plan (:mod:`jit_kernels.exchange`): the same send buffer, counts and slots for world
sizes 1 to 8, gradient sums bit for bit, flags in batch order."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jit_kernels import cuda_exchange as cx
from jit_kernels import cuda_table as ct
from jit_kernels.exchange import first_flags, plan
from jit_kernels.segment import segment_sum
from tests.cuda_support import needs_cuda
from tests.sizing import examples

pytestmark = [pytest.mark.cuda, needs_cuda]
I64 = np.iinfo(np.int64)
I32 = np.iinfo(np.int32)
EXTREMES = [int(I64.min), int(I64.max), -1, 0, int(I32.min), int(I32.max)]


@pytest.fixture(scope="module")
def cuda():
    return ct.cuda_api()


def check(cuda, keys, n_ranks, bits=64, dim=3):
    want = plan(keys, n_ranks, key_dtype=np.int64 if bits == 64 else np.int32)
    send, counts, slot, first = cx.plan(cuda.to_device(keys), n_ranks, bits)
    assert send.copy_to_host().tolist() == want.send_keys.astype(np.int64).tolist()
    assert counts.tolist() == want.counts.tolist()
    assert slot.copy_to_host().tolist() == want.slot.tolist()
    u = want.send_keys.shape[0]
    grads = np.random.default_rng(keys.shape[0]).standard_normal((keys.shape[0], dim))
    grads = grads.astype(np.float32)
    sums = cx.segment_sums(cuda.to_device(grads), slot, u).copy_to_host()
    assert np.array_equal(sums, segment_sum(grads, want.slot, u, 1))    # bit for bit
    back = np.arange(u) % 3 == 0
    flags = np.empty(keys.shape[0], np.bool_)
    first_flags(want.inverse, want.slot, back, flags)
    assert cx.pick(cuda.to_device(back), slot, first).copy_to_host().tolist() == flags.tolist()
    assert cx.pick(cuda.to_device(back), slot).copy_to_host().tolist() == back[want.slot].tolist()


@settings(max_examples=examples(10))
@given(keys=st.lists(st.sampled_from(EXTREMES) | st.integers(-40, 40), max_size=60),
       n_ranks=st.integers(1, 8))
def test_plan_equals_the_cpu_plan(cuda, keys, n_ranks):
    check(cuda, np.array(keys, np.int64), n_ranks)


def test_large_batches_use_the_chunked_grouping(cuda):
    """Above ``GROUP_CHUNK`` positions the owners' counting sort runs by chunks (one
    case: the simulator interprets every thread)."""
    rng = np.random.default_rng(3)
    keys = rng.integers(-200, 200, 2 * ct.GROUP_CHUNK + 17).astype(np.int64)
    keys[:len(EXTREMES)] = EXTREMES
    check(cuda, keys, 5, dim=1)


@settings(max_examples=examples(6))
@given(keys=st.lists(st.sampled_from(EXTREMES) | st.integers(-40, 40), max_size=40),
       n_ranks=st.integers(1, 8))
def test_every_position_plan_equals_the_cpu_plan(cuda, keys, n_ranks):
    """``unique=False`` (accum): every position, grouped by owner in batch order."""
    keys = np.array(keys, np.int64)
    want = plan(keys, n_ranks, unique=False)
    send, counts, slot, first = cx.plan(cuda.to_device(keys), n_ranks, unique=False)
    assert send.copy_to_host().tolist() == want.send_keys.tolist()
    assert counts.tolist() == want.counts.tolist()
    assert slot.copy_to_host().tolist() == want.slot.tolist()
    assert first.copy_to_host().all()


def skewed(keys, n):
    """A custom partitioner: most keys to the last rank."""
    return np.where(keys % 3 == 0, (keys // 3) % n, n - 1)


@settings(max_examples=examples(8))
@given(keys=st.lists(st.sampled_from(EXTREMES) | st.integers(-40, 40), max_size=50),
       n_ranks=st.integers(1, 8), unique=st.booleans())
def test_plan_with_given_owners_equals_the_cpu_plan_with_a_partitioner(cuda, keys, n_ranks,
                                                                       unique):
    keys = np.array(keys, np.int64)
    want = plan(keys, n_ranks, skewed, unique=unique)
    owners = cuda.to_device(skewed(keys, n_ranks).astype(np.int64))
    send, counts, slot, _ = cx.plan(cuda.to_device(keys), n_ranks, unique=unique,
                                    owners=owners)
    assert send.copy_to_host().tolist() == want.send_keys.tolist()
    assert counts.tolist() == want.counts.tolist()
    assert slot.copy_to_host().tolist() == want.slot.tolist()


def test_int32_keys_take_the_owner_of_their_32_bits(cuda):
    keys = np.array([-1, int(I32.min), int(I32.max), 0, -7, -1], np.int64)   # sign-extended
    check(cuda, keys, 3, bits=32)
    check(cuda, keys, 7, bits=32)    # (2**64 and 2**32 differ mod 7, not mod 3 or 5)


def test_empty_batch(cuda):
    send, counts, slot, first = cx.plan(cuda.to_device(np.empty(0, np.int64)), 4)
    assert send.shape == (0,) and counts.tolist() == [0] * 4 and slot.shape == (0,)
    assert cx.segment_sums(cuda.to_device(np.empty((0, 3), np.float32)), slot, 0).shape == (0, 3)
