"""Wide loads: eight consecutive numbers in one 16-byte (or 32-byte) memory instruction.

A decode step is a stream of weights from HBM, and a stream is only fast when each instruction
moves many bytes. Indexing ``w[o, i]`` of a float16 matrix issues one *2-byte* load per element:
to move the 3.5 MB of a gate/up matrix the GPU then executes ~1.8 million load instructions,
and at batch 1 there is too little else in flight to hide their latency. The fix every fast GEMV
uses is the vector load: ``ld.global.v4.u32`` moves 16 bytes — eight float16 weights — at once.

Numba has no vector-typed arrays, so ``load8_at(a, (i, ..., col))`` is a small ``@intrinsic``: it
emits LLVM IR that takes the address of ``a[i, ..., col]``, reinterprets it as a pointer to 16-byte
words (``<4 x i32>``), loads one word (float16: eight numbers) or two (float32) with 16-byte
alignment and turns each 32-bit piece into float32 — a bit cast for float32, and for a pair of
float16 halves two ``cvt.f32.f16`` in a line of inline PTX. The NVVM compiler makes each word
one ``ld.global.v4.u32``. ``load8(w, row, col)`` (a matrix) and ``load8_1d(v, col)`` (a
vector) are the two shapes the GEMV uses; attention reads the 6-d KV pool with ``load8_at``.
``load4_at(a, index)`` is the raw form for arrays of 32-bit numbers (float32, or fp16 *pairs*
seen as uint32): one 16-byte load, four elements back unconverted — how the tensor-core tile
(``matmul_tc.py``) stages its operands.

The contract: ``col`` is a multiple of 8 and every row of ``a`` starts 16-byte aligned — true
when the row length is a multiple of 8 elements (device allocations are 256-byte aligned). The
callers check ``I % 8 == 0`` once and otherwise take their element-at-a-time loop.

In Numba's CUDA simulator there is no LLVM and no PTX: ``load8_at`` is a plain Python function
returning the same eight float32 values, so every caller runs unchanged there.
"""

from __future__ import annotations

import numpy as np

from .reduce import SIMULATOR, cuda

VEC = 8  # elements per wide load
# Whether the kernels take their wide-load paths. Always on a GPU. In the simulator every wide
# load is a few Python device-function calls a thread, which made an executor's step there
# several times slower than element-at-a-time indexing: off by default, and the kernel tests
# turn it on (``tests/kernels``) so that the simulator still checks the wide paths' indexing.
# Read when a kernel runs in the simulator, and when it compiles on a GPU.
WIDE_LOADS = not SIMULATOR


def _sim_load8_at(a, index):
    head, last = tuple(index[:-1]), index[-1]
    return tuple(np.float32(a[head + (last + k,)]) for k in range(VEC))


def _sim_load4_at(a, index):
    head, last = tuple(index[:-1]), index[-1]
    return tuple(a[head + (last + k,)] for k in range(4))


def _sim_load4_flat(a, at):
    flat = a.reshape(-1)
    return tuple(flat[at + k] for k in range(4))


def _sim_load_from_l2(a, row, col):
    return a[row, col]


