"""Exchange planning kernels against a plain NumPy oracle, world sizes 1 to 8, one process."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jit_kernels.exchange import check_owners, default_owners, first_flags, plan
from numbaemb.sharding import default_partitioner

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
EXTREMES = [INT64_MIN, INT64_MAX, -1, 0, 1, INT64_MIN + 1, INT64_MAX - 1]
keys_st = st.lists(st.one_of(st.sampled_from(EXTREMES), st.integers(-50, 50),
                             st.integers(INT64_MIN, INT64_MAX)), max_size=60)


def naive_plan(keys, n_ranks, owner_fn):
    """The plan written out plainly: distinct keys by first occurrence, grouped by owner."""
    uniq, first = [], {}
    for k in keys:
        if k not in first:
            first[k] = len(uniq)
            uniq.append(k)
    owners = [int(owner_fn(np.array([k]), n_ranks)[0]) for k in uniq]
    send = [k for r in range(n_ranks) for k, o in zip(uniq, owners) if o == r]
    counts = [owners.count(r) for r in range(n_ranks)]
    where = {k: i for i, k in enumerate(send)}
    return send, counts, [where[k] for k in keys], [first[k] for k in keys]


@pytest.mark.parametrize("n_ranks", range(1, 9))
@given(keys=keys_st)
def test_plan_matches_oracle(n_ranks, keys):
    arr = np.array(keys, np.int64)
    p = plan(arr, n_ranks)
    send, counts, slot, inverse = naive_plan(keys, n_ranks, default_partitioner)
    assert p.send_keys.tolist() == send
    assert p.counts.tolist() == counts
    assert p.slot.tolist() == slot
    assert p.inverse.tolist() == inverse
    assert (p.send_keys[p.slot] == arr).all()          # rows sent back land in batch order


@pytest.mark.parametrize("n_ranks", [1, 3, 8])
@given(keys=keys_st)
def test_plan_without_dedupe_keeps_batch_order_per_owner(n_ranks, keys):
    arr = np.array(keys, np.int64)
    p = plan(arr, n_ranks, unique=False)
    owner = default_partitioner(arr, n_ranks)
    want = np.concatenate([arr[owner == r] for r in range(n_ranks)]) if len(keys) else arr
    assert p.send_keys.tolist() == want.tolist()
    assert (p.send_keys[p.slot] == arr).all()
    assert sorted(p.slot.tolist()) == list(range(len(keys)))


@pytest.mark.parametrize("n_ranks", range(1, 9))
@given(keys=st.lists(st.integers(-2**31, 2**31 - 1), max_size=40))
def test_int32_owners_use_the_unsigned_32_bit_value(n_ranks, keys):
    k32 = np.array(keys, np.int32)
    assert default_owners(k32.astype(np.int64), n_ranks, bits=32).tolist() == \
        default_partitioner(k32, n_ranks).tolist()
    p = plan(k32.astype(np.int64), n_ranks, key_dtype=np.int32)
    assert p.send_keys.dtype == np.int32
    assert (p.send_keys[p.slot] == k32).all()


def test_custom_partitioner_and_its_checks():
    keys = np.array([10, 11, 12, 10], np.int64)
    p = plan(keys, 2, partitioner=lambda k, n: (k >= 11).astype(np.int64))
    assert p.send_keys.tolist() == [10, 11, 12] and p.counts.tolist() == [1, 2]
    with pytest.raises(ValueError, match="outside"):
        plan(keys, 2, partitioner=lambda k, n: np.full(k.shape, 2))
    with pytest.raises(ValueError, match="shape"):
        check_owners(np.zeros(2, np.int64), (3,), 2)


@given(keys=keys_st, flags=st.lists(st.booleans(), min_size=60, max_size=60))
def test_first_flags(keys, flags):
    """A key's first occurrence takes the owner's flag; repeats report found."""
    arr = np.array(keys, np.int64)
    p = plan(arr, 3)
    back = np.array(flags[:p.send_keys.shape[0]], np.bool_)
    out = np.empty(arr.shape[0], np.bool_)
    first_flags(p.inverse, p.slot, back, out)
    seen, want = set(), []
    for i, k in enumerate(keys):
        want.append(bool(back[p.slot[i]]) if k not in seen else True)
        seen.add(k)
    assert out.tolist() == want
