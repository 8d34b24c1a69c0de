"""Tables split across ranks with their rows on GPUs (``device="cuda"``): the exchange
planned on the GPU (:mod:`jit_kernels.cuda_exchange`) and device arrays moved between
ranks (NCCL on GPUs, MPI through host copies under the simulator).

The state machine of ``test_table_state`` runs on a split GPU table against a
one-process CPU table fed the ranks' batches concatenated (every op), with the
pool's extreme keys; values and
gradients are small integers, so sums are exact in any order, and under the
simulator (the CPU's own bodies) rows must be equal bit for bit.  Runs under
``NUMBA_ENABLE_CUDASIM=1 mpiexec -n 2`` / ``-n 3`` (``tox -e mpi``) or on GPUs.
"""
import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import numbaemb as ne
from tests.cuda_support import CUDA_OK, SIMULATOR, same_floats

from .conftest import COMM, RANK, WORLD, multi_rank
from .test_table_state import DIM, DistributedTable

pytestmark = [multi_rank, pytest.mark.skipif(not CUDA_OK, reason="needs a GPU or the simulator")]


def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def device(rank):
    """A GPU a rank (the simulator has one device for all)."""
    if SIMULATOR:
        return "cuda"
    from numba import cuda
    return f"cuda:{rank % len(cuda.gpus)}"


class SplitGpuTable(DistributedTable):
    """``DistributedTable`` on a split GPU table (results compared on the host)."""

    def make(self, kw):
        return ne.Variable(DIM, comm=COMM, device=device(RANK), **kw)

    host = staticmethod(host)
    same = staticmethod(same_floats)    # a GPU's optimizer steps: within 1e-5 (it fuses FMAs)
    save_and_load = None    # once below: a save per state machine step is slow here


def test_equals_one_process():
    SplitGpuTable.checks = 0
    profile = settings.get_profile("mpi")
    small = SIMULATOR and profile.max_examples < 100     # the simulator: a Python thread
    examples = 3 if small else profile.max_examples      # a CUDA thread (long runs: all)
    run_state_machine_as_test(SplitGpuTable, settings=settings(
        profile, max_examples=examples,
        stateful_step_count=8 if small else profile.stateful_step_count))
    ran = COMM.allgather(SplitGpuTable.checks)
    assert len(set(ran)) == 1 and ran[0] >= examples, ran


INIT = ne.initializers.RandomUniform(-1, 1, seed=5)


def test_device_arrays_in_and_out_and_the_transport():
    v = ne.Variable(2, comm=COMM, device=device(RANK), name="io", initializer=INIT)
    assert v.transport == "not chosen yet"
    keys = np.array([np.iinfo(np.int64).min, -1, 0, 7, 7, RANK], np.int64)
    rows = v.find_or_insert(from_cuda_keys(keys))         # device keys in, device rows out
    assert not isinstance(rows, np.ndarray) and rows.shape == (6, 2)
    want = ne.Variable(2, initializer=INIT).lookup(keys)  # initial values: seed and key only
    assert np.array_equal(host(rows), want)
    staged = "mpi (staged through host memory)"
    if SIMULATOR:
        assert v.transport == staged
    else:                   # NCCL wants a GPU a rank (it refuses two ranks on one)
        from numba import cuda
        assert v.transport == "nccl" if len(cuda.gpus) >= WORLD else v.transport in (
            "nccl", staged)
    assert v.size() == len(set(COMM.allreduce(keys.tolist())))
    # exists: only a new key's first occurrence, in rank order, reports absent
    ref = ne.Variable(2, initializer=INIT)
    ref.find_or_insert(np.concatenate(COMM.allgather(keys)))
    again = np.array([5, 7, 5, -1, 100 + RANK, 100 + RANK, 5], np.int64)
    every = COMM.allgather(again)
    rows, exists = v.find_or_insert(again, return_exists=True)
    want_rows, want_exists = ref.find_or_insert(np.concatenate(every), return_exists=True)
    mine = slice(sum(len(b) for b in every[:RANK]), sum(len(b) for b in every[:RANK + 1]))
    assert np.array_equal(host(exists), want_exists[mine]), (host(exists), want_exists[mine])
    assert np.array_equal(host(rows), want_rows[mine])
    assert not host(exists)[0] if RANK == 0 else host(exists)[0]    # 5: new, rank 0's first


def from_cuda_keys(keys):
    from numba import cuda
    return cuda.to_device(keys)


def skewed(keys, n):
    """A custom partitioner (a Python function of host keys): most keys to rank 0."""
    return np.where(keys % 4 == 1, keys.view(np.uint64) % np.uint64(n), 0).astype(np.int64)


