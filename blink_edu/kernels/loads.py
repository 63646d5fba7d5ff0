"""Wide loads: eight consecutive numbers in one 16-byte (or 32-byte) memory instruction.

A decode step is a stream of weights from HBM, and a stream is only fast when each instruction
moves many bytes. Indexing ``w[o, i]`` of a float16 matrix issues one *2-byte* load per element:
to move the 3.5 MB of a gate/up matrix the GPU then executes ~1.8 million load instructions,
and at batch 1 there is too little else in flight to hide their latency. The fix every fast GEMV
uses is the vector load: ``ld.global.v4.u32`` moves 16 bytes — eight float16 weights — at once.

Numba has no vector-typed arrays, so ``load8(a, row, col)`` is a small ``@intrinsic``: it emits
LLVM IR that takes the address of ``a[row, col]``, reinterprets it as a pointer to an
8-element vector (``<8 x half>`` or ``<8 x float>``), loads it with 16-byte alignment and widens
the elements to float32. LLVM's NVPTX backend turns that into one ``ld.global.v4.u32`` (float16)
or two ``ld.global.v4.f32`` (float32) plus eight ``cvt.f32.f16``. ``load8_1d(a, col)`` is the
same for a vector, ``load8_at(a, (i, j, ..., col))`` for an array of any rank (the KV pool).

The contract: ``col`` is a multiple of 8 and every row of ``a`` starts 16-byte aligned — true
when the row length is a multiple of 8 elements (device allocations are 256-byte aligned). The
callers check ``I % 8 == 0`` once and otherwise take their element-at-a-time loop.

In Numba's CUDA simulator there is no LLVM and no PTX: ``load8`` is a plain Python function
returning the same eight float32 values, so every caller runs unchanged there.
"""

from __future__ import annotations

import numpy as np

from .reduce import SIMULATOR, cuda

VEC = 8  # elements per wide load


def _sim_load8(a, row, col):
    return tuple(np.float32(a[row, col + k]) for k in range(VEC))


def _sim_load8_1d(a, col):
    return tuple(np.float32(a[col + k]) for k in range(VEC))


def _sim_load8_at(a, index):
    head, last = tuple(index[:-1]), index[-1]
    return tuple(np.float32(a[head + (last + k,)]) for k in range(VEC))


def _gpu_loads():
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.extending import intrinsic

    def vector_load(context, builder, aryty, ary_value, index_values, index_types):
        """LLVM IR: the address of a[index], loaded as <8 x elt> (align 16), widened to float."""
        ary = context.make_array(aryty)(context, builder, ary_value)
        inds = [context.cast(builder, v, t, types.intp) for v, t in zip(index_values, index_types)]
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data,
                                        shape=cgutils.unpack_tuple(builder, ary.shape),
                                        strides=cgutils.unpack_tuple(builder, ary.strides),
                                        layout=aryty.layout, inds=inds)
        elt = context.get_data_type(aryty.dtype)
        vec = builder.load(builder.bitcast(ptr, ir.VectorType(elt, VEC).as_pointer()), align=16)
        if aryty.dtype != types.float32:
            vec = builder.fpext(vec, ir.VectorType(ir.FloatType(), VEC))
        return [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(VEC)]

    def check(a):
        if not isinstance(a, types.Array) or a.dtype not in (types.float16, types.float32):
            raise TypeError(f"load8 takes a float16 or float32 array, not {a}")

    @intrinsic
    def load8(typingctx, a, row, col):
        check(a)
        sig = types.UniTuple(types.float32, VEC)(a, row, col)

        def codegen(context, builder, signature, args):
            vals = vector_load(context, builder, signature.args[0], args[0], args[1:],
                               signature.args[1:])
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

    @intrinsic
    def load8_1d(typingctx, a, col):
        check(a)
        sig = types.UniTuple(types.float32, VEC)(a, col)

        def codegen(context, builder, signature, args):
            vals = vector_load(context, builder, signature.args[0], args[0], args[1:],
                               signature.args[1:])
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

    @intrinsic
    def load8_at(typingctx, a, index):
        check(a)
        if (not isinstance(index, types.BaseTuple) or len(index) != a.ndim
                or not all(isinstance(t, types.Integer) for t in index.types)):
            raise TypeError(f"load8_at needs a tuple of {a.ndim} integer indices, not {index}")
        sig = types.UniTuple(types.float32, VEC)(a, index)

        def codegen(context, builder, signature, args):
            tup = signature.args[1]
            vals = vector_load(context, builder, signature.args[0], args[0],
                               cgutils.unpack_tuple(builder, args[1], len(tup)), list(tup.types))
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

    return load8, load8_1d, load8_at


if SIMULATOR:
    load8 = cuda.jit(device=True)(_sim_load8)
    load8_1d = cuda.jit(device=True)(_sim_load8_1d)
    load8_at = cuda.jit(device=True)(_sim_load8_at)
else:
    # load8(a, row, col) / load8_1d(a, col) / load8_at(a, (i, j, ..., col)): the 8 elements
    # a[row, col:col + 8] / a[col:col + 8] / a[i, j, ..., col:col + 8] as 8 float32.
    load8, load8_1d, load8_at = _gpu_loads()
