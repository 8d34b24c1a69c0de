"""Bad input on one rank, ranks in different ops, disagreeing configurations: every rank
raises the same clear error, nothing is applied anywhere, and nothing hangs."""
import numpy as np
import pytest

import numbaemb as ne
from numbaemb._mpi import CollectiveMismatch

from .conftest import COMM, RANK, WORLD, agree, multi_rank

pytestmark = multi_rank
LAST = WORLD - 1


def table(name="errors", dim=2):
    v = ne.Variable(dim, comm=COMM, name=name)
    v.upsert(np.arange(10) + 10 * RANK, np.full((10, dim), RANK, np.float32))
    return v


def snapshot(v):
    k, x = v.export()
    o = np.argsort(k)
    return v.size(), k[o].tolist(), x[o].tolist()


def test_a_plain_variable_is_not_distributed():
    v = table()
    agree(type(v).__name__ == "DistributedVariable" and v.comm is COMM)
    agree(v.size() == 10 * WORLD)
    agree(type(ne.Variable(2, comm=COMM.Split(RANK, 0))) is ne.Variable, "1-rank comm")

    one = ne.Variable(2, key_dtype="string", comm=COMM.Split(RANK, 0))     # one rank: fine
    agree(type(one).__name__ == "StringVariable", "1-rank string table")


def test_string_keys_are_refused_on_a_split_table():
    with pytest.raises(ValueError, match="string keys .* one process"):
        ne.Variable(2, key_dtype="string", comm=COMM)


@pytest.mark.parametrize("op", ["lookup", "find_or_insert", "upsert", "accum", "remove",
                                "apply_gradients"])
def test_bad_keys_on_one_rank_raise_everywhere_and_apply_nothing(op):
    v = table()
    before = snapshot(v)
    keys = np.array([1.5, 2.0]) if RANK == LAST else np.array([1, 2])
    vals = np.ones((2, 2), np.float32)
    calls = {"lookup": lambda: v.lookup(keys), "find_or_insert": lambda: v.find_or_insert(keys),
             "upsert": lambda: v.upsert(keys, vals),
             "accum": lambda: v.accum(keys, vals, vals, np.array([True, False])),
             "remove": lambda: v.remove(keys),
             "apply_gradients": lambda: ne.optimizers.apply_gradients(
                 v, ne.optimizers.SGD(0.1), keys, vals, step=1)}
    with pytest.raises(ne.DtypeError, match=f"rank {LAST} of {WORLD}: .*integers") as got:
        calls[op]()
    assert isinstance(got.value, TypeError) and isinstance(got.value, ValueError)  # every rank
    agree(snapshot(v) == before, "a failed op changed the table")


def test_wrong_value_shape_on_one_rank():
    v = table()
    before = snapshot(v)
    vals = np.ones((3 if RANK == 0 else 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"rank 0 of \d+: values must have shape"):
        v.upsert(np.array([1, 2]), vals)
    agree(snapshot(v) == before)


def test_bad_step_and_disagreeing_optimizers():
    v = table()
    before = snapshot(v)
    with pytest.raises(ValueError, match=f"rank {LAST} of {WORLD}: step must be >= 1"):
        ne.optimizers.apply_gradients(v, ne.optimizers.SGD(0.1), np.array([1]),
                                      np.ones((1, 2)), step=0 if RANK == LAST else 1)
    opt = ne.optimizers.Adam(0.1 if RANK == 0 else 0.2)
    with pytest.raises(CollectiveMismatch, match="Adam"):
        ne.optimizers.apply_gradients(v, opt, np.array([1]), np.ones((1, 2)), step=1)
    agree(snapshot(v) == before)


def test_ranks_in_different_ops_raise_instead_of_hanging():
    v = table()
    before = snapshot(v)
    with pytest.raises(CollectiveMismatch, match="rank 0: lookup on table 'errors'"):
        if RANK == 0:
            v.lookup(np.array([1]))
        else:
            v.remove(np.array([1]))
    agree(snapshot(v) == before)
    w = table("other")
    with pytest.raises(CollectiveMismatch, match="'errors'.*'other'|'other'.*'errors'"):
        (v if RANK == 0 else w).lookup(np.array([1]))
    agree(v.lookup(np.array([3])).tolist() == [[0.0, 0.0]], "usable after the error")


def test_ranks_that_disagree_on_the_table_raise_at_creation():
    with pytest.raises(ValueError, match="dim"):
        ne.Variable(4 if RANK == 0 else 8, comm=COMM, name="cfg")
    with pytest.raises(ValueError, match=f"rank {LAST} of {WORLD}: dim must be >= 1"):
        ne.Variable(0 if RANK == LAST else 4, comm=COMM, name="cfg")
    agree(table("after").size() == 10 * WORLD)


def test_bad_partitioner_output_on_one_rank():
    def part(keys, n):
        return np.full(keys.shape, n if RANK == 0 else 0)
    v = ne.Variable(2, comm=COMM, partitioner=part, name="part")
    with pytest.raises(ValueError, match=r"rank 0 of \d+: partitioner returned ranks outside"):
        v.find_or_insert(np.array([1, 2]))
    agree(v.size() == 0)


def test_empty_batches_and_local_reads():
    v = table()
    out = v.lookup(np.empty((0, 3), np.int64) if RANK == 0 else np.array([[1, 11]]))
    agree(out.shape == ((0, 3, 2) if RANK == 0 else (1, 2, 2)))
    keys, _ = v.export()
    agree((ne.default_partitioner(keys, WORLD) == RANK).all() and v.local_size() == keys.size)
    agree(len(set(COMM.allgather(v.size()))) == 1, "size differs between ranks")
