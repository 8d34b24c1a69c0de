"""CUDA drivers (``jit_kernels.cuda_table``) against the CPU drivers on the same inputs.

Runs on a GPU or under the simulator (``NUMBA_ENABLE_CUDASIM=1``), where every
CUDA thread is a Python thread: batches stay at a few hundred keys.  Read-only
drivers get a copy of the very index the CPU driver reads, so their results
must match exactly; inserting drivers are checked through the key -> row map
they leave, since concurrent inserts may place keys in other slots.
"""
import numpy as np
import pytest

from jit_kernels import cpu_table as cpu
from jit_kernels import cuda_table as ct
from jit_kernels.initializers import CONSTANT, NORMAL, TRUNCATED_NORMAL, UNIFORM, ZEROS
from jit_kernels.slots import empty_slots
from tests.cuda_support import needs_cuda, needs_real_gpu
from tests.jit_kernels.test_cpu_table import insert as cpu_insert

pytestmark = [pytest.mark.cuda, needs_cuda]

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
EXTREMES = [INT64_MIN, INT64_MAX, -1, 0]
DIM = 5


@pytest.fixture(scope="module")
def cuda():
    return ct.cuda_api()


def keys_with_extremes(rng, n, span=1 << 62):
    keys = rng.integers(-span, span, n, dtype=np.int64)
    keys[:4] = EXTREMES
    keys[4:8] = EXTREMES            # and again: duplicates within the batch
    return keys


def gpu_insert(cuda, slots, keys, free=None, fresh=0):
    n = keys.shape[0]
    n_free = 0 if free is None else free.shape[0]
    free = np.zeros(1, np.int64) if free is None else free
    d_keys = cuda.to_device(keys)
    rows = cuda.device_array(n, np.int64)
    inserted = cuda.device_array(n, np.bool_)
    alloc = cuda.to_device(np.zeros(1, np.int64))
    ct.find_or_insert_rows(slots, slots.shape[0] // 2 - 1, d_keys, rows, inserted, alloc,
                           cuda.to_device(free), n_free, fresh)
    return rows.copy_to_host(), inserted.copy_to_host(), int(alloc.copy_to_host()[0])


def index_map(slots):
    words = slots[1::2]
    keys = slots[0::2][words >= 0]
    assert len(set(keys.tolist())) == keys.shape[0], "a key occupies two slots"
    return dict(zip(keys.tolist(), words[words >= 0].tolist()))


def built_index(keys, capacity=512):
    """A CPU index holding ``keys`` (rows 0..n-1 in no particular order)."""
    slots = empty_slots(capacity)
    cpu_insert(slots, keys)
    return slots


# ---- launch configuration -------------------------------------------------------------

