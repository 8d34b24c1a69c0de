"""Native checkpoints: round trips, resharding, atomic overwrite, corrupt input.

The reference is the saved variable itself: after ``load`` every key, every
column and the initial value of every absent key must be what they were.
"""
import io
import json
import os
import subprocess
import sys
import threading
import warnings
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numbaemb as ne
from numbaemb import checkpoint
from numbaemb.sharding import default_partitioner
from tests.cuda_support import CUDA_OK, needs_cuda
from tests.sizing import examples

I64 = np.iinfo(np.int64)
I32 = np.iinfo(np.int32)


# ---- helpers -------------------------------------------------------------------------
def _host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _sorted_export(v, column="values"):
    keys, vals = map(_host, v.export(column))
    order = np.argsort(keys, kind="stable")
    return keys[order], vals[order]


def _assert_same(v, w, columns=("values",)):
    assert w.size() == v.size()
    assert (w.dim, w.key_dtype, w.value_dtype, w.name, w.seed) == \
        (v.dim, v.key_dtype, v.value_dtype, v.name, v.seed)
    assert w.initializer == v.initializer
    for c in columns:
        k1, x1 = _sorted_export(v, c)
        k2, x2 = _sorted_export(w, c)
        assert k1.dtype == k2.dtype == v.key_dtype
        np.testing.assert_array_equal(k1, k2)
        assert x1.dtype == x2.dtype
        np.testing.assert_array_equal(x1, x2)


def _assert_routed(w):
    """Every key sits in the shard the (default) partitioner names."""
    for t, shard in enumerate(w.shards):
        keys = _host(shard.export()[0]).astype(w.key_dtype)
        assert (default_partitioner(keys, w.num_shards) == t).all()


def _add_column(v, name, width, dtype, init):
    for shard in v.shards:
        shard.add_column(name, width, dtype, init)


def _fill_column(v, name, fn):
    """Set column ``name`` of every present key to ``fn(keys)``."""
    for shard in v.shards:
        keys, rows = shard.export_rows()
        data = shard.columns[name].data
        if isinstance(data, np.ndarray):
            data[rows] = fn(keys)
        else:                                   # a CUDA shard
            from jit_kernels import cuda_table
            with shard.on():
                src = shard.to_device(fn(keys.copy_to_host()).astype(data.dtype))
                cuda_table.assign_rows(data, rows, src)


def _col_m(keys):
    k = (keys.astype(np.float64) % 1000)[:, None]
    return (k * np.array([1.0, -2.0, 0.5])).astype(np.float32)