def _gpu_loads():
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.extending import intrinsic

    i32, f32 = ir.IntType(32), ir.FloatType()
    quad = ir.VectorType(i32, 4)  # 16 bytes: the widest load a thread can issue
    # Two float16 halves packed in a 32-bit word -> two float32 (PTX: unpack, then convert each).
    halves_to_floats = ir.InlineAsm(
        ir.FunctionType(ir.LiteralStructType([f32, f32]), [i32]),
        "{ .reg .f16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }",
        "=f,=f,r")

    def item_pointer(context, builder, aryty, ary_value, index_values, index_types):
        """LLVM IR: the address of a[index]."""
        ary = context.make_array(aryty)(context, builder, ary_value)
        inds = [context.cast(builder, v, t, types.intp) for v, t in zip(index_values, index_types)]
        return cgutils.get_item_pointer2(context, builder, data=ary.data,
                                         shape=cgutils.unpack_tuple(builder, ary.shape),
                                         strides=cgutils.unpack_tuple(builder, ary.strides),
                                         layout=aryty.layout, inds=inds)

    def quads_at(context, builder, aryty, ary_value, index_values, index_types):
        """LLVM IR: the address of a[index], as a pointer to 16-byte <4 x i32> words."""
        ptr = item_pointer(context, builder, aryty, ary_value, index_values, index_types)
        return builder.bitcast(ptr, quad.as_pointer())

    def vector_load(context, builder, aryty, ary_value, index_values, index_types):
        """LLVM IR: the address of a[index], loaded as 16-byte <4 x i32> words (one for float16,
        two for float32), each word turned into float32 values."""
        quads = quads_at(context, builder, aryty, ary_value, index_values, index_types)
        n_quads = 1 if aryty.dtype == types.float16 else 2
        words = []
        for q in range(n_quads):
            loaded = builder.load(builder.gep(quads, [ir.Constant(i32, q)]), align=16)
            words += [builder.extract_element(loaded, ir.Constant(i32, k)) for k in range(4)]
        if n_quads == 2:  # float32: each word is one number
            return [builder.bitcast(w, f32) for w in words]
        values = []
        for w in words:  # float16: each word is two numbers
            pair = builder.call(halves_to_floats, [w])
            values += [builder.extract_value(pair, 0), builder.extract_value(pair, 1)]
        return values

    def check(a):
        if not isinstance(a, types.Array) or a.dtype not in (types.float16, types.float32):
            raise TypeError(f"load8 takes a float16 or float32 array, not {a}")

    def check_index(a, index):
        if (not isinstance(index, types.BaseTuple) or len(index) != a.ndim
                or not all(isinstance(t, types.Integer) for t in index.types)):
            raise TypeError(f"a wide load needs a tuple of {a.ndim} integer indices, not {index}")

    @intrinsic
    def load8_at(typingctx, a, index):
        check(a)
        check_index(a, index)
        sig = types.UniTuple(types.float32, VEC)(a, index)

        def codegen(context, builder, signature, args):
            tup = signature.args[1]
            vals = vector_load(context, builder, signature.args[0], args[0],
                               cgutils.unpack_tuple(builder, args[1], len(tup)), list(tup.types))
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

    @intrinsic
    def load4_at(typingctx, a, index):
        if not isinstance(a, types.Array) or a.dtype not in (types.float32, types.uint32,
                                                              types.int32):
            raise TypeError(f"load4 takes an array of 32-bit numbers, not {a}")
        check_index(a, index)
        sig = types.UniTuple(a.dtype, 4)(a, index)

        def codegen(context, builder, signature, args):
            tup = signature.args[1]
            quads = quads_at(context, builder, signature.args[0], args[0],
                             cgutils.unpack_tuple(builder, args[1], len(tup)), list(tup.types))
            loaded = builder.load(quads, align=16)
            words = [builder.extract_element(loaded, ir.Constant(i32, k)) for k in range(4)]
            if signature.args[0].dtype == types.float32:
                words = [builder.bitcast(w, f32) for w in words]
            return context.make_tuple(builder, signature.return_type, words)

        return sig, codegen

    @intrinsic
    def load4_flat(typingctx, a, at):
        if (not isinstance(a, types.Array) or a.layout != "C"
                or a.dtype not in (types.float32, types.uint32, types.int32)):
            raise TypeError(f"load4_flat takes a C-contiguous array of 32-bit numbers, not {a}")
        if not isinstance(at, types.Integer):
            raise TypeError(f"load4_flat takes one integer offset, not {at}")
        sig = types.UniTuple(a.dtype, 4)(a, at)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            offset = context.cast(builder, args[1], signature.args[1], types.intp)
            word = builder.gep(builder.bitcast(ary.data, i32.as_pointer()), [offset])
            loaded = builder.load(builder.bitcast(word, quad.as_pointer()), align=16)
            words = [builder.extract_element(loaded, ir.Constant(i32, k)) for k in range(4)]
            if signature.args[0].dtype == types.float32:
                words = [builder.bitcast(w, f32) for w in words]
            return context.make_tuple(builder, signature.return_type, words)

        return sig, codegen

    # ld.global.cg: cached in L2 only. Volatile, with a memory clobber, so that the compiler keeps
    # it after the barrier and the atomic that say the numbers are there (numba's ``cuda.ldcg``
    # is a pure asm statement, free to move above them).
    load_cg = ir.InlineAsm(ir.FunctionType(f32, [f32.as_pointer()]), "ld.global.cg.f32 $0, [$1];",
                           "=f,l,~{memory}", side_effect=True)

    @intrinsic
    def load_from_l2(typingctx, a, row, col):
        if not isinstance(a, types.Array) or a.dtype != types.float32 or a.ndim != 2:
            raise TypeError(f"load_from_l2 takes a float32 matrix, not {a}")
        sig = types.float32(a, row, col)

        def codegen(context, builder, signature, args):
            ptr = item_pointer(context, builder, signature.args[0], args[0], args[1:],
                               signature.args[1:])
            return builder.call(load_cg, [ptr])

        return sig, codegen

    return load8_at, load4_at, load4_flat, load_from_l2