def test_launch_config_and_tile_width():
    blocks, threads = ct.launch_config(1000, width=4)
    assert blocks >= 1 and threads >= 1
    for dim in (1, 2, 3, 4, 8, 64, 100, 1000):
        t = ct.tile_width(dim)
        assert t & (t - 1) == 0 and 1 <= t <= 32
        assert t == 32 or t * ct.COLS_PER_LANE >= dim
        assert t == 1 or (t // 2) * ct.COLS_PER_LANE < dim


# ---- inserts ------------------------------------------------------------------------------

def test_concurrent_inserts_of_one_key_have_one_inserter(cuda):
    slots = ct.device_empty_slots(64)
    keys = np.array([INT64_MIN] * 40 + [7] * 40 + [-1] * 30, np.int64)
    rows, inserted, handed = gpu_insert(cuda, slots, keys)
    for key in (INT64_MIN, 7, -1):
        sel = keys == key
        assert inserted[sel].sum() == 1
        assert len(set(rows[sel].tolist())) == 1
    assert handed == 3 and sorted(set(rows.tolist())) == [0, 1, 2]
    assert index_map(slots.copy_to_host()) == {int(k): int(r) for k, r in zip(keys, rows)}


def test_find_or_insert_matches_cpu(cuda):
    rng = np.random.default_rng(1)
    keys = keys_with_extremes(rng, 300, span=200)       # many duplicates and collisions
    c_slots = empty_slots(512)
    c_rows, c_ins, c_handed = cpu_insert(c_slots, keys)
    g_slots = ct.device_empty_slots(512)
    g_rows, g_ins, g_handed = gpu_insert(cuda, g_slots, keys)
    assert g_handed == c_handed
    assert g_ins.sum() == c_ins.sum() == len(set(keys.tolist()))
    # same partition of positions into keys, one row per key, rows 0..n-1
    g_map = index_map(g_slots.copy_to_host())
    assert set(g_map) == set(index_map(c_slots))
    assert sorted(g_map.values()) == list(range(c_handed))
    assert all(g_map[int(k)] == r for k, r in zip(keys, g_rows))
    # a second batch finds them all and inserts nothing
    rows2, ins2, handed2 = gpu_insert(cuda, g_slots, keys[::-1].copy())
    assert handed2 == 0 and not ins2.any() and (rows2 == g_rows[::-1]).all()


def test_inserts_take_free_rows_first(cuda):
    free = np.array([9, 4, 6], np.int64)
    slots = ct.device_empty_slots(64)
    rows, inserted, handed = gpu_insert(cuda, slots, np.arange(5, dtype=np.int64), free, 20)
    assert handed == 5 and inserted.all()
    assert sorted(rows.tolist()) == [4, 6, 9, 20, 21]


def test_insert_rows_counter_is_never_reset(cuda):
    """insert_rows shares one growing counter across calls (no reset launches)."""
    scratch = ct.Scratch()
    slots = ct.device_empty_slots(64)

    def run(keys, free, fresh):
        n = len(keys)
        rows, ins = cuda.device_array(n, np.int64), cuda.device_array(n, np.bool_)
        handed = ct.insert_rows(slots, 63, cuda.to_device(np.array(keys, np.int64)), rows, ins,
                                cuda.to_device(np.array(free or [0], np.int64)), len(free),
                                fresh, scratch)
        return handed, rows.copy_to_host()

    handed, rows = run([1, 2, 3, 1], [], 0)
    assert handed == 3 and sorted(set(rows.tolist())) == [0, 1, 2] and rows[0] == rows[3]
    handed, rows = run([4, 5, 2, 6], [7, 8], 3)
    assert handed == 3 and sorted(rows[[0, 1, 3]].tolist()) == [3, 7, 8] and rows[2] >= 0


def test_find_rows_matches_cpu(cuda):
    rng = np.random.default_rng(2)
    present = keys_with_extremes(rng, 150)
    slots = built_index(present)
    probe = np.concatenate([present[::3], rng.integers(-99, 99, 60)])
    c_rows = np.empty(probe.shape[0], np.int64)
    c_missing = cpu.find_rows(slots, 511, probe, c_rows)
    g_rows = cuda.device_array(probe.shape[0], np.int64)
    g_missing = ct.find_rows(cuda.to_device(slots), 511, cuda.to_device(probe), g_rows)
    assert g_missing == c_missing
    assert (g_rows.copy_to_host() == c_rows).all()


# ---- row kernels ------------------------------------------------------------------------

@pytest.mark.parametrize("init", [
    (ZEROS, 0.0, 0.0, 0, np.zeros(DIM)),
    (CONSTANT, 0.0, 0.0, 0, np.arange(DIM, dtype=np.float64)),
    (UNIFORM, -1.0, 3.0, 77, np.zeros(DIM)),
    (NORMAL, 0.5, 2.0, 1234, np.zeros(DIM)),
    (TRUNCATED_NORMAL, 0.0, 1.0, -5, np.zeros(DIM)),
])
def test_lookup_matches_cpu(cuda, init):
    rng = np.random.default_rng(3)
    present = keys_with_extremes(rng, 100)
    slots = built_index(present)
    values = rng.standard_normal((128, DIM)).astype(np.float32)
    probe = np.concatenate([present[::2], rng.integers(INT64_MIN, INT64_MAX, 50, dtype=np.int64)])
    n = probe.shape[0]
    c_out, c_ex = np.empty((n, DIM), np.float32), np.empty(n, np.bool_)
    cpu.lookup(slots, 511, probe, values, c_out, c_ex, *init)
    g_out, g_ex = cuda.device_array((n, DIM), np.float32), cuda.device_array(n, np.bool_)
    kind, a, b, seed, const = init
    ct.lookup(cuda.to_device(slots), 511, cuda.to_device(probe), cuda.to_device(values),
              g_out, g_ex, kind, a, b, seed, cuda.to_device(const))
    assert (g_ex.copy_to_host() == c_ex).all()
    # initial values are float32 arithmetic with no FMA on either side: the same bits
    np.testing.assert_array_equal(g_out.copy_to_host(), c_out)


@pytest.mark.parametrize("step", [1, 4])
def test_lookup_probe_steps_match_cpu_at_high_load_with_tombstones(cuda, step):
    """lookup reading one or four slots a probe step gives the CPU lookup's rows and
    initial values on an index at load 0.9 whose chains hold tombstones and wrap
    around the end of the index."""
    rng = np.random.default_rng(4)
    present = np.unique(keys_with_extremes(rng, 240))[:230]
    slots = built_index(present, capacity=256)              # load 0.9: long chains
    erased = present[::7]
    cpu.erase_keys(slots, 255, erased, np.empty(erased.shape[0], np.int64))
    assert (slots[1::2] == -1).sum() == 256 - 230          # tombstones, no new EMPTY slots
    values = rng.standard_normal((256, DIM)).astype(np.float32)
    probe = np.concatenate([present, rng.integers(INT64_MIN, INT64_MAX, 40, dtype=np.int64)])
    n = probe.shape[0]
    init = (NORMAL, 0.5, 2.0, 9, np.zeros(DIM))
    c_out, c_ex = np.empty((n, DIM), np.float32), np.empty(n, np.bool_)
    cpu.lookup(slots, 255, probe, values, c_out, c_ex, *init)
    g_out, g_ex = cuda.device_array((n, DIM), np.float32), cuda.device_array(n, np.bool_)
    ct.lookup(cuda.to_device(slots), 255, cuda.to_device(probe), cuda.to_device(values),
              g_out, g_ex, *init[:4], cuda.to_device(init[4]), step=step)
    assert c_ex.sum() == 230 - erased.shape[0]
    assert (g_ex.copy_to_host() == c_ex).all()
    np.testing.assert_array_equal(g_out.copy_to_host(), c_out)


@pytest.mark.parametrize("dim", [1, 3, 64])
def test_init_rows_and_gather_match_cpu(cuda, dim):
    rng = np.random.default_rng(4)
    n = 70
    keys = keys_with_extremes(rng, n)
    rows = rng.permutation(100)[:n].astype(np.int64)
    inserted = rng.random(n) < 0.6
    init = (NORMAL, 0.0, 1.0, 99, np.zeros(dim))
    c_vals = np.zeros((100, dim), np.float64)
    cpu.init_rows(c_vals, rows, keys, inserted, *init)
    g_vals = cuda.to_device(np.zeros((100, dim), np.float64))
    ct.init_rows(g_vals, cuda.to_device(rows), cuda.to_device(keys), cuda.to_device(inserted),
                 NORMAL, 0.0, 1.0, 99, cuda.to_device(init[4]))
    # the same bits: every product of the generator is mul.rn on the GPU (never an FMA)
    np.testing.assert_array_equal(g_vals.copy_to_host(), c_vals)

    pick = rng.integers(0, 100, 90)
    c_out = np.empty((90, dim), np.float64)
    cpu.gather(c_vals, pick, c_out)
    g_out = cuda.device_array((90, dim), np.float64)
    ct.gather(cuda.to_device(c_vals), cuda.to_device(pick), g_out)
    assert (g_out.copy_to_host() == c_out).all()


@pytest.mark.parametrize("dim", [1, 3, 64])
def test_init_gather_matches_cpu(cuda, dim):
    """Fused init + gather: inserters write their row, repeats of a key inserted in
    this batch (rows >= fresh_start) draw the value themselves, the rest copy."""
    rng = np.random.default_rng(5)
    n, fresh_start = 80, 30
    row_keys = keys_with_extremes(rng, 68)[8:]           # one key per row
    rows = rng.integers(0, 60, n).astype(np.int64)
    keys = row_keys[rows]
    inserted = np.zeros(n, np.bool_)                      # one inserter per new row, anywhere
    for r in np.unique(rows[rows >= fresh_start]):
        inserted[rng.choice(np.flatnonzero(rows == r))] = True
    init = (NORMAL, 0.0, 1.0, 11, np.zeros(dim))
    values = rng.standard_normal((60, dim)).astype(np.float32)
    c_vals, c_out = values.copy(), np.empty((n, dim), np.float32)
    cpu.init_gather(c_vals, rows, keys, inserted, fresh_start, c_out, *init)
    g_vals, g_out = cuda.to_device(values), cuda.device_array((n, dim), np.float32)
    ct.init_gather(g_vals, cuda.to_device(rows), cuda.to_device(keys), cuda.to_device(inserted),
                   fresh_start, g_out, NORMAL, 0.0, 1.0, 11, cuda.to_device(init[4]))
    assert (g_out.copy_to_host() == c_out).all()
    assert (g_vals.copy_to_host() == c_vals).all()


@needs_real_gpu
def test_large_batch_inserts_and_fused_init_gather(cuda):
    """2^20 keys, half of them repeats, on a real GPU: one inserter and one row per
    key, rows 0..n_distinct-1 (warp-shared row counter), and every position of
    the fused pass gets the key's initial value, repeats included."""
    rng = np.random.default_rng(6)
    distinct = keys_with_extremes(rng, 1 << 19)[8:]
    distinct = np.unique(np.concatenate([distinct, EXTREMES]))
    keys = rng.permutation(np.concatenate([distinct, rng.choice(distinct, 1 << 19)]))
    slots = ct.device_empty_slots(1 << 21)
    rows, inserted, handed = gpu_insert(cuda, slots, keys)
    assert handed == distinct.shape[0] == inserted.sum()
    assert sorted(rows[inserted].tolist()) == list(range(handed))
    mapping = index_map(slots.copy_to_host())
    assert len(mapping) == handed
    assert (np.array([mapping[int(k)] for k in keys]) == rows).all()
    dim = 16
    init = (NORMAL, 0.0, 1.0, 3, np.zeros(dim))
    values = cuda.to_device(np.full((handed, dim), np.nan, np.float32))
    out = cuda.device_array((keys.shape[0], dim), np.float32)
    ct.init_gather(values, cuda.to_device(rows), cuda.to_device(keys), cuda.to_device(inserted),
                   0, out, NORMAL, 0.0, 1.0, 3, cuda.to_device(init[4]))
    want = np.empty((keys.shape[0], dim), np.float32)
    cpu.lookup(empty_slots(16), 15, keys, np.empty((0, dim), np.float32), want,
               np.empty(keys.shape[0], np.bool_), *init)
    assert (out.copy_to_host() == want).all()
    assert (values.copy_to_host()[rows] == want).all()


@pytest.mark.parametrize("dim", [2, 40])
def test_assign_rows_last_wins(cuda, dim):
    rng = np.random.default_rng(5)
    n = 200
    rows = rng.integers(0, 30, n).astype(np.int64)     # heavy repetition
    src = rng.standard_normal((n, dim)).astype(np.float32)
    c_vals = np.zeros((32, dim), np.float32)
    cpu.assign_rows(c_vals, rows, src, 4)
    g_vals = cuda.to_device(np.zeros((32, dim), np.float32))
    ct.assign_rows(g_vals, cuda.to_device(rows), cuda.to_device(src))
    assert (g_vals.copy_to_host() == c_vals).all()


# ---- accum ------------------------------------------------------------------------------

@pytest.mark.parametrize("n, n_groups", [(0, 4), (255, 7), (256, 1), (600, 300), (1000, 3),
                                         (300, 1025)])
def test_group_positions_is_a_stable_counting_sort(cuda, n, n_groups):
    """Few groups (chunks counted and placed a thread each) and many (atomic placement,
    then sorted): numpy's stable argsort and the groups' bounds; empty groups too."""
    rng = np.random.default_rng(n + n_groups)
    inverse = rng.integers(0, max(1, min(n_groups, 40 if n_groups > 1024 else n_groups)), n)
    if n_groups > 2:
        inverse[inverse == 1] = n_groups - 1           # group 1 empty, the last one used
    order, starts = ct.group_positions(cuda.to_device(inverse.astype(np.int64)), n_groups)
    want = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=n_groups))])
    np.testing.assert_array_equal(starts.copy_to_host(), want)
    np.testing.assert_array_equal(order.copy_to_host(), np.argsort(inverse, kind="stable"))