def _make(n_keys=500, num_shards=3, key_dtype=np.int64, value_dtype=np.float32, seed=None,
          name="t", initializer=None, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    info = np.iinfo(key_dtype)
    v = ne.Variable(dim=5, key_dtype=key_dtype, value_dtype=value_dtype, num_shards=num_shards,
                    name=name, seed=seed,
                    initializer=initializer or ne.initializers.RandomNormal(0.0, 1.0))
    keys = np.unique(rng.integers(info.min, info.max, n_keys, dtype=key_dtype, endpoint=True))
    keys = np.concatenate([keys, np.array([info.min, info.max, -1, 0], key_dtype)])
    v.upsert(keys, rng.standard_normal((keys.shape[0], 5)))
    v.remove(keys[: keys.shape[0] // 5])           # free rows: rows no longer follow order
    v.find_or_insert(keys[: keys.shape[0] // 10])  # re-inserted at recycled rows
    return v, keys


def _members(path):
    with zipfile.ZipFile(path) as zf:
        return {i.filename: i for i in zf.infolist()}


def _data_offset(path, member):
    """Byte offset of the data of ``member`` (a stored .npy) in the file."""
    info = _members(path)[member]
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        nlen, xlen = np.frombuffer(f.read(4), "<u2")
        start = info.header_offset + 30 + int(nlen) + int(xlen)
        f.seek(start)
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        return f.tell()


def _rewrite_manifest(src, dst, edit):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "manifest.json":
                man = json.loads(data)
                edit(man)
                data = json.dumps(man).encode()
            zout.writestr(info.filename, data)


# ---- round trips ---------------------------------------------------------------------
@pytest.mark.parametrize("key_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("value_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_round_trip(tmp_path, key_dtype, value_dtype, num_shards):
    v, keys = _make(key_dtype=key_dtype, value_dtype=value_dtype, num_shards=num_shards, seed=1234)
    p = tmp_path / "v.nbe"
    v.save(p)
    w = ne.Variable.load(p)
    assert w.num_shards == num_shards
    _assert_same(v, w)
    _assert_routed(w)
    # the shard layout is kept shard by shard
    assert [w.size(i) for i in range(num_shards)] == [v.size(i) for i in range(num_shards)]
    # absent keys: the same initial values, and not inserted
    probe = np.concatenate([keys, np.arange(-50, 50, dtype=key_dtype)])
    a, ea = v.lookup(probe, return_exists=True)
    b, eb = w.lookup(probe, return_exists=True)
    np.testing.assert_array_equal(ea, eb)
    np.testing.assert_array_equal(a, b)
    assert w.size() == v.size()
    # the loaded table keeps working
    new = np.array([7, 8, 9], key_dtype)
    w.remove(new), v.remove(new)
    np.testing.assert_array_equal(w.find_or_insert(new), v.find_or_insert(new))
    assert w.size() == v.size()


def test_name_seed_initializer_and_default_seed(tmp_path):
    for init in [None, ne.initializers.Constant([1.0, 2.0, 3.0, 4.0, 5.0]),
                 ne.initializers.RandomUniform(-1.0, 2.0, seed=9), ne.initializers.TruncatedNormal(0.5, 0.1)]:
        v = ne.Variable(dim=5, name="named_table", initializer=init)   # seed from the name
        v.find_or_insert(np.arange(10))
        v.save(tmp_path / "v.nbe")
        w = ne.Variable.load(tmp_path / "v.nbe", num_shards=2)
        assert w.name == "named_table" and w.seed == v.seed and w.initializer == v.initializer
        probe = np.arange(-20, 20)
        np.testing.assert_array_equal(w.lookup(probe), v.lookup(probe))
    v = ne.Variable(dim=2, seed=2**64 - 1)                            # huge seed, no name
    v.save(tmp_path / "s.nbe")
    w = ne.Variable.load(str(tmp_path / "s.nbe"))
    assert w.name is None and w.seed == v.seed
    np.testing.assert_array_equal(w.lookup(np.arange(5)), v.lookup(np.arange(5)))


def test_extra_columns(tmp_path):
    v, keys = _make(num_shards=2)
    m_init = ne.initializers.RandomUniform(0.0, 1.0).params(3, 77)
    c_init = ne.initializers.Constant(0.25).params(1, 0)
    _add_column(v, "adam/m", 3, np.float32, m_init)
    _add_column(v, "score", 1, np.float64, c_init)
    _fill_column(v, "adam/m", _col_m)
    for n in [2, 1, 5]:
        v.save(tmp_path / "v.nbe")
        w = ne.Variable.load(tmp_path / "v.nbe", num_shards=n)
        _assert_same(v, w, columns=("values", "adam/m", "score"))
        for shard in w.shards:
            assert list(shard.columns) == ["values", "adam/m", "score"]
            assert shard.columns["adam/m"].data.dtype == np.float32
            assert shard.columns["score"].data.dtype == np.float64
            assert shard.columns["adam/m"].init[:4] == m_init[:4]
        # new keys get their columns' initial values, as in the saved table
        new = np.array([123456789, -987654321])
        v.find_or_insert(new), w.find_or_insert(new)
        _assert_same(v, w, columns=("values", "adam/m", "score"))
        v.remove(new)


def test_column_missing_in_one_saved_shard_gets_initial_values(tmp_path):
    v, _ = _make(num_shards=2)
    init = ne.initializers.Constant(3.0).params(2, 0)
    v.shards[1].add_column("only1", 2, np.float32, init)
    v.save(tmp_path / "v.nbe")
    w = ne.Variable.load(tmp_path / "v.nbe", num_shards=3)
    k, x = w.export("only1")
    assert k.shape[0] == v.size()
    np.testing.assert_array_equal(x, np.full((k.shape[0], 2), 3.0, np.float32))


@pytest.mark.parametrize("before,after", [(1, 4), (4, 1), (3, 2), (2, 3), (5, 5), (1, 1), (7, 16)])
def test_reshard(tmp_path, before, after):
    v, _ = _make(n_keys=2000, num_shards=before, seed=5)
    _add_column(v, "m", 3, np.float32, ne.initializers.Zeros().params(3, 0))
    _fill_column(v, "m", _col_m)
    v.save(tmp_path / "v.nbe")
    w = ne.Variable.load(tmp_path / "v.nbe", num_shards=after)
    assert w.num_shards == after
    _assert_same(v, w, columns=("values", "m"))
    _assert_routed(w)
    probe = np.arange(-100, 100)
    np.testing.assert_array_equal(w.lookup(probe), v.lookup(probe))


@pytest.mark.parametrize("before,after", [(1, 1), (3, 3), (3, 2), (1, 4)])
def test_streaming_in_small_chunks(tmp_path, monkeypatch, before, after):
    """Many chunks and bulk-insert steps per shard (chunk edges inside every target)."""
    monkeypatch.setattr(checkpoint, "CHUNK_BYTES", 100)     # 5 rows of values, 8 of m
    monkeypatch.setattr(checkpoint, "BULK_KEYS", 7)
    v, _ = _make(n_keys=400, num_shards=before, seed=5)
    _add_column(v, "m", 3, np.float32, ne.initializers.Zeros().params(3, 0))
    _fill_column(v, "m", _col_m)
    v.save(tmp_path / "v.nbe")
    w = ne.Variable.load(tmp_path / "v.nbe", num_shards=after)
    _assert_same(v, w, columns=("values", "m"))
    _assert_routed(w)


def test_custom_partitioner(tmp_path):
    def by_sign(keys, n):
        return (keys < 0).astype(np.int64) % n

    v = ne.Variable(dim=2, num_shards=2, partitioner=by_sign)
    v.upsert(np.array([-3, -2, 1, 2, 3]), np.arange(10, dtype=np.float32).reshape(5, 2))
    v.save(tmp_path / "v.nbe")
    with pytest.warns(UserWarning, match="custom partitioner"):
        w = ne.Variable.load(tmp_path / "v.nbe")
    _assert_same(v, w)
    _assert_routed(w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w2 = ne.Variable.load(tmp_path / "v.nbe", partitioner=by_sign)
    assert w2.partitioner is by_sign and sorted(w2.shards[1].export()[0].tolist()) == [-3, -2]
    _assert_same(v, w2)
    # a partitioner given at load also reroutes a default-partitioned checkpoint
    u = ne.Variable(dim=2, num_shards=2)
    u.upsert(np.array([-3, -2, 1, 2, 3]), np.ones((5, 2)))
    u.save(tmp_path / "u.nbe")
    u2 = ne.Variable.load(tmp_path / "u.nbe", partitioner=by_sign)
    assert sorted(u2.shards[1].export()[0].tolist()) == [-3, -2]
    _assert_same(u, u2)
    with pytest.raises(ValueError, match="partitioner"):
        ne.Variable.load(tmp_path / "u.nbe", partitioner=lambda k, n: np.full(k.shape, n))


@pytest.mark.parametrize("num_shards", [1, 3])
def test_empty_table(tmp_path, num_shards):
    v = ne.Variable(dim=4, num_shards=num_shards, initializer=0.5)
    _add_column(v, "m", 2, np.float32, ne.initializers.Zeros().params(2, 0))
    v.save(tmp_path / "e.nbe")
    for n in (1, 2):
        w = ne.Variable.load(tmp_path / "e.nbe", num_shards=n)
        assert w.size() == 0 and list(w.shards[0].columns) == ["values", "m"]
        assert w.export()[0].shape == (0,) and w.export()[1].shape == (0, 4)
        np.testing.assert_array_equal(w.lookup(np.array([3])), [[0.5] * 4])
    v.find_or_insert(np.array([1]))
    v.clear()                      # emptied after use
    v.save(tmp_path / "e.nbe")
    assert ne.Variable.load(tmp_path / "e.nbe").size() == 0


@pytest.mark.parametrize("key_dtype", [np.int64, np.int32])
def test_extreme_keys(tmp_path, key_dtype):
    info = np.iinfo(key_dtype)
    keys = np.array([info.min, info.max, -1, 0, info.min + 1, info.max - 1, 1], key_dtype)
    for n_save, n_load in [(1, 1), (1, 4), (4, 3)]:
        v = ne.Variable(dim=3, key_dtype=key_dtype, num_shards=n_save)
        vals = np.arange(keys.shape[0] * 3, dtype=np.float32).reshape(-1, 3)
        v.upsert(keys, vals)
        v.save(tmp_path / "x.nbe")
        w = ne.Variable.load(tmp_path / "x.nbe", num_shards=n_load)
        np.testing.assert_array_equal(w.lookup(keys), vals)
        _assert_same(v, w)
        _assert_routed(w)


@settings(max_examples=examples(20))
@given(ops=st.lists(st.tuples(st.sampled_from(["upsert", "remove"]),
                              st.lists(st.integers(I64.min, I64.max) | st.integers(-5, 5),
                                       max_size=12)), max_size=8),
       n_save=st.integers(1, 4), n_load=st.integers(1, 5))
def test_round_trip_matches_dict_oracle(tmp_path_factory, ops, n_save, n_load):
    v = ne.Variable(dim=2, num_shards=n_save, initializer=ne.initializers.RandomUniform(seed=3))
    oracle = {}
    for i, (op, ks) in enumerate(ops):
        ks = np.array(ks, np.int64)
        if op == "upsert":
            vals = (np.arange(ks.shape[0] * 2, dtype=np.float32).reshape(-1, 2) + 100 * i)
            v.upsert(ks, vals)
            oracle.update({int(k): vals[j] for j, k in enumerate(ks)})
        else:
            v.remove(ks)
            for k in ks:
                oracle.pop(int(k), None)
    p = tmp_path_factory.mktemp("h") / "v.nbe"
    v.save(p)
    w = ne.Variable.load(p, num_shards=n_load)
    keys, vals = w.export()
    assert sorted(keys.tolist()) == sorted(oracle)
    for k, row in zip(keys.tolist(), vals):
        np.testing.assert_array_equal(row, oracle[k])


def test_members_are_plain_npy(tmp_path):
    v, _ = _make(num_shards=2)
    v.save(tmp_path / "v.nbe")
    with zipfile.ZipFile(tmp_path / "v.nbe") as zf:
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
        man = json.loads(zf.read("manifest.json"))
        assert man["format"] == "numbaemb.checkpoint" and man["format_version"] == 1
        assert man["size"] == v.size() and man["variable"]["num_shards"] == 2
        keys = np.load(io.BytesIO(zf.read(man["shards"][1]["keys"]["member"])), allow_pickle=False)
        vals = np.load(io.BytesIO(zf.read(man["shards"][1]["columns"][0]["array"]["member"])))
    k, x = v.shards[1].export()
    np.testing.assert_array_equal(keys, k)
    np.testing.assert_array_equal(vals, x)


def test_save_is_consistent_under_concurrent_writes(tmp_path):
    """Each upsert batch sets every key to one value: a snapshot must never mix batches."""
    v = ne.Variable(dim=4, num_shards=3)
    keys = np.arange(20000)
    v.upsert(keys, np.zeros((keys.shape[0], 4)))
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            v.upsert(keys, np.full((keys.shape[0], 4), i, np.float32))

    t = threading.Thread(target=writer)
    t.start()
    try:
        for j in range(5):
            v.save(tmp_path / "c.nbe")
            vals = ne.Variable.load(tmp_path / "c.nbe").export()[1]
            assert (vals == vals[0, 0]).all()
    finally:
        stop.set()
        t.join()


# ---- atomic writes -----------------------------------------------------------------
def _fail_on_call(n, exc=RuntimeError("disk on fire")):
    calls = {"n": 0}

    def hook(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= n:
            raise exc
    return hook


@pytest.mark.parametrize("where", ["member1", "member3", "fsync", "replace", "interrupt"])
def test_overwrite_is_atomic(tmp_path, monkeypatch, where):
    old, _ = _make(num_shards=2, rng_seed=1)
    p = tmp_path / "v.nbe"
    old.save(p)
    before = p.read_bytes()
    new, _ = _make(num_shards=3, rng_seed=2, n_keys=3000)
    real_write = checkpoint._write_member
    if where.startswith("member"):
        hook = _fail_on_call(int(where[-1]))
        monkeypatch.setattr(checkpoint, "_write_member",
                            lambda *a, **k: (hook(), real_write(*a, **k))[1])
    elif where == "interrupt":
        hook = _fail_on_call(2, KeyboardInterrupt())
        monkeypatch.setattr(checkpoint, "_write_member",
                            lambda *a, **k: (hook(), real_write(*a, **k))[1])
    elif where == "fsync":
        monkeypatch.setattr(checkpoint.os, "fsync", _fail_on_call(1, OSError(5, "EIO")))
    else:
        monkeypatch.setattr(checkpoint.os, "replace", _fail_on_call(1, OSError(28, "ENOSPC")))
    with pytest.raises((RuntimeError, OSError, KeyboardInterrupt)):
        new.save(p)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["v.nbe"]          # no temporary file left behind
    assert p.read_bytes() == before
    _assert_same(old, ne.Variable.load(p))
    new.save(p)                                        # and a later save works
    _assert_same(new, ne.Variable.load(p))
    assert os.listdir(tmp_path) == ["v.nbe"]


def test_failed_first_save_leaves_nothing(tmp_path, monkeypatch):
    v, _ = _make()
    monkeypatch.setattr(checkpoint.os, "fsync", _fail_on_call(1, OSError(5, "EIO")))
    with pytest.raises(OSError):
        v.save(tmp_path / "v.nbe")
    assert os.listdir(tmp_path) == []


def test_save_bad_paths_and_config(tmp_path):
    v = ne.Variable(dim=2)
    with pytest.raises(IsADirectoryError):
        v.save(tmp_path)
    with pytest.raises(FileNotFoundError):
        v.save(tmp_path / "no" / "such" / "dir.nbe")

    class Custom(ne.initializers.Zeros):
        pass

    w = ne.Variable(dim=2, initializer=Custom())
    with pytest.raises(TypeError, match="initializer"):
        w.save(tmp_path / "w.nbe")
    assert os.listdir(tmp_path) == []


# ---- bad input on load -------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    v, _ = _make(n_keys=200, num_shards=2)
    _add_column(v, "m", 3, np.float32, ne.initializers.Zeros().params(3, 0))
    p = tmp_path / "good.nbe"
    v.save(p)
    return v, p


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        ne.Variable.load(tmp_path / "nope.nbe")


def test_truncated(saved, tmp_path):
    v, p = saved
    data = p.read_bytes()
    cut = tmp_path / "cut.nbe"
    offsets = sorted(set(list(range(0, len(data), max(1, len(data) // 300)))
                         + [1, 4, 30, len(data) // 2, len(data) - 22, len(data) - 1]))
    for n in offsets:
        cut.write_bytes(data[:n])
        with pytest.raises(ValueError, match="corrupt/truncated"):
            ne.Variable.load(cut)


def test_flipped_byte_in_arrays(saved, tmp_path):
    v, p = saved
    data = bytearray(p.read_bytes())
    man = json.loads(zipfile.ZipFile(p).read("manifest.json"))
    bad = tmp_path / "bad.nbe"
    for member in [man["shards"][0]["keys"]["member"],
                   man["shards"][1]["columns"][0]["array"]["member"],
                   man["shards"][1]["columns"][1]["array"]["member"]]:
        off = _data_offset(p, member)
        for delta in (0, 17):
            b = bytearray(data)
            b[off + delta] ^= 0x10
            bad.write_bytes(bytes(b))
            with pytest.raises(ValueError, match="SHA-256 mismatch"):
                ne.Variable.load(bad, num_shards=3)


def test_any_flipped_byte_raises_or_loads_the_same(tmp_path):
    """Flipping any byte gives a ValueError or the same table, never other data."""
    v, _ = _make(n_keys=6, num_shards=2)
    _add_column(v, "m", 3, np.float32, ne.initializers.Zeros().params(3, 0))
    _fill_column(v, "m", _col_m)
    p = tmp_path / "small.nbe"
    v.save(p)
    data = p.read_bytes()
    bad = tmp_path / "bad.nbe"
    for off in range(0, len(data), max(1, len(data) // 150)):
        b = bytearray(data)
        b[off] ^= 0x01
        bad.write_bytes(bytes(b))
        try:
            w = ne.Variable.load(bad)
        except ValueError:
            continue
        _assert_same(v, w, columns=("values", "m"))


def test_duplicate_keys_with_forged_checksums(saved, tmp_path):
    """A well-formed file whose keys repeat (checksums recomputed) is still refused."""
    import hashlib
    _, p = saved
    q = tmp_path / "dup.nbe"
    with zipfile.ZipFile(p) as zin:
        man = json.loads(zin.read("manifest.json"))
        entry = man["shards"][0]["keys"]
        keys = np.load(io.BytesIO(zin.read(entry["member"])))
        keys[1] = keys[0]
        buf = io.BytesIO()
        np.save(buf, keys)
        forged = buf.getvalue()
        entry.update(sha256=hashlib.sha256(forged).hexdigest(), nbytes=len(forged))
        with zipfile.ZipFile(q, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                data = zin.read(info)
                if info.filename == entry["member"]:
                    data = forged
                elif info.filename == "manifest.json":
                    data = json.dumps(man).encode()
                zout.writestr(info.filename, data)
    for n in (None, 3):
        with pytest.raises(ValueError, match="duplicate keys"):
            ne.Variable.load(q, num_shards=n)


def test_wrong_format_version(saved, tmp_path):
    _, p = saved
    for ver, msg in [(2, "newer"), (0, "format_version"), ("1", "format_version")]:
        q = tmp_path / "ver.nbe"
        _rewrite_manifest(p, q, lambda m: m.update(format_version=ver))
        with pytest.raises(ValueError, match=msg):
            ne.Variable.load(q)


@pytest.mark.parametrize("edit", [
    lambda m: m.update(format="something.else"),
    lambda m: m.pop("shards"),
    lambda m: m["variable"].update(dim=6),
    lambda m: m["variable"].update(num_shards=3),
    lambda m: m["variable"].update(key_dtype="float32"),
    lambda m: m["shards"][0].update(size=m["shards"][0]["size"] + 1),
    lambda m: m["shards"][0]["keys"].update(sha256="0" * 64),
    lambda m: m["shards"][0]["keys"].update(member="shard-00001/keys.npy"),
    lambda m: m["shards"][1]["columns"][1].update(width=4),
    lambda m: m["shards"][1]["columns"][1]["init"].update(kind=99),
    lambda m: m["shards"][1]["columns"][1]["init"].update(const=[0.0]),
    lambda m: m["shards"][1]["columns"].pop(0),
    lambda m: m.update(size=1),
])
def test_inconsistent_manifest(saved, tmp_path, edit):
    _, p = saved
    q = tmp_path / "m.nbe"
    _rewrite_manifest(p, q, edit)
    with pytest.raises(ValueError):
        ne.Variable.load(q)


def test_not_a_checkpoint(tmp_path):
    cases = {"empty": b"", "text": b"hello world\n" * 100,
             "random": np.random.default_rng(0).bytes(5000)}
    buf = io.BytesIO()
    np.save(buf, np.arange(10))
    cases["npy"] = buf.getvalue()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("hello.txt", "hi")
    cases["zip"] = buf.getvalue()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("manifest.json", "[1, 2]")
    cases["zip_list_manifest"] = buf.getvalue()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("manifest.json", "{not json")
    cases["zip_bad_json"] = buf.getvalue()
    for name, data in cases.items():
        q = tmp_path / f"{name}.nbe"
        q.write_bytes(data)
        with pytest.raises(ValueError, match="corrupt/truncated"):
            ne.Variable.load(q)


def test_compressed_member_rejected(saved, tmp_path):
    _, p = saved
    q = tmp_path / "z.nbe"
    with zipfile.ZipFile(p) as zin, zipfile.ZipFile(q, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    with pytest.raises(ValueError, match="compressed"):
        ne.Variable.load(q)


def test_load_argument_checks(saved):
    _, p = saved
    with pytest.raises(ValueError, match="num_shards"):
        ne.Variable.load(p, num_shards=0)
    with pytest.raises(TypeError, match="num_shards"):
        ne.Variable.load(p, num_shards=2.0)
    with pytest.raises(TypeError, match="partitioner"):
        ne.Variable.load(p, partitioner=3)
    with pytest.raises(ValueError, match="device"):
        ne.Variable.load(p, device="tpu")
    with pytest.raises(ValueError, match="max_hbm_bytes"):
        ne.Variable.load(p, max_hbm_bytes=0)


def test_saved_gpu_checkpoint_without_gpu(saved, tmp_path):
    """A checkpoint from a GPU loads anywhere with device='cpu'; the error says so."""
    _, p = saved
    q = tmp_path / "gpu.nbe"
    _rewrite_manifest(p, q, lambda m: m["variable"].update(device="cuda:0", max_hbm_bytes=4096))
    with zipfile.ZipFile(q) as zf:
        assert json.loads(zf.read("manifest.json"))["variable"]["device"] == "cuda:0"
    w = ne.Variable.load(q, device="cpu")
    assert w.device == "cpu" and w.max_hbm_bytes is None
    _assert_same(saved[0], w, columns=("values", "m"))
    if not CUDA_OK:
        with pytest.raises(RuntimeError, match="device='cpu'"):
            ne.Variable.load(q)


# ---- CUDA (a GPU or NUMBA_ENABLE_CUDASIM=1) ------------------------------------------
def _gpu_table(num_shards, max_hbm_bytes=None, n_keys=60):
    v = ne.Variable(dim=3, num_shards=num_shards, device="cuda", max_hbm_bytes=max_hbm_bytes,
                    initializer=ne.initializers.RandomNormal(0.0, 1.0), seed=4, name="g")
    keys = np.array([I64.min, I64.max, -1, 0] + list(range(1, n_keys)), np.int64)
    v.upsert(keys, np.arange(keys.shape[0] * 3, dtype=np.float32).reshape(-1, 3))
    v.remove(keys[4:10])
    _add_column(v, "m", 3, np.float32, ne.initializers.Constant(0.5).params(3, 0))
    _fill_column(v, "m", _col_m)
    return v, keys


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("hbm", [None, 256])
def test_cuda_round_trips(tmp_path, monkeypatch, hbm):
    monkeypatch.setattr(checkpoint, "CHUNK_BYTES", 64)       # several chunks, split rows
    v, keys = _gpu_table(2, hbm)
    v.save(tmp_path / "g.nbe")
    with zipfile.ZipFile(tmp_path / "g.nbe") as zf:
        var = json.loads(zf.read("manifest.json"))["variable"]
    assert var["device"] == "cuda:0" and var["max_hbm_bytes"] == hbm
    for kw in [dict(), dict(num_shards=3), dict(device="cpu"), dict(device="cpu", num_shards=1)]:
        w = ne.Variable.load(tmp_path / "g.nbe", **kw)
        assert w.device == kw.get("device", "cuda:0")
        assert w.max_hbm_bytes == (None if w.device == "cpu" else hbm)
        _assert_same(v, w, columns=("values", "m"))
        _assert_routed(w)
        probe = keys[:12]
        np.testing.assert_array_equal(_host(w.lookup(probe)), _host(v.lookup(probe)))
    # CPU -> GPU, resharded, into hybrid memory
    c = ne.Variable.load(tmp_path / "g.nbe", device="cpu")
    c.save(tmp_path / "c.nbe")
    g = ne.Variable.load(tmp_path / "c.nbe", device="cuda", num_shards=3, max_hbm_bytes=128)
    assert g.device == "cuda:0" and g.max_hbm_bytes == 128
    from jit_kernels.cuda_table import SplitRows
    assert all(isinstance(sh.columns["m"].data, SplitRows) for sh in g.shards)
    _assert_same(v, g, columns=("values", "m"))
    new = np.array([1000, -1000])
    np.testing.assert_array_equal(_host(g.find_or_insert(new)), _host(v.find_or_insert(new)))
    _assert_same(v, g, columns=("values", "m"))


# ---- large tables --------------------------------------------------------------------
_BIG = r"""
import os, resource, sys, time
import numpy as np, numbaemb as ne
n, dim, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
v = ne.Variable(dim=dim, num_shards=4, init_size=n)
keys = np.arange(n, dtype=np.int64) * 7919 - n
step = 1 << 20
for i in range(0, n, step):
    k = keys[i:i + step]
    v.upsert(k, np.broadcast_to((k % 1000).astype(np.float32)[:, None], (k.shape[0], dim)))
table = sum(s.nbytes() for s in v.shards)
t = time.perf_counter(); v.save(path); ts = time.perf_counter() - t
del v
t = time.perf_counter(); w = ne.Variable.load(path, num_shards=3); tl = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
probe = keys[:: max(1, n // 1000)]
assert w.size() == n
assert (w.lookup(probe) == (probe % 1000).astype(np.float32)[:, None]).all()
size = os.path.getsize(path)
print(f"table {table / 2**20:.0f} MiB peak {peak / 2**20:.0f} MiB save {size / ts / 1e6:.0f} MB/s "
      f"load {size / tl / 1e6:.0f} MB/s")
assert peak < 2.2 * table, (peak, table)
"""


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NUMBAEMB_LONG") != "1", reason="NUMBAEMB_LONG=1 only")
def test_large_table_memory(tmp_path):
    """10M keys x dim 64: save + load (resharded) within ~2x the table's memory."""
    out = subprocess.run([sys.executable, "-c", _BIG, "10000000", "64", str(tmp_path / "big.nbe")],
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr
    print(out.stdout)
