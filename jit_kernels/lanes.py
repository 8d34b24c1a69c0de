"""Vector instructions for the CPU kernels, as Numba intrinsics (LLVM vector IR).

:func:`low32` finds the lowest of 32 int64 values and where it first occurs with a
few vector minima and compares and no branch (the bounded table's victim search
reads 32 scores a new key); on a GPU (a body shared with CUDA) it is two chains of
selects side by side instead (:data:`low32_selects` is that form on a CPU, for
tests).

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


def _scalar_low(builder, base):
    """The same in selects (a GPU), two chains side by side (a thread's loads and
    selects overlap), the first half's winning a tie."""
    halves = []
    for start in (0, WIDTH // 2):
        low, first = builder.load(builder.gep(base, [_I64(start)])), _I64(start)
        for t in range(start + 1, start + WIDTH // 2):
            v = builder.load(builder.gep(base, [_I64(t)]))
            below = builder.icmp_signed("<", v, low)
            low = builder.select(below, v, low)
            first = builder.select(below, _I64(t), first)
        halves.append((low, first))
    (l0, f0), (l1, f1) = halves
    keep = builder.icmp_signed("<=", l0, l1)
    return builder.select(keep, l0, l1), builder.select(keep, f0, f1)


def _low_intrinsic(scalar=None):
    """The ``low32`` intrinsic: vectors on a CPU and selects on a GPU (``scalar``
    None), or always selects (``scalar`` True: the GPU's code, tested on a CPU)."""
    @intrinsic
    def low32(typingctx, arr, o):
        """``(lowest, t)``: the lowest of the int64 ``arr[o:o + 32]`` and the first t
        with ``arr[o + t]`` equal to it.  No bounds check: the caller keeps ``o + 32``
        within ``arr``."""
        if not (isinstance(arr, types.Array) and arr.dtype == types.int64
                and arr.ndim == 1 and isinstance(o, types.Integer)):
            return None
        sig = types.UniTuple(types.int64, 2)(arr, o)

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            at = context.cast(builder, args[1], sig.args[1], types.int64)
            base = builder.gep(data, [at])
            gpu = scalar or builder.module.triple.startswith("nvptx")
            low, first = (_scalar_low if gpu else _vector_low)(builder, base)
            return context.make_tuple(builder, sig.return_type, [low, first])

        return sig, codegen

    return low32


low32 = _low_intrinsic()
low32_selects = _low_intrinsic(scalar=True)     # (the GPU's form, for tests on a CPU)
