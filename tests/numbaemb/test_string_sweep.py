"""A string table forgets the strings of ids that left it (evicted by ``max_capacity``,
held back by an admission filter, left out of a load): its names stay bounded by its
keys, every held key keeps its name, and a training lookup's new strings wait for its
optimizer step (:meth:`numbaemb.string_keys.StringVariable._sweep_names`)."""
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import numbaemb as ne
from jit_kernels import strings as ks
from numbaemb import admission
from numbaemb import optimizers as O
from numbaemb import string_keys
from tests.sizing import examples

POOL = [b"", b"\x00", b"user:1", b"user:2", "caf\u00e9".encode()] + \
    [f"item-{i}".encode() for i in range(40)]
DIM = 2


def fingerprints(keys):
    buf, starts = ks.pack(np.array(keys, object))
    return ks.level0_ids(buf, starts)


class BoundedStrings(RuleBasedStateMachine):
    """A bounded string table against a bounded int table fed the strings' ids (level 0:
    no two strings of the pool share one): the same keys, rows and evictions; a string
    for every held key, and at most a bounded count of strings more."""
    WINDOW = "bucket"

    def __init__(self):
        super().__init__()
        kw = dict(dim=DIM, max_capacity=20, evict="lru", evict_window=self.WINDOW,
                  initializer=ne.initializers.RandomNormal(seed=3))
        self.var = ne.Variable(key_dtype="string", **kw)
        self.ref = ne.Variable(**kw)

    def draw(self, data):
        return data.draw(st.lists(st.sampled_from(POOL), max_size=12), label="keys")

    @rule(data=st.data())
    def find_or_insert(self, data):
        keys = self.draw(data)
        got = self.var.find_or_insert(np.array(keys, object))
        np.testing.assert_array_equal(got, self.ref.find_or_insert(fingerprints(keys)))

    @rule(data=st.data())
    def upsert(self, data):
        keys = self.draw(data)
        vals = np.arange(DIM * len(keys), dtype=np.float32).reshape(-1, DIM)
        self.var.upsert(np.array(keys, object), vals)
        self.ref.upsert(fingerprints(keys), vals)

    @rule(data=st.data())
    def training_step(self, data):
        """A training lookup registers the batch's strings, its optimizer step inserts."""
        keys = self.draw(data)
        ids = self.var.ids(np.array(keys, object), insert=True)
        np.testing.assert_array_equal(ids, fingerprints(keys))
        grads = np.ones((len(keys), DIM), np.float32)
        O.apply_gradients(self.var, O.SGD(), ids, grads, step=1, learning_rate=0.5)
        O.apply_gradients(self.ref, O.SGD(), ids, grads, step=1, learning_rate=0.5)

    @rule(data=st.data())
    def remove(self, data):
        keys = self.draw(data)
        self.var.remove(np.array(keys, object))
        self.ref.remove(fingerprints(keys))

    @invariant()
    def same_table_and_names(self):
        strings, vals = self.var.export()
        ids, want = self.ref.export()
        order = np.argsort(ids)
        got = dict(zip(fingerprints(strings.tolist()).tolist(), map(tuple, vals.tolist())))
        assert got == dict(zip(ids[order].tolist(), map(tuple, want[order].tolist())))
        named = self.var.names.ids()
        assert np.isin(ids, named).all()                      # every key has its string
        # the rest: at most what the sweep tolerates, and what it spares (the strings of
        # the last registering calls before it and the one before: 12 keys a call)
        spared = 2 * string_keys.RECENT_CALLS * 12
        assert named.shape[0] <= 2 * self.var.size() + string_keys.SWEEP_SLACK + spared


@pytest.fixture(autouse=True)
def _sweep_often(monkeypatch):
    monkeypatch.setattr(string_keys, "SWEEP_SLACK", 3)


TestBucketed = BoundedStrings.TestCase
TestBucketed.settings = settings(max_examples=examples(30), stateful_step_count=25)
TestWindow = type("BoundedStringsWindow", (BoundedStrings,), dict(WINDOW=4)).TestCase
TestWindow.settings = settings(max_examples=examples(15), stateful_step_count=25)


