"""Random call sequences on a CUDA bounded table and the same CPU table (simulator or GPU).

A hypothesis state machine drives both tables (a bucketed index, or a small window of
a linear one) with inserts, upserts (custom scores too), removals, optimizer steps and
epochs, the extreme keys always in play, and checks after every call that the GPU
table returns and holds what the CPU table does, bit for bit (the CPU table itself
is checked against oracles in ``tests/numbaemb/test_bounded.py``).  Small tables and
batches: the simulator runs a Python thread per CUDA thread.
"""
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import numbaemb as ne
from numbaemb import initializers as I
from numbaemb import optimizers as O
from tests.cuda_support import needs_cuda
from tests.numbaemb.test_cuda_bounded import host, same_state
from tests.sizing import examples

pytestmark = [pytest.mark.cuda, needs_cuda]
EXTREMES = [-2**63, 2**63 - 1, -1, 0]
KEYS = st.lists(st.one_of(st.sampled_from(EXTREMES), st.integers(-60, 60)), max_size=24)


class CudaMatchesCpu(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(["lru", "lfu", "epoch_lfu", "custom"]),
                window=st.sampled_from(["bucket", 3]))
    def make(self, policy, window):
        kw = dict(dim=2, initializer=I.RandomUniform(-1, 1), seed=4, max_capacity=20,
                  evict=policy, evict_window=window)
        self.gpu, self.cpu = ne.Variable(device="cuda", **kw), ne.Variable(**kw)
        self.custom, self.step = policy == "custom", 0

    def scores(self, keys, data):
        return data.draw(st.lists(st.integers(0, 30), min_size=len(keys),
                                  max_size=len(keys))) if self.custom else None

    @rule(keys=KEYS, data=st.data())
    def find_or_insert(self, keys, data):
        keys, sc = np.array(keys, np.int64), self.scores(keys, data)
        want = self.cpu.find_or_insert(keys, return_exists=True, return_evicted=True,
                                       scores=sc)
        got = self.gpu.find_or_insert(keys, return_exists=True, return_evicted=True,
                                      scores=sc)
        for name, a, b in zip(("values", "exists", "evicted keys", "evicted values"),
                              got, want):
            np.testing.assert_array_equal(host(a), b, err_msg=name)

    @rule(keys=KEYS, data=st.data())
    def upsert(self, keys, data):
        keys, sc = np.array(keys, np.int64), self.scores(keys, data)
        vals = np.arange(2 * len(keys), dtype=np.float32).reshape(-1, 2)
        self.cpu.upsert(keys, vals, scores=sc)
        self.gpu.upsert(keys, vals, scores=sc)

    @rule(keys=KEYS)
    def remove(self, keys):
        keys = np.array(keys, np.int64)
        self.cpu.remove(keys)
        self.gpu.remove(keys)

    @rule(keys=KEYS)
    def train(self, keys):
        if self.custom:             # (an optimizer step gives no scores)
            return
        self.step += 1
        keys = np.array(keys, np.int64)
        grads = np.ones((keys.shape[0], 2), np.float32)
        for v in (self.cpu, self.gpu):
            O.apply_gradients(v, O.SGD(0.5), keys, grads, step=self.step)

    @rule(epoch=st.integers(1, 5))
    def set_epoch(self, epoch):
        self.cpu.set_epoch(epoch)
        self.gpu.set_epoch(epoch)

    @invariant()
    def same_table(self):
        if hasattr(self, "gpu"):
            same_state(self.gpu, self.cpu)
            keys = np.array(EXTREMES + list(range(-60, 61, 7)), np.int64)
            np.testing.assert_array_equal(host(self.gpu.lookup(keys)), self.cpu.lookup(keys))


TestCudaMatchesCpu = CudaMatchesCpu.TestCase
TestCudaMatchesCpu.settings = settings(max_examples=examples(12), stateful_step_count=10,
                                       deadline=None)
