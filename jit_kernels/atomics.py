"""Atomic primitives usable from both ``@njit`` code and ``@cuda.jit`` kernels.

Each is a Numba ``intrinsic``: LLVM atomics on the CPU (x86/ARM), and on CUDA
PTX with explicit memory-model semantics at GPU scope (``ld.acquire``,
``st.release``, ``atom.relaxed.cas``; compute capability 7.0 or newer), since
NVVM lowers LLVM's orderings to relaxed ``atom.*`` with no fence.  Without
acquire a reader that sees a published row word could still read the slot's
key from its SM's L1 cache, which is not coherent.  Arguments are a 1-D
integer array (int32 or int64) and an index.

>>> import numpy as np
>>> from numba import njit
>>> @njit
... def bump(a):
...     return fetch_add(a, 0, 5)
>>> a = np.zeros(1, np.int64); int(bump(a)), int(a[0])
(0, 5)
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["cas", "load_acquire", "store_release", "fetch_add", "claim"]


def _pointer(context, builder, sig, args):
    """Pointer to ``arr[idx]``, the first two arguments of every intrinsic here."""
    aryty = sig.args[0]
    arr = context.make_array(aryty)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, aryty, arr, [args[1]])


def _width(context, sig):
    """Bytes of the array's element (the alignment of an atomic load / store)."""
    return context.get_abi_sizeof(context.get_data_type(sig.args[0].dtype))


def _is_cuda(context):
    return "CUDA" in type(context).__name__


def _ptx_width(ity):
    """PTX operand suffix and register constraint for an integer type."""
    return (".b64", "l") if ity.width == 64 else (".b32", "r")


def _ptx(builder, text, ptr, args, returns=True):
    """Inline PTX on the generic address ``ptr`` and values ``args`` of its type."""
    ity = ptr.type.pointee
    suffix, reg = _ptx_width(ity)
    addr = builder.ptrtoint(ptr, ir.IntType(64))
    cons = ([f"={reg}"] if returns else []) + ["l"] + [reg] * len(args) + ["~{memory}"]
    fnty = ir.FunctionType(ity if returns else ir.VoidType(), [addr.type] + [ity] * len(args))
    fn = ir.InlineAsm(fnty, text.format(suffix), ",".join(cons), side_effect=True)
    return builder.call(fn, [addr] + list(args))


def _int_array(arr):
    return isinstance(getattr(arr, "dtype", None), types.Integer) and arr.dtype.bitwidth in (32, 64)


@intrinsic
def cas(typingctx, arr, idx, expected, desired):
    """Compare-and-swap ``arr[idx]``; returns the value seen before.

    Sequentially consistent on the CPU; relaxed on CUDA (a fence per CAS was
    half of an insert's stall time on an H100): a caller that reads data
    published under the word it saw must load the word again with
    :func:`load_acquire` first.
    """
    if not _int_array(arr):
        return None
    sig = arr.dtype(arr, types.intp, arr.dtype, arr.dtype)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args)
        if _is_cuda(context):
            return _ptx(builder, "atom.relaxed.gpu.cas{0} $0, [$1], $2, $3;", ptr, args[2:4])
        res = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(res, 0)

    return sig, codegen


@intrinsic
def fetch_add(typingctx, arr, idx, value):
    """Atomically add ``value`` to ``arr[idx]`` (no ordering); returns the old value."""
    if not _int_array(arr):
        return None
    sig = arr.dtype(arr, types.intp, arr.dtype)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args)
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def load_acquire(typingctx, arr, idx):
    """Load ``arr[idx]`` so that writes published before it are visible."""
    if not _int_array(arr):
        return None
    sig = arr.dtype(arr, types.intp)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args)
        if _is_cuda(context):
            return _ptx(builder, "ld.acquire.gpu{0} $0, [$1];", ptr, ())
        return builder.load_atomic(ptr, "acquire", _width(context, sig))

    return sig, codegen


@intrinsic
def store_release(typingctx, arr, idx, value):
    """Store ``value`` at ``arr[idx]`` after all earlier writes."""
    if not _int_array(arr):
        return None
    sig = types.void(arr, types.intp, arr.dtype)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args)
        if _is_cuda(context):
            _ptx(builder, "st.release.gpu{0} [$0], $1;", ptr, (args[2],), returns=False)
        else:
            builder.store_atomic(args[2], ptr, "release", _width(context, sig))
        return context.get_dummy_value()

    return sig, codegen


def _asm(builder, text, constraint, args=()):
    """Call a side-effecting PTX snippet returning one 32-bit register."""
    i32 = ir.IntType(32)
    fn = ir.InlineAsm(ir.FunctionType(i32, [a.type for a in args]), text, constraint,
                      side_effect=True)
    return builder.call(fn, list(args))


def _shfl_idx(builder, mask, value, src):
    """``value`` (i32 or i64) of lane ``src`` among the lanes of ``mask``."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    fnty = ir.FunctionType(ir.LiteralStructType((i32, ir.IntType(1))), (i32,) * 5)
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.nvvm.shfl.sync.i32")
    idx_mode, clamp = ir.Constant(i32, 0), ir.Constant(i32, 0x1F)

    def part(v):
        return builder.extract_value(builder.call(fn, (mask, idx_mode, v, src, clamp)), 0)

    if value.type.width == 32:
        return part(value)
    lo = part(builder.trunc(value, i32))
    hi = part(builder.trunc(builder.lshr(value, ir.Constant(i64, 32)), i32))
    return builder.or_(builder.shl(builder.zext(hi, i64), ir.Constant(i64, 32)),
                       builder.zext(lo, i64))


@intrinsic
def claim(typingctx, arr, idx):
    """Atomically add one to ``arr[idx]`` and return the old value (a ticket).

    On the CPU this is ``fetch_add(arr, idx, 1)``.  On CUDA the lanes of a warp
    that call it together (with the same ``arr[idx]``) share one atomic: the
    lowest lane adds their count and hands each lane ``old + its rank`` (lanes in
    ascending order), so a counter that every thread of a launch bumps does not
    serialise one atomic per thread.  Callers must pass the same address from
    every lane that may arrive together.
    """
    if not _int_array(arr):
        return None
    sig = arr.dtype(arr, types.intp)

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig, args)
        ity = ptr.type.pointee
        if not _is_cuda(context):
            return builder.atomic_rmw("add", ptr, ir.Constant(ity, 1), "seq_cst")
        i32 = ir.IntType(32)
        mask = _asm(builder, "activemask.b32 $0;", "=r")
        below = _asm(builder, "mov.u32 $0, %lanemask_lt;", "=r")
        lane = builder.call(cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, ()), "llvm.nvvm.read.ptx.sreg.laneid"), ())
        leader = builder.cttz(mask, ir.Constant(ir.IntType(1), 0))
        count = builder.zext(builder.ctpop(mask), ity) if ity.width > 32 else builder.ctpop(mask)
        rank = builder.ctpop(builder.and_(mask, below))
        rank = builder.zext(rank, ity) if ity.width > 32 else rank
        slot = cgutils.alloca_once_value(builder, ir.Constant(ity, 0))
        with builder.if_then(builder.icmp_unsigned("==", lane, leader)):
            builder.store(builder.atomic_rmw("add", ptr, count, "seq_cst"), slot)
        base = _shfl_idx(builder, mask, builder.load(slot), leader)
        return builder.add(base, rank)

    return sig, codegen
