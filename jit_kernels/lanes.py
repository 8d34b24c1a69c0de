"""Vector instructions for the CPU kernels, as Numba intrinsics (LLVM vector IR).

:func:`low32` finds the lowest of 32 int64 values and where it first occurs with a
few vector minima and compares and no branch (the bounded table's victim search
reads 32 scores a new key).  :func:`eq32` compares 32 bytes with one byte in one
vector compare (a bucket's digests against a key's: ``benchmarks/study_buckets.py``);
:func:`even_eq32` does the same for the digests of :mod:`jit_kernels.buckets`, which
sit in every other int64 word of a line.
They are for the CPU: a body shared with CUDA takes them only where :func:`vectors`
(a constant, False on a GPU) says so, and keeps its scalar code for the GPU.  Both
read 32 consecutive items of a C-contiguous 1-D array and refuse any other.

>>> import numpy as np
>>> from numba import njit
>>> a = np.array([9, 7, 8, 7] * 9, np.int64)
>>> njit(lambda a, o: low32(a, o))(a, 2)        # lowest of a[2:34]: 7, first at a[3]
(7, 1)
>>> d = np.array([0, 5, 5, 1] * 9, np.uint8)
>>> m = njit(lambda d, o, x: eq32(d, o, x))(d, 1, np.uint8(5))   # where d[1:33] == 5
>>> [t for t in range(32) if m >> t & 1][:6]
[0, 1, 4, 5, 8, 9]
"""
import os

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 4          # int64 lanes a vector (AVX2's 256 bits; wider ones split in LLVM)
# NUMBAEMB_SCALAR_LANES=1: vectors() is False on the CPU too, which then runs the scalar
# code a GPU runs (tests/jit_kernels/test_scalar_lanes.py: that code checked without a
# GPU); it is part of the on-disk cache's stamp (jit_kernels._cache)
SCALAR = os.environ.get("NUMBAEMB_SCALAR_LANES") == "1"
WIDTH = 32         # values low32 and eq32 read

_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _flat(arr, dtype):
    """``arr`` is a 1-D C-contiguous array of ``dtype`` (the vectors read its items
    side by side from its data pointer)."""
    return (isinstance(arr, types.Array) and arr.dtype == dtype and arr.ndim == 1
            and arr.layout == "C")


