"""Bit casts between float32 and int32 (CPU and CUDA intrinsics).

>>> import numpy as np
>>> from numba import njit
>>> int(njit(lambda x: f32_bits(x))(np.float32(1.0))) == 0x3F800000
True
"""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["f32_bits", "bits_f32"]


@intrinsic
def f32_bits(typingctx, x):
    """The bits of a float32 as an int32 (a bit cast, CPU and CUDA)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, i):
    """The float32 whose bits are the low 32 bits of the integer ``i``."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if i.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(i), codegen
