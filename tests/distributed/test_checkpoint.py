"""Per-rank checkpoints: one directory, atomic as a whole; any world size loads it."""
import json
import os

import numpy as np
import pytest

import numbaemb as ne
from numbaemb import checkpoint, distributed_checkpoint

from .conftest import COMM, RANK, WORLD, agree, multi_rank, shared_tmpdir

pytestmark = multi_rank
ALL = np.arange(-50, 50 * WORLD)
OPT = ne.optimizers.Adagrad(0.5)


def trained(name="ck"):
    v = ne.Variable(4, comm=COMM, name=name, num_shards=2,
                    initializer=ne.initializers.RandomUniform(-1, 1, seed=3))
    keys = np.arange(-50, 50) + 37 * RANK
    ne.optimizers.apply_gradients(v, OPT, keys, np.ones((100, 4)), step=1)
    return v


def listing(d):
    return sorted(os.listdir(d))


def test_save_and_load_into_every_world_size(tmp_path_factory):
    d = shared_tmpdir(tmp_path_factory)
    v = trained()
    v.save(d)
    want = v.lookup(ALL), ne.optimizers.slot_values(v, OPT, "accumulator", ALL)
    agree(listing(d) == ["manifest.json"] + [f for f in listing(d) if f.startswith("part-")]
          and len(listing(d)) == WORLD + 1, listing(d))
    w = ne.Variable.load(d, comm=COMM)                        # same world: part r only
    agree(w.size() == v.size() and np.array_equal(w.lookup(ALL), want[0]))
    agree(np.array_equal(ne.optimizers.slot_values(w, OPT, "accumulator", ALL), want[1]))
    one = ne.Variable.load(d)                                 # one process, every key
    agree(type(one) is ne.Variable and one.size() == v.size())
    agree(np.array_equal(one.lookup(ALL), want[0]))
    sub = COMM.Split(0 if RANK < WORLD - 1 or WORLD == 2 else 1, RANK)   # another world size
    u = ne.Variable.load(d, comm=sub, num_shards=3)
    got = u.lookup(ALL)
    agree(np.array_equal(got, want[0]) and u.num_shards == 3, "load into a sub-world")


def test_single_file_checkpoint_loads_across_ranks(tmp_path_factory):
    d = shared_tmpdir(tmp_path_factory)
    path = os.path.join(d, "one.nbe")
    if RANK == 0:
        v = ne.Variable(2, name="file")
        v.upsert(np.arange(20), np.arange(40, dtype=np.float32).reshape(20, 2))
        v.save(path)
    COMM.Barrier()
    w = ne.Variable.load(path, comm=COMM)
    agree(w.size() == 20 and w.lookup(np.array([7]))[0].tolist() == [14.0, 15.0])


def test_corrupt_or_missing_part_raises_on_every_rank(tmp_path_factory):
    d = shared_tmpdir(tmp_path_factory)
    trained().save(d)
    parts = [f for f in listing(d) if f.startswith("part-")]
    if RANK == 0:
        with open(os.path.join(d, parts[-1]), "r+b") as f:
            f.seek(200)
            b = f.read(1)
            f.seek(200)
            f.write(bytes([b[0] ^ 1]))
    COMM.Barrier()
    with pytest.raises(ValueError, match="corrupt"):
        ne.Variable.load(d, comm=COMM)
    if RANK == 0:
        os.unlink(os.path.join(d, parts[-1]))
    COMM.Barrier()
    with pytest.raises(ValueError, match="missing"):
        ne.Variable.load(d, comm=COMM)
    if RANK == 0:
        os.unlink(os.path.join(d, "manifest.json"))
    COMM.Barrier()
    with pytest.raises(ValueError, match="no manifest.json"):
        ne.Variable.load(d, comm=COMM)


def test_next_save_removes_debris_and_old_parts(tmp_path_factory):
    d = shared_tmpdir(tmp_path_factory)
    v = trained()
    v.save(d)
    old = set(listing(d))
    COMM.Barrier()
    if RANK == 0:       # what an interrupted save leaves
        for junk in ("part-deadbeef0000-00000-of-00002.nbe", ".manifest.json.tmp-x",
                     ".part-abc-00001-of-00002.nbe.tmp-1-2"):
            open(os.path.join(d, junk), "w").close()
        open(os.path.join(d, "notes.txt"), "w").close()       # not ours: kept
    COMM.Barrier()
    v.save(d)
    now = set(listing(d))
    agree(len(now) == WORLD + 2 and "notes.txt" in now and not (old - {"manifest.json"}) & now,
          sorted(now))


def test_failed_save_keeps_the_previous_checkpoint(tmp_path_factory, monkeypatch):
    d = shared_tmpdir(tmp_path_factory)
    v = trained()
    v.save(d)
    before = listing(d)
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    ne.optimizers.apply_gradients(v, OPT, np.array([1]), np.ones((1, 4)), step=2)
    if RANK == WORLD - 1:
        def disk_full(*a, **k):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(checkpoint, "save", disk_full)
    with pytest.raises(OSError, match=f"rank {WORLD - 1}: OSError.*No space left"):
        v.save(d)
    monkeypatch.undo()
    agree(listing(d) == before, "files changed by a failed save")
    agree(distributed_checkpoint.read_manifest(d) == manifest)
    w = ne.Variable.load(d, comm=COMM)
    agree(w.size() == v.size())


def test_path_that_is_a_file_or_differs_between_ranks(tmp_path_factory):
    d = shared_tmpdir(tmp_path_factory)
    v = trained()
    f = os.path.join(d, "file")
    if RANK == 0:
        open(f, "w").close()
    COMM.Barrier()
    with pytest.raises(ValueError, match="is a file"):
        v.save(f)
    with pytest.raises(ValueError, match="save on table"):
        v.save(os.path.join(d, f"r{RANK}"))


def test_bad_load_arguments_on_one_rank_raise_on_every_rank(tmp_path_factory):
    d = shared_tmpdir(tmp_path_factory)
    trained("bad_args").save(d)
    with pytest.raises(ValueError, match="max_capacity must be >= 1"):
        ne.Variable.load(d, comm=COMM, max_capacity=0 if RANK == 0 else None)
    with pytest.raises(ValueError):                   # an empty path on one rank
        trained("bad_path").save("" if RANK == 0 else os.path.join(d, "other"))
    with pytest.raises(ValueError, match="no scores to choose them by"):   # too many keys
        ne.Variable.load(d, comm=COMM, max_capacity=10)
    w = ne.Variable.load(d, comm=COMM, max_capacity=500)      # they fit: bounded now
    agree(w.max_capacity == 500 and w.local.num_shards == 1
          and w.size() == trained("bad_args_again").size())
    agree(ne.Variable.load(d, comm=COMM).size() > 0)