def _fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _vector_low(builder, base):
    """(lowest, first index) of the WIDTH int64 at ``base`` (a pointer), in vectors."""
    vt = ir.VectorType(_I64, LANES)
    vs = [builder.load(builder.bitcast(builder.gep(base, [_I64(LANES * j)]), vt.as_pointer()),
                       align=8) for j in range(WIDTH // LANES)]
    smin = _fn(builder, "llvm.smin.v%di64" % LANES, vt, [vt, vt])
    level = vs
    while len(level) > 1:           # a tree of minima, lane by lane
        level = [builder.call(smin, level[i:i + 2]) for i in range(0, len(level), 2)]
    low = builder.call(_fn(builder, "llvm.vector.reduce.smin.v%di64" % LANES, _I64, [vt]),
                       [level[0]])
    wide = builder.insert_element(ir.Constant(vt, ir.Undefined), low, _I32(0))
    wide = builder.shuffle_vector(wide, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))
    bits = _I64(0)                  # bit t: value t is the lowest
    for j, v in enumerate(vs):
        eq = builder.zext(builder.bitcast(builder.icmp_signed("==", v, wide),
                                          ir.IntType(LANES)), _I64)
        bits = builder.or_(bits, builder.shl(eq, _I64(LANES * j)))
    first = builder.call(_fn(builder, "llvm.cttz.i64", _I64, [_I64, ir.IntType(1)]),
                         [bits, ir.IntType(1)(1)])
    return low, first


@intrinsic
def low32(typingctx, arr, o):
    """``(lowest, t)``: the lowest of the int64 ``arr[o:o + 32]`` and the first t with
    ``arr[o + t]`` equal to it.  No bounds check: the caller keeps ``o + 32`` within
    ``arr``.  CPU only: a body shared with CUDA asks :func:`vectors` first."""
    if not (_flat(arr, types.int64) and isinstance(o, types.Integer)):
        return None
    sig = types.UniTuple(types.int64, 2)(arr, o)

    def codegen(context, builder, sig, args):
        if builder.module.triple.startswith("nvptx"):   # (not reached: the callers ask
            low, first = _I64(0), _I64(0)              # vectors(); a GPU's compiler is
        else:                                          # spared the vector intrinsics)
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            at = context.cast(builder, args[1], sig.args[1], types.int64)
            low, first = _vector_low(builder, builder.gep(data, [at]))
        return context.make_tuple(builder, sig.return_type, [low, first])

    return sig, codegen


def _byte_args(arr, o, d, dtype):
    """The types a byte compare takes: a flat ``dtype`` array, an integer offset and an
    integer byte."""
    return _flat(arr, dtype) and isinstance(o, types.Integer) and isinstance(d, types.Integer)


def _bytes_equal(context, builder, sig, args, n, align):
    """An ``n``-bit integer whose bit t is set where byte t from item ``args[1]`` of the
    array ``args[0]`` on equals the byte ``args[2]``: one load, one vector compare."""
    vt = ir.VectorType(ir.IntType(8), n)
    data = context.make_array(sig.args[0])(context, builder, args[0]).data
    at = context.cast(builder, args[1], sig.args[1], types.int64)
    byte = context.cast(builder, args[2], sig.args[2], types.uint8)
    v = builder.load(builder.bitcast(builder.gep(data, [at]), vt.as_pointer()), align=align)
    splat = builder.insert_element(ir.Constant(vt, ir.Undefined), byte, _I32(0))
    splat = builder.shuffle_vector(splat, ir.Constant(vt, ir.Undefined),
                                   ir.Constant(ir.VectorType(_I32, n), [0] * n))
    return builder.bitcast(builder.icmp_unsigned("==", v, splat), ir.IntType(n))


@intrinsic
def eq32(typingctx, arr, o, d):
    """A uint32 whose bit t is set where ``arr[o + t] == d`` (t < 32), for a uint8
    ``arr``: one vector compare and no loop.  No bounds check: the caller keeps
    ``o + 32`` within ``arr``.  CPU only, as :func:`low32`."""
    if not _byte_args(arr, o, d, types.uint8):
        return None
    sig = types.uint32(arr, o, d)

    def codegen(context, builder, sig, args):
        if builder.module.triple.startswith("nvptx"):   # (not reached: see low32)
            return _I32(0)
        return _bytes_equal(context, builder, sig, args, WIDTH, 1)

    return sig, codegen


@intrinsic
def even_eq32(typingctx, arr, o, d):
    """A uint32 whose bit ``8 * g + b`` is set where byte b of the int64 word
    ``arr[o + 2 * g]`` equals ``d`` (g < 4, b < 8: little-endian bytes), for an int64
    ``arr``: the 32 digests of a bucket of :mod:`jit_kernels.buckets`, which sit in the
    even words of one 64-byte line (the odd ones are free slots), in one vector compare
    and a few shifts.  No bounds check: the caller keeps ``o + 8`` within ``arr``.  CPU
    only, as :func:`low32`."""
    if not _byte_args(arr, o, d, types.int64):
        return None
    sig = types.uint32(arr, o, d)

    def codegen(context, builder, sig, args):
        if builder.module.triple.startswith("nvptx"):   # (not reached: see low32)
            return _I32(0)
        bits = _bytes_equal(context, builder, sig, args, 2 * WIDTH, 8)
        # keep the even words' bytes (bits 0-7, 16-23, 32-39, 48-55) and close the gaps
        bits = builder.and_(bits, _I64(0x00FF00FF00FF00FF))
        bits = builder.and_(builder.or_(bits, builder.lshr(bits, _I64(8))),
                            _I64(0x0000FFFF0000FFFF))
        bits = builder.or_(bits, builder.lshr(bits, _I64(16)))
        return builder.trunc(bits, _I32)

    return sig, codegen


@intrinsic
def ctz(typingctx, m):
    """The number of trailing zero bits of the non-zero integer ``m`` (int64): one
    instruction.  CPU only, as :func:`low32` (Numba's own ``trailing_zeros`` is not
    typed for a GPU, so a body shared with CUDA could not even mention it)."""
    if not isinstance(m, types.Integer):
        return None
    sig = types.int64(m)

    def codegen(context, builder, sig, args):
        if builder.module.triple.startswith("nvptx"):   # (not reached: see low32)
            return _I64(0)
        x = context.cast(builder, args[0], sig.args[0], types.int64)
        return builder.call(_fn(builder, "llvm.cttz.i64", _I64, [_I64, ir.IntType(1)]),
                            [x, ir.IntType(1)(1)])

    return sig, codegen


@intrinsic
def vectors(typingctx):
    """True where the code is compiled for a CPU, False for a GPU (a constant the
    compiler folds: a body shared with CUDA keeps its scalar code for the GPU) or
    under ``NUMBAEMB_SCALAR_LANES=1`` (:data:`SCALAR`)."""
    sig = types.boolean()

    def codegen(context, builder, sig, args):
        gpu = builder.module.triple.startswith("nvptx")
        return context.get_constant(types.boolean, not gpu and not SCALAR)

    return sig, codegen
