"""Streaming-store row copies (jit_kernels.streams) and the kernels that use them (the
lookup, the gather): the same bytes as ordinary stores, for every width, dtype,
alignment and size."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jit_kernels import cpu_table as k
from jit_kernels.initializers import NORMAL
from jit_kernels.slots import empty_slots
from jit_kernels.streams import CHUNK, streams
from numbaemb._memory import aligned_empty

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _misaligned(shape, dtype, by):
    """A C-contiguous array whose data starts ``by`` bytes past a 64-byte boundary."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = aligned_empty(n + 64, np.uint8)
    return raw[by:by + n].view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype,dim,expect", [
    (np.float32, 64, True), (np.float32, 16, True), (np.float64, 8, True),
    (np.uint16, 32, True), (np.float32, 24, False), (np.float32, 3, False),
    (np.float64, 4, False)])
def test_streams_only_whole_aligned_lines(dtype, dim, expect):
    src = np.zeros((4, dim), dtype)
    assert streams(aligned_empty((40, dim), dtype), src, 0) == expect
    assert not streams(_misaligned((40, dim), dtype, 8), src, 0)         # off a line
    assert not streams(aligned_empty((40, dim), dtype), src, 1 << 40)    # too small
    assert not streams(aligned_empty((40, 2 * dim), dtype)[:, :dim], src, 0)   # strided


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 3 * CHUNK + 5), dim=st.sampled_from([16, 24, 64, 80]),
       dtype=st.sampled_from([np.float32, np.float64, np.uint16]), by=st.sampled_from([0, 8]),
       seed=st.integers(0, 2**31))
def test_gather_matches_numpy(n, dim, dtype, by, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 60000, (97, dim)).astype(dtype)
    rows = rng.integers(0, 97, n)
    out = aligned_empty((n, dim), dtype) if by == 0 else _misaligned((n, dim), dtype, by)
    for run in (k.gather_rows.parallel, k.gather_rows.serial):
        for stream_min in (0, 1 << 60):                 # streaming wherever it may; never
            out[...] = 0
            run(src, rows, out, stream_min)
            assert np.array_equal(out.view(np.uint8), src[rows].view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint16])
@pytest.mark.parametrize("n", [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 7])
def test_streaming_lookup_equals_the_plain_one(dtype, n):
    rng = np.random.default_rng(n)
    dim = 64 // np.dtype(dtype).itemsize * 2             # two lines a row
    present = np.array([INT64_MIN, INT64_MAX, -1, 0] + list(range(1, 300)), np.int64)
    slots = empty_slots(1024)
    rows, inserted = np.empty(present.size, np.int64), np.empty(present.size, np.bool_)
    k.find_or_insert_rows(slots, 1023, present, rows, inserted, np.zeros(1, np.int64),
                          np.empty(0, np.int64), 0, 0)
    values = rng.integers(0, 60000, (present.size, dim)).astype(dtype)
    keys = rng.choice(np.concatenate([present, [5000, -5000, 7]]), n).astype(np.int64)
    init = (NORMAL, 0.0, 1.0, 3, np.zeros(1))
    outs = []
    for stream_min in (0, 1 << 60):                     # streaming, then plain stores
        out, exists = aligned_empty((n, dim), dtype), np.empty(n, np.bool_)
        out[...] = 7
        for run in (k.lookup_rows.parallel, k.lookup_rows.serial):
            run(slots, 1023, keys, values, out, exists, *init, np.empty(n, np.int64),
                stream_min)
            outs.append((out.copy(), exists.copy()))
    for out, exists in outs[1:]:
        assert np.array_equal(out.view(np.uint8), outs[0][0].view(np.uint8))
        assert np.array_equal(exists, outs[0][1])
    row_of = dict(zip(present.tolist(), rows.tolist()))           # the oracle
    want_hit = np.array([key in row_of for key in keys.tolist()], np.bool_)
    assert np.array_equal(outs[0][1], want_hit)
    want = values[[row_of[key] for key in keys[want_hit].tolist()]]
    assert np.array_equal(outs[0][0][want_hit].view(np.uint8), want.view(np.uint8))
