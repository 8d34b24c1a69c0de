"""Row copies with non-temporal ("streaming") stores, for outputs larger than the caches.

A lookup writes every position's row into its output: 65,536 rows of 64 float32 are
16 MB, which a later op (TensorFlow's matmul) reads after other traffic has pushed it
out of the caches.  An ordinary store first reads each output line into the cache
(to own it), so every such line crosses the memory bus twice before the consumer reads
it a third time.  A non-temporal store writes whole 64-byte lines straight to memory
without that read.  Measured on a 2-core AMD EPYC VM (`benchmarks/RESULTS_train.md`,
session 43; one process, kernels interleaved, caches evicted before each call): the
table's lookup of 65,536 ids into rows of 64 float32 took 1.57-1.71 ms streaming
against 1.84 ms with ordinary stores, and a pass reading the output afterwards was no
slower; a copy of one cached row to every place, where nothing is read from memory,
was faster with ordinary stores (0.67 against 0.75 ms).

:func:`streams` decides, per output, whether a kernel streams: the output must be
C-contiguous with rows of a multiple of 64 bytes starting at a 64-byte boundary (each
store is one whole, aligned line), and at least ``stream_min`` bytes (callers pass
:data:`STREAM_MIN`, env ``NUMBAEMB_STREAM_MIN``; a huge value turns streaming off).  A
thread that streamed ends each of its chunks of :data:`CHUNK` rows with
:func:`store_fence`, so the rows are visible to whoever reads them after the kernel
returns.  Results are the same bytes either way.

The pattern of a streaming driver (:func:`jit_kernels.cpu_table.gather_rows`); the row
copy is written out in the driver's loop, since a helper called for each row costs 10-25
ns a row (a 1M-key lookup of 64 float32 rows: 58 ms against 34 with the copy inline)::

    stream = streams(out, src, stream_min)
    for t in prange((n + CHUNK - 1) // CHUNK):
        for i in range(t * CHUNK, min(n, (t + 1) * CHUNK)):
            if stream:
                d0, s0 = i * out.strides[0], rows[i] * src.strides[0]
                for off in range(0, out.shape[1] * out.itemsize, LINE):
                    stream_line(out, d0 + off, src, s0 + off)
            else:
                ...                      # out[i, c] = src[rows[i], c]
        if stream:
            store_fence()
"""
import os

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._inner import inner

__all__ = ["STREAM_MIN", "CHUNK", "streams", "stream_line", "store_fence"]

LINE = 64


def _env_bytes(name, default):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return max(0, int(value))
    except ValueError:
        raise ValueError(f"{name} must be a non-negative int (bytes), got {value!r}") from None


# Outputs of at least this many bytes are written with streaming stores (1 MB: a gather of
# 4,096 rows of 64 float32 took the same 0.109 ms either way with warm caches, and 0.164
# against 0.212 ms streaming with evicted ones: RESULTS_train.md, session 43).
STREAM_MIN = _env_bytes("NUMBAEMB_STREAM_MIN", 1 << 20)
# Rows a streaming loop copies between fences: a kernel's copy loop runs over chunks of
# this many rows (a fence each), not over rows, so each thread fences its own stores.
CHUNK = 1024


@intrinsic
def data_address(typingctx, arr):
    """The address of ``arr``'s first element, as an int."""
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, ir.IntType(64))
    return types.int64(arr), codegen


@intrinsic
def stream_line(typingctx, dst, dst_off, src, src_off):
    """Copy the 64 bytes at byte ``src_off`` of ``src``'s data to byte ``dst_off`` of
    ``dst``'s (64-byte aligned there) with one non-temporal store."""
    sig = types.void(dst, types.intp, src, types.intp)

    def codegen(context, builder, sig, args):
        i8p = ir.IntType(8).as_pointer()
        line = ir.VectorType(ir.IntType(32), LINE // 4)
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[2])(context, builder, args[2])
        at_s = builder.gep(builder.bitcast(s.data, i8p), [args[3]])
        at_d = builder.gep(builder.bitcast(d.data, i8p), [args[1]])
        value = builder.load(builder.bitcast(at_s, line.as_pointer()), align=1)
        store = builder.store(value, builder.bitcast(at_d, line.as_pointer()), align=LINE)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx):
    """A full memory fence: orders this thread's streaming stores before what follows."""
    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@inner
def streams(out, src, stream_min):
    """Whether rows of ``src`` (2-D, ``out``'s dtype and width) may be copied into
    ``out`` (2-D) a line at a time by :func:`stream_line`: ``out`` C-contiguous, rows
    of whole 64-byte lines from a 64-byte boundary, at least ``stream_min`` bytes."""
    width = out.shape[1] * out.itemsize
    return (out.shape[0] * width >= stream_min and width % LINE == 0 and width > 0
            and out.strides[1] == out.itemsize and out.strides[0] == width
            and src.strides[1] == src.itemsize and src.itemsize == out.itemsize
            and src.shape[1] == out.shape[1] and data_address(out) % LINE == 0)