def test_custom_partitioner_splits_as_the_cpu_table_does():
    """A custom partitioner on a split GPU table (asked on the host, the plan on the
    GPU): each rank's table is the split CPU table's with the same partitioner, after
    inserts, an optimizer step and accum; a bad answer on one rank raises on every rank
    and applies nothing."""
    kw = dict(partitioner=skewed, initializer=INIT)
    gpu = ne.Variable(2, comm=COMM, device=device(RANK), name="skewed", **kw)
    cpu = ne.Variable(2, comm=COMM, name="skewed_cpu", **kw)
    keys = np.array([np.iinfo(np.int64).min, -1, 0, 5, 5, 9, 13, 4 * RANK + 1], np.int64)
    for v in (gpu, cpu):
        v.find_or_insert(keys)
        ne.optimizers.apply_gradients(v, ne.optimizers.SGD(1.0), keys,
                                      np.ones((8, 2), np.float32), step=1)
        v.accum(keys[:3], np.zeros((3, 2), np.float32), np.ones((3, 2), np.float32),
                np.ones(3, np.bool_))
    (kg, vg), (kc, vc) = (tuple(host(a) for a in v.export()) for v in (gpu, cpu))
    og, oc = np.argsort(kg), np.argsort(kc)
    assert np.array_equal(kg[og], kc[oc]) and np.array_equal(vg[og], vc[oc])
    assert np.array_equal(skewed(kg, WORLD), np.full(kg.shape, RANK))
    size = gpu.size()
    gpu.partitioner = gpu._x.partitioner = (lambda k, n: np.full(k.shape, n)) if RANK == 1 \
        else skewed
    with pytest.raises(ValueError, match="rank 1 of"):
        gpu.find_or_insert(np.array([1000, 1001], np.int64))
    assert gpu.size() == size


def test_mixed_devices_refused_on_every_rank():
    v = ne.Variable(2, comm=COMM, device=device(RANK), name="refusals")
    with pytest.raises(ValueError, match="gpu"):          # one rank's table on the CPU
        ne.Variable(2, comm=COMM, device=device(RANK) if RANK else "cpu", name="mixed")
    assert v.size() == 0


def test_bad_keys_on_one_rank_apply_nothing_anywhere():
    v = ne.Variable(2, comm=COMM, device=device(RANK), name="bad")
    v.find_or_insert(np.arange(4))
    keys = np.array([1.5, 2.0]) if RANK == WORLD - 1 else np.array([1, 9])
    with pytest.raises(ne.DtypeError, match=f"rank {WORLD - 1} of {WORLD}"):
        ne.optimizers.apply_gradients(v, ne.optimizers.SGD(0.1), keys,
                                      np.ones((2, 2), np.float32), step=1)
    assert v.size() == 4 and np.array_equal(host(v.lookup(np.arange(4))),
                                            ne.Variable(2).lookup(np.arange(4)))


def test_bounded_owners_evict_as_one_process_fed_what_they_receive():
    """Each owner's bounded GPU table sees the keys in the order of the CPU plan (ranks in
    order, first occurrences), custom scores travel with them, and the evicted keys come
    back to their owner."""
    from .test_bounded import batch, received
    kw = dict(max_capacity=25, evict="custom", evict_window=8, initializer=INIT)
    v = ne.Variable(3, comm=COMM, device=device(RANK), name="bounded_gpu", **kw)
    oracle = ne.Variable(3, **kw)

    def score(ids, call):                     # a function of the key: repeats agree
        return (ids * 7919 + call) % 1000

    for call in range(4):
        ids = batch(call, RANK)
        _, ev, _ = v.find_or_insert(ids, scores=score(ids, call), return_evicted=True)
        seq = received(call)
        _, o_ev, _ = oracle.find_or_insert(seq, scores=score(seq, call), return_evicted=True)
        assert np.array_equal(host(ev), o_ev)
    keys, vals = (host(a) for a in v.export())
    want_keys, want_vals = oracle.export()
    o, w = np.argsort(keys), np.argsort(want_keys)
    assert np.array_equal(keys[o], want_keys[w]) and np.array_equal(vals[o], want_vals[w])


def test_save_then_load_in_one_process_and_split(tmp_path_factory):
    from .conftest import shared_tmpdir
    v = ne.Variable(2, comm=COMM, device=device(RANK), name="saved", initializer=INIT)
    keys = np.array([np.iinfo(np.int64).max, -1, 3, RANK], np.int64)
    v.upsert(keys, np.full((4, 2), RANK + 1, np.float32))
    d = shared_tmpdir(tmp_path_factory) + "/ckpt"
    v.save(d)
    one = ne.Variable.load(d, device="cpu")               # every part, one CPU table
    every = np.array(sorted(set(COMM.allreduce(keys.tolist()))), np.int64)
    assert one.size() == every.shape[0]
    w = ne.Variable.load(d, comm=COMM)                     # split again, on the GPUs saved
    assert w.device != "cpu" and np.array_equal(host(w.lookup(every)), one.lookup(every))


def test_accum_sends_every_position_in_batch_order():
    """TFRA's accum: every position reaches its owner (ranks in order, batch order
    within), which applies the sequential rule as one process fed the batches does."""
    from .test_bounded import accum_args
    v = ne.Variable(2, comm=COMM, device=device(RANK), name="accum_gpu", initializer=INIT)
    ref = ne.Variable(2, initializer=INIT)
    for call in range(3):
        mine = accum_args(call, RANK)
        v.accum(*mine)
        every = [accum_args(call, r) for r in range(WORLD)]
        ref.accum(*(np.concatenate([e[i] for e in every]) for i in range(4)))
    keys, vals = (host(a) for a in v.export())
    parts = COMM.allgather((keys, vals))
    keys, vals = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    want_keys, want_vals = ref.export()
    o, w = np.argsort(keys), np.argsort(want_keys)
    assert keys.shape[0] > 20 and np.array_equal(keys[o], want_keys[w])
    assert np.array_equal(vals[o], want_vals[w])