# load8_at(a, (i, j, ..., col)): the 8 elements a[i, j, ..., col:col + 8] as 8 float32.
# load4_at(a, (i, ..., col)): the 4 elements a[i, ..., col:col + 4] of a 32-bit array, unconverted.
# load4_flat(a, at): words at .. at + 3 of a C-contiguous 32-bit array counted from its start, as
# if it were flat: one multiply-add for the address, where an index tuple costs one per dimension.
# load_from_l2(a, row, col): a[row, col] of a float32 matrix read from L2, past this SM's L1
# (``ld.global.cg``): for numbers another block wrote during this kernel, of which this SM's L1
# may hold an older copy (the persistent kernel runs every layer in one kernel).
if SIMULATOR:
    load8_at = cuda.jit(device=True)(_sim_load8_at)
    load4_at = cuda.jit(device=True)(_sim_load4_at)
    load4_flat = cuda.jit(device=True)(_sim_load4_flat)
    load_from_l2 = cuda.jit(device=True)(_sim_load_from_l2)
else:
    load8_at, load4_at, load4_flat, load_from_l2 = _gpu_loads()


@cuda.jit(device=True, inline=True)
def load8(a, row, col):
    """a[row, col:col + 8] of a matrix as 8 float32."""
    return load8_at(a, (row, col))


@cuda.jit(device=True, inline=True)
def load8_1d(a, col):
    """a[col:col + 8] of a vector as 8 float32."""
    return load8_at(a, (col,))


@cuda.jit(device=True, inline=True)
def wide_rows(w):
    """Whether a matrix's rows take the wide-load paths inside a kernel that serves any width
    (the persistent kernel): in_features a multiple of VEC, and wide loads on."""
    return WIDE_LOADS and w.shape[1] % VEC == 0


class ByAlignment:
    """One kernel compiled twice and launched as one: for operands whose rows start 16-byte
    aligned (in_features a multiple of VEC) with the wide-load path only, and for the rest with
    the element-at-a-time one; ``kernel[grid, block, stream](*args)`` picks the build from the
    arguments (``width_of(*args)``: their in_features). A run-time ``wide`` would keep both paths
    in one kernel: twice the code, more registers, and a short kernel with a few warps an SM
    waits on fetching its own instructions (docs/design.md §5). ``build(aligned)`` returns the
    kernel for one case; it passes ``aligned and loads.WIDE_LOADS`` on, a constant on a GPU and
    read as the kernel runs in the simulator (where the tests turn the wide paths on)."""

    def __init__(self, build, width_of):
        self.builds = {aligned: build(aligned) for aligned in (True, False)}
        self.width_of = width_of

    def __getitem__(self, config):
        def launch(*args):
            self.builds[self.width_of(*args) % VEC == 0][config](*args)

        return launch

