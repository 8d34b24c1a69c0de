"""Vector instructions for the CPU kernels, as Numba intrinsics (LLVM vector IR).

:func:`low32` finds the lowest of 32 int64 values and where it first occurs with a
few vector minima and compares and no branch (the bounded table's victim search
reads 32 scores a new key).  It is for the CPU: a body shared with CUDA takes it
only where :func:`vectors` (a constant, False on a GPU) says so, and keeps its scalar
code for the GPU.

>>> import numpy as np
>>> from numba import njit
>>> a = np.array([9, 7, 8, 7] * 9, np.int64)
>>> njit(lambda a, o: low32(a, o))(a, 2)        # lowest of a[2:34]: 7, first at a[3]
(7, 1)
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 4          # int64 lanes a vector (AVX2's 256 bits; wider ones split in LLVM)
WIDTH = 32         # values low32 reads

_I32, _I64 = ir.IntType(32), ir.IntType(64)


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
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1
            and isinstance(o, types.Integer)):
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


@intrinsic
def vectors(typingctx):
    """True where the code is compiled for a CPU, False for a GPU (a constant the
    compiler folds: a body shared with CUDA keeps its scalar code for the GPU)."""
    sig = types.boolean()

    def codegen(context, builder, sig, args):
        gpu = builder.module.triple.startswith("nvptx")
        return context.get_constant(types.boolean, not gpu)

    return sig, codegen