def test_group_keys_groups_in_batch_order(cuda):
    rng = np.random.default_rng(6)
    keys = rng.choice(np.array(EXTREMES + [5, 6, 7], np.int64), 150)
    order, starts = ct.group_keys(cuda.to_device(keys))
    order, starts = order.copy_to_host(), starts.copy_to_host()
    assert sorted(order.tolist()) == list(range(150)) and starts[-1] == 150
    seen = set()
    for g in range(starts.shape[0] - 1):
        pos = order[starts[g]:starts[g + 1]]
        assert (np.diff(pos) > 0).all()                     # batch order inside a group
        assert len(set(keys[pos].tolist())) == 1
        seen.add(int(keys[pos[0]]))
    assert seen == set(keys.tolist())


@pytest.mark.parametrize("bits", [10, 3])
@pytest.mark.parametrize("radix", [None, True, False])
@pytest.mark.parametrize("n, g, hot", [(1, 1, 0), (300, 1, 0), (257, 40, 0), (520, 300, 90)])
def test_group_sorts_positions_stably_by_radix_or_heapsort(cuda, monkeypatch, bits, radix,
                                                           n, g, hot):
    """``_group`` (group_keys' and many-group group_positions' back end): positions by
    group id, batch order within a group, whether placed by atomics and heapsorted or by
    LSD radix passes (``RADIX_BITS`` small: several passes, digits of every width); the
    automatic choice takes the radix passes for a group over ``RADIX_ABOVE``."""
    monkeypatch.setattr(ct, "RADIX_BITS", bits)
    rng = np.random.default_rng(n * 7 + g)
    ids = rng.integers(0, g, n)
    ids[rng.permutation(n)[:hot]] = g - 1                   # a hot group
    ids[:g] = rng.permutation(g)                            # every group used
    counts = np.zeros(n + 1, np.int64)
    counts[:g] = np.bincount(ids, minlength=g)
    launched = []
    real = ct._radix_pass
    monkeypatch.setattr(ct, "_radix_pass", lambda *a: launched.append(a[2]) or real(*a))  # shifts
    order, starts = ct._group(cuda.to_device(ids), cuda.to_device(counts), g, ct.Scratch(),
                              radix)
    np.testing.assert_array_equal(order.copy_to_host(), np.argsort(ids, kind="stable"))
    np.testing.assert_array_equal(starts.copy_to_host(),
                                  np.concatenate([[0], np.cumsum(counts[:g])]))
    by_radix = radix if radix is not None else counts.max() > ct.RADIX_ABOVE
    width = int(g - 1).bit_length()
    passes = max(1, -(-width // bits))
    width = max(1, -(-width // passes))                     # even digits
    assert launched == ([width * p for p in range(passes)] if by_radix else [])


def test_accum_groups_matches_cpu(cuda):
    rng = np.random.default_rng(7)
    present = np.array(EXTREMES + list(range(1, 20)), np.int64)
    n = 160
    keys = rng.choice(np.concatenate([present, np.arange(100, 110)]), n)
    exists = rng.random(n) < 0.5
    old = rng.standard_normal((n, DIM))
    new = rng.standard_normal((n, DIM))
    base = rng.standard_normal((64, DIM))

    c_slots = built_index(present, 256)
    g_slots = cuda.to_device(c_slots)       # the same index (CPU inserts run in parallel)
    c_vals = base.copy()
    order = np.argsort(keys, kind="stable")
    starts = cpu.group_starts(keys[order])
    c_rows, c_ins, c_alloc = np.empty(n, np.int64), np.empty(n, np.bool_), np.zeros(1, np.int64)
    cpu.accum_groups(c_slots, 255, keys, order, starts, c_vals, old, new, exists,
                     c_rows, c_ins, c_alloc, np.zeros(0, np.int64), 0, present.shape[0])

    g_vals = cuda.to_device(base)
    d_keys = cuda.to_device(keys)
    g_order, g_starts = ct.group_keys(d_keys)
    g_rows, g_ins = cuda.device_array(n, np.int64), cuda.device_array(n, np.bool_)
    g_alloc = cuda.to_device(np.zeros(1, np.int64))
    ct.accum_groups(g_slots, 255, d_keys, g_order, g_starts, g_vals, cuda.to_device(old),
                    cuda.to_device(new), cuda.to_device(exists), g_rows, g_ins, g_alloc,
                    cuda.to_device(np.zeros(1, np.int64)), 0, present.shape[0])

    assert int(g_alloc.copy_to_host()[0]) == int(c_alloc[0])
    g_ins = g_ins.copy_to_host()
    assert (g_ins.nonzero()[0].tolist() == c_ins.nonzero()[0].tolist())
    assert ((g_rows.copy_to_host() >= 0) == (c_rows >= 0)).all()
    c_map, g_map = index_map(c_slots), index_map(g_slots.copy_to_host())
    assert set(c_map) == set(g_map)
    gv = g_vals.copy_to_host()
    for key in c_map:
        np.testing.assert_allclose(gv[g_map[key]], c_vals[c_map[key]], rtol=1e-12, atol=1e-12)


# ---- erase, rehash, export ------------------------------------------------------------------

def test_erase_keys_matches_cpu(cuda):
    rng = np.random.default_rng(8)
    present = keys_with_extremes(rng, 120)
    gone = np.concatenate([present[::2], present[::4], [12345]])   # repeats and an absent key
    c_slots = built_index(present)
    g_slots = cuda.to_device(c_slots)
    c_freed = np.empty(gone.shape[0], np.int64)
    cpu.erase_keys(c_slots, 511, gone, c_freed)
    g_freed = cuda.device_array(gone.shape[0], np.int64)
    ct.erase_keys(g_slots, 511, cuda.to_device(gone), g_freed)
    g = g_freed.copy_to_host()
    assert sorted(g[g >= 0].tolist()) == sorted(c_freed[c_freed >= 0].tolist())
    assert index_map(g_slots.copy_to_host()) == index_map(c_slots)

    out = cuda.to_device(np.full(200, -7, np.int64))
    m = ct.compact_nonneg(g_freed, out, 10)
    o = out.copy_to_host()
    assert m == (g >= 0).sum()
    assert o[10:10 + m].tolist() == g[g >= 0].tolist() and (o[:10] == -7).all()


def test_rehash_and_export_match_cpu(cuda):
    rng = np.random.default_rng(9)
    present = keys_with_extremes(rng, 150)
    c_slots = built_index(present)
    gone = present[::5]
    cpu.erase_keys(c_slots, 511, gone, np.empty(gone.shape[0], np.int64))

    g_keys, g_rows = ct.export_slots(cuda.to_device(c_slots))
    c_keys, c_rows = cpu.export_slots(c_slots, 8)
    assert (g_keys.copy_to_host() == c_keys).all() and (g_rows.copy_to_host() == c_rows).all()

    g_new = ct.device_empty_slots(1024)
    ct.rehash(cuda.to_device(c_slots), g_new, 1023)
    assert index_map(g_new.copy_to_host()) == index_map(c_slots)

    e_keys, e_rows = ct.export_slots(ct.device_empty_slots(16))
    assert e_keys.shape == (0,) and e_rows.shape == (0,)


def test_exclusive_scan(cuda):
    a = np.random.default_rng(10).integers(0, 5, 300).astype(np.int64)
    d = cuda.to_device(a)
    total = ct.exclusive_scan(d)
    assert total == a.sum()
    assert (d.copy_to_host() == np.concatenate([[0], np.cumsum(a)[:-1]])).all()


def test_split_rows_are_read_and_written_by_the_same_kernels(cuda):
    """A column split between two arrays (hybrid mode) behaves like one array."""
    rng = np.random.default_rng(11)
    whole = rng.standard_normal((40, DIM)).astype(np.float32)
    split = ct.SplitRows(cuda.to_device(whole[:25]), cuda.to_device(whole[25:]))
    rows = rng.integers(0, 40, 60).astype(np.int64)
    out = cuda.device_array((60, DIM), np.float32)
    ct.gather(split, cuda.to_device(rows), out)
    assert (out.copy_to_host() == whole[rows]).all()
    src = rng.standard_normal((60, DIM)).astype(np.float32)
    ct.assign_rows(split, cuda.to_device(rows), cuda.to_device(src))
    expect = whole.copy()
    cpu.assign_rows(expect, rows, src, 3)
    got = np.concatenate([split.head.copy_to_host(), split.tail.copy_to_host()])
    assert (got == expect).all()
