"""String kernels (``jit_kernels.strings``) against Python oracles.

Fingerprints are checked against values TensorFlow's
``tf.strings.to_hash_bucket_fast(s, 2**63 - 1)`` gave (TF 2.21), one string per
FarmHash length band, so this runs without TensorFlow (the numbaemb string tests
compare with TF itself on hundreds of strings).
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jit_kernels import strings as ks
from tests.sizing import examples

TF_IDS = {b"": 1936946117179621456, b"a": 3694432073954588132, b"abcd": 1897425971756105985,
          b"hello world!": 4577883861590986596, b"x" * 17: 2082709914559524774,
          b"y" * 33: 8610735037765521150, b"z" * 64: 294799756062990872,
          b"w" * 65: 3272011567211491969, bytes(range(200)): 525935771297148851}

byte_lists = st.lists(st.binary(max_size=80), max_size=30)


def test_level0_ids_match_tensorflows_fingerprints():
    buf, starts = ks.pack(list(TF_IDS))
    assert ks.level0_ids(buf, starts).tolist() == list(TF_IDS.values())


def test_level0_ids_parallel_path_matches_serial():
    rng = np.random.default_rng(0)
    strs = [rng.bytes(int(n)) for n in rng.integers(0, 90, 5000)]
    buf, starts = ks.pack(strs)
    ids = np.empty(len(strs), np.int64)
    ks._level0_par(buf, starts, ids)          # what level0_ids runs on long batches
    assert ids.tolist() == ks.level0_ids(buf, starts).tolist()      # the serial kernel
    assert (ids >= 0).all() and (ids < 2 ** 63 - 1).all()


@settings(max_examples=examples(60), deadline=None)
@given(byte_lists, st.lists(st.text(max_size=10), max_size=5))
def test_pack_concatenates_utf8(bs, texts):
    items = bs + texts
    buf, starts = ks.pack(items)
    enc = [x.encode() if isinstance(x, str) else x for x in items]
    assert starts.tolist() == np.cumsum([0] + [len(x) for x in enc]).tolist()
    assert buf.tobytes() == b"".join(enc)


@settings(max_examples=examples(60), deadline=None)
@given(byte_lists, st.data())
def test_equal_to_and_gather_bytes(bs, data):
    arena_items = data.draw(st.lists(st.sampled_from(bs + [b"other"]), min_size=len(bs),
                                     max_size=len(bs)))
    arena, arena_starts = ks.pack(arena_items)
    spans = np.stack([arena_starts[:-1], np.diff(arena_starts)], 1)
    exists = np.array(data.draw(st.lists(st.booleans(), min_size=len(bs), max_size=len(bs))),
                      np.bool_)
    buf, starts = ks.pack(bs)
    which = np.arange(len(bs), dtype=np.int64)
    want = [bool(e) and a == b for a, b, e in zip(bs, arena_items, exists)]
    assert ks.equal_to(buf, starts, which, arena, spans, exists).tolist() == want
    par = np.empty(len(bs), np.bool_)
    ks._equal_par(buf, starts, which, arena, spans, exists, par)    # large batches' kernel
    assert par.tolist() == want
    out, out_starts = ks.gather_bytes(arena, spans[:, 0].copy(), spans[:, 1].copy())
    assert [out[a:b].tobytes() for a, b in zip(out_starts[:-1], out_starts[1:])] == arena_items


@settings(max_examples=examples(60), deadline=None)
@given(byte_lists)
def test_deep_ids_are_negative_per_level_and_depend_on_bytes_only(bs):
    buf, starts = ks.pack(bs)
    which = np.arange(len(bs), dtype=np.int64)
    levels = [ks.deep_ids(buf, starts, which, lv) for lv in (1, 2, 3)]
    for ids in levels:
        assert (ids < 0).all()
    for j, s in enumerate(bs):                            # a pure function of the string
        alone = ks.pack([b"prefix", s])
        assert ks.deep_ids(*alone, np.array([1]), 2)[0] == levels[1][j]
    if len(set(bs)) == len(bs) and len(bs) > 1:           # 63-bit hashes: no clash here
        assert len(set(levels[0].tolist())) == len(bs)
    if bs:
        assert all(levels[0][j] != levels[1][j] for j in range(len(bs)))