def test_a_stream_through_a_bounded_table_keeps_its_names_bounded():
    v = ne.Variable(dim=2, key_dtype="string", max_capacity=50)
    most = 0
    for i in range(60):
        batch = np.array([f"user-{i}-{j}-".encode() * 4 for j in range(40)], object)
        if i % 2:
            v.find_or_insert(batch)
        else:
            ids = v.ids(batch, insert=True)
            O.apply_gradients(v, O.Adam(0.1), ids, np.ones((40, 2), np.float32), step=i + 1)
        most = max(most, len(v.names))
    assert v.size() == 50 and most <= 3 * (2 * 50 + 3 + 40)
    assert len(v.export()[0]) == 50


def test_a_training_lookups_new_strings_outlive_one_sweep():
    v = ne.Variable(dim=2, key_dtype="string", max_capacity=4)
    pending = v.ids(np.array([b"a", b"b"], object), insert=True)   # the training lookup
    v.find_or_insert(np.array([f"x{i}" for i in range(8)], object))   # a sweep meanwhile
    O.apply_gradients(v, O.SGD(), pending, np.ones((2, 2), np.float32), step=1)
    assert sorted(v.lookup(np.array([b"a", b"b"], object), return_exists=True)[1]) == \
        [True, True]
    # two sweeps later a registration that never got its step is forgotten, and a step
    # by its id then raises as for a removed string (nothing applied)
    late = v.ids(np.array([b"never"], object), insert=True)
    for r in range(3):
        v.find_or_insert(np.array([f"y{r}-{i}" for i in range(8)], object))
    assert late[0] not in v.names.ids()
    with pytest.raises(ValueError, match="belong to no string"):
        O.apply_gradients(v, O.SGD(), late, np.ones((1, 2), np.float32), step=2)


def test_strings_an_admission_filter_holds_back_are_forgotten():
    v = ne.Variable(dim=2, key_dtype="string", admit=admission.CounterFilter(min_count=3))
    for i in range(30):
        v.find_or_insert(np.array([f"once-{i}-{j}" for j in range(10)] + ["hot"], object))
    assert v.size() == 1 and v.export()[0].tolist() == [b"hot"]
    assert len(v.names) <= 3 * (2 + 3 + 11)


def test_a_smaller_load_keeps_only_the_kept_keys_strings(tmp_path):
    v = ne.Variable(dim=2, key_dtype="string", max_capacity=30, evict="lfu")
    keys = np.array([f"k{i}" for i in range(30)], object)
    v.find_or_insert(keys)
    v.find_or_insert(keys[:10])                       # the first 10 count twice
    v.save(str(tmp_path / "s.nbe"))
    with pytest.warns(UserWarning, match="20 keys of checkpoint"):
        u = ne.Variable.load(str(tmp_path / "s.nbe"), max_capacity=10)
    assert sorted(u.export()[0].tolist()) == sorted(k.encode() for k in keys[:10])
    assert len(u.names) == 10


def test_evicted_strings_scores_and_filters_on_a_string_table():
    """``return_evicted`` hands out the evicted strings (their names are gone after the
    call), ``scores`` reach a custom policy, and a filtered table's inner call works."""
    v = ne.Variable(dim=2, key_dtype="string", max_capacity=4, evict="custom")
    v.find_or_insert(np.array(["a", "b", "c", "d"], object), scores=np.array([4, 3, 2, 1]))
    _, exists, gone, values = v.find_or_insert(
        np.array(["e", "f"], object), return_exists=True, return_evicted=True,
        scores=np.array([10, 11]))
    assert sorted(gone.tolist()) == [b"c", b"d"] and values.shape == (2, 2)
    assert not exists.any() and sorted(v.export()[0].tolist()) == [b"a", b"b", b"e", b"f"]
    v.upsert(np.array(["g"], object), np.ones((1, 2)), scores=np.array([20]))
    assert b"g" in v.export()[0].tolist() and b"b" not in v.export()[0].tolist()
    w = ne.Variable(dim=2, key_dtype="string", max_capacity=8,
                    admit=admission.CounterFilter(min_count=2))
    for _ in range(2):
        w.find_or_insert(np.array(["x", "y"], object), return_evicted=True)
    assert sorted(w.export()[0].tolist()) == [b"x", b"y"]
