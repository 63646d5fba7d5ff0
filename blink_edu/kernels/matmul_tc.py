"""Tensor cores from Python: a matmul tile on ``mma.sync`` fragments, written in Numba.

What it teaches: how the matrix multiplies of a *batched* step (decode of many sequences at once,
a prompt chunk) reach the GPU's tensor cores; the same contract as the ``linear`` kernels,
``out (+)= rms_norm?(x[x_rows]) @ W.T + b``, so the executors launch it (``launch_tc_linear``)
wherever a batched step would launch a ``linear`` kernel.

**What a tensor core does.** A plain CUDA core does one fused multiply-add per thread per
instruction. A tensor core does a whole small matrix product per *warp* per instruction: with
``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` the 32 threads of a warp together compute
``D (16x8) = A (16x16) @ B (16x8) + C (16x8)`` — 2048 multiply-adds in one instruction. On an
H200 that is ~990 TFLOP/s of fp16 against ~60 of fp32 FMAs: a decode step of 64 sequences, ~17
GFLOP, costs ~0.26 ms on FMAs but ~0.02 ms on tensor cores, under the time it takes to stream the
weights once. That is what lets batch 64 cost little more than batch 1.

**The fragment layout.** No thread holds a whole matrix: each holds a *fragment*, a few
registers, and the hardware knows which element sits where. Lane ``l`` of the warp is in group
``g = l // 4`` (0..7) at position ``t = l % 4`` (0..3). Registers of A and B are 32-bit words
holding two fp16 values (the lower half is the lower k); C and D are float32::

    A (16 x 16, row-major)                B (16 x 8, "col": stored as B.T = W rows)
            k: 0 .. 7      8 .. 15                     n: 0 .. 7
          +-------------+-------------+         k 0..7  +----------+
    m 0..7| a0          | a2          |                 | b0       |   lane (g, t) holds
          | (g, 2t:2t+2)| (g, 2t+8:..)|                 | k 2t,2t+1|   column n = g
          +-------------+-------------+         k 8..15 +----------+
    m 8.. | a1          | a3          |                 | b1       |
    15    | (g+8, 2t:..)| (g+8, 2t+8:)|                 | k 2t+8,+9|
          +-------------+-------------+                 +----------+

    C, D (16 x 8, float32): c0 = (g, 2t)    c1 = (g, 2t+1)
                            c2 = (g+8, 2t)  c3 = (g+8, 2t+1)

So lane (g, t) holds rows g and g+8 of A, and in each of them the k pairs t and t+4; column g
of B at the same k pairs; and the four outputs in rows g, g+8 and columns 2t, 2t+1. ``.row.col``
means A is read along its rows and B along its columns — for ``x @ W.T`` a column of B is a row of
the PyTorch weight ``W (O, I)``, so the weights are used exactly as they are stored.

**Why fp32 accumulation.** fp16 has an 11-bit significand: adding 4e-4 to a running sum of about
1 changes nothing, and a dot product over 1536 inputs is 1536 such additions. The products of two
fp16 values are exact in fp32 and the tensor core adds them in fp32 (``.f32`` in the name, twice:
D and C), so only the inputs are rounded, once — the error stays near fp16's 5e-4 per input
instead of growing with the length of the sum.

**The tile hierarchy.** One ``mma`` is 16x8x16; a block computes a ``BM x BN`` tile of ``out``:

* block tile (``BM x BN``, k in steps of ``BK``): every thread stages a share of the ``BM x BK``
  activations (fp32 from memory, converted to fp16 on the way) and of the ``BN x BK`` weights
  (fp16 pairs) into shared memory, 16 bytes a load (``loads.load4_flat``) — each value loaded
  once serves ``BN`` (resp. ``BM``) outputs. Two shared buffers: the loads of step ``k + 1`` are
  issued before the ``mma`` of step ``k`` and land in the other buffer, so memory latency
  overlaps the math;
* warp tile (``WM x WN``): each warp owns ``MI x NI`` mma tiles of the block tile and keeps their
  accumulators in registers across its k steps (register blocking: an A fragment serves ``NI``
  mma, a B fragment ``MI``);
* mma (16x8x16): the instruction above.

An experiment beside it, ``BLINK_EDU_TILE_STAGES=3`` (``tc_matmul_pipelined``): the k steps
copied by ``cp.async`` straight into three shared buffers, two steps in flight while the third
is multiplied, the activations converted to fp16 as the fragments are built. It passes the same
tests and, measured on the H200, is slower (gate/up at 512 tokens 28.5 µs against 23.5,
``tc_matmul_pipelined_h200_2ed258d.json``): the loads are hidden, but every warp converts the
same activations for itself and the instructions nearly double. The register-staged tile stays
the default; the experiment stays as the worked example of ``cp.async`` from Python.

**Split-K: enough blocks for a small batch.** A decode batch of 64 tokens has one row of tiles:
the 576 x 576 output projection is 9 tiles of 64 x 64, 9 blocks on a GPU of 132
multiprocessors, each walking k one step after the other and each step waiting ~1 µs for
memory. So a work item is a tile *and a range of k steps*: ``tc_steps_per_split`` splits the
k range until the blocks fill the GPU, and the blocks add their partial tiles onto ``out`` with
atomic adds (in an order that varies from run to run: the sums agree to float32 rounding, not
bit for bit). A prompt chunk has tiles enough and takes all of k in one block, adding plainly.

**Prologue and epilogue.** Where the k range is split, partial tiles are *added* to ``out``, so
what they are added onto is prepared first, by ``tc_prologue`` (a launch of its own, only when it
has work): ``out`` set to the bias (``accumulate=0``) or the bias added to the residual already
there (``accumulate=1``). Where it is not, each block writes its tile whole — bias and residual
added in its epilogue, every load of the residual issued before the first store (``add_rows``).
Either way the prologue puts each token's ``1 / rms`` for the RMSNorm in ``row_scale``. The norm is
folded in as in the ``linear`` kernels: ``rms_norm(x) @ W.T = inv_rms(x) * ((x * g) @ W.T)`` —
the norm weight ``g`` scales the activations as they are staged, ``row_scale`` each partial
tile as it is added. The activations are rounded to fp16 after the norm weight and before
``1 / rms``: ``|x * g|`` must stay below fp16's largest value, 65504 (a residual stream is far
below it). ``launch_tc_linear`` makes both launches.

**Two forms, one tile.** Inline PTX cannot run in Numba's simulator, so the two instructions this
tile needs — ``mma_m16n8k16`` and ``pack_half2`` (two fp32 to an fp16 pair) — have a simulator
form chosen once at import, as ``reduce.block_sum`` does: there every thread writes its
fragment registers to shared memory and computes its own four outputs from the warp's registers,
the way the hardware gathers them. (``fp16_pairs`` has two forms as well: it refuses weights that
are not fp16 when the kernel runs in the simulator, when it compiles on a GPU.) Everything else —
the staging, the buffers, the fragment indexing, the split of k, the loops — is the same Python
code in both places, so CI checks the indexing of the real tile.

Requirements: ``I`` even (the weights are read as fp16 pairs), ``w`` C-contiguous float16
(``require_tc_operands`` checks them on the host). Its kernels take ``reduce.THREADS`` threads a
block (128 on a GPU, 32 in the simulator), like every other op kernel.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np
from numba import float32, int32, uint32

from . import loads
from .loads import ByAlignment, load4_flat
from .reduce import SIMULATOR, THREADS, WARP, block_sum, cuda, grid_for
from .reduce import THREADS as OP_THREADS  # the prologue's block: the reductions' size

# --- tile geometry ---------------------------------------------------------------------------
MI, NI = 2, 4  # mma tiles per warp: MI along m (16 rows each), NI along n (8 columns each)
WM, WN = 16 * MI, 8 * NI  # warp tile: 32 x 32
ACC_SHAPE = (MI, NI, 4)  # each lane's accumulators: c0..c3 of every mma tile of its warp tile
A_FRAG = (MI, 4)  # a0..a3 for each of the MI row tiles
B_FRAG = (NI, 2)  # b0, b1 for each of the NI column tiles
QUAD = 4  # 32-bit words one 16-byte load brings: 4 fp32 activations, or 4 fp16 weight pairs


class TileGeometry(NamedTuple):
    """The block-level constants, which follow from the threads a block and the k step."""

    THREADS: int
    WARPS: int  # 4 on a GPU, 1 in the simulator
    WARPS_M: int  # warps stacked along the rows (tokens) of the block tile
    WARPS_N: int  # and side by side along its columns (outputs)
    BM: int  # block tile: BM x BN (64 x 64 on a GPU, 32 x 32 in the simulator)
    BN: int
    BK: int  # k per shared-memory step
    KP: int  # 32-bit words (fp16 pairs) per row of a k step
    STRIDE: int  # words per row of a shared tile
    A_QUADS: int  # threads staging one activation row: BK / 4 (4 fp32 a load)
    A_ROWS: int  # activation rows one pass of the block's threads stages
    A_LOADS: int  # 16-byte activation loads each thread issues per k step
    B_QUADS: int  # threads staging one weight row: BK / 8 (8 fp16 a load)
    B_ROWS: int  # weight rows one pass stages
    B_LOADS: int  # 16-byte weight loads each thread issues per k step
    A_TILE: int  # 2 buffers x BM rows x STRIDE words of fp16 pairs (uint32), flat
    B_TILE: int  # 2 buffers x BN rows x STRIDE words, flat
    REGS_SHAPE: tuple  # simulator: (warps, lanes, 6): every lane's a0..a3, b0, b1
    ROWS_SHAPE: tuple  # simulator: (warps, lanes): every lane's row offset for ldmatrix


def tile_geometry(threads: int, bk: int) -> TileGeometry:
    warps = threads // WARP
    warps_m = 2 if warps >= 4 else 1
    bm, bn, kp = warps_m * WM, warps // warps_m * WN, bk // 2
    # One spare group of 4 words per row: lane (g, t) reads word g * stride + t, and with
    # stride = 4 (mod 8) the 32 lanes of a fragment load hit 32 different shared-memory banks.
    stride = kp + 4
    a_quads, b_quads = bk // QUAD, bk // (2 * QUAD)
    a_rows, b_rows = threads // a_quads, threads // b_quads
    # (mma_step writes out the 16-wide k slices of a step: 2 or 4)
    assert threads % a_quads == 0 and bm % a_rows == 0 and bn % b_rows == 0 and kp in (16, 32)
    return TileGeometry(threads, warps, warps_m, warps // warps_m, bm, bn, bk, kp, stride,
                        a_quads, a_rows, bm // a_rows, b_quads, b_rows, bn // b_rows,
                        2 * bm * stride, 2 * bn * stride, (warps, WARP, 6), (warps, WARP))


def tile_stages(value: str | None) -> int:
    """Shared-memory stages of the tile, from ``BLINK_EDU_TILE_STAGES`` (read once, at import):
    1 by default — the loads of the next k step staged through registers into the second of two
    buffers (``tc_matmul``) — or 3, the experiment of ``tc_matmul_pipelined``: ``cp.async``
    copies straight into three buffers, two k steps in flight while the third is multiplied
    (``tools/compile_check.py`` for sm_90: 124 registers and 46 KB of shared memory a block,
    against 166 and 36 KB; SASS: ``LDGSTS.128`` copies, ``LDS.64`` fragments of A)."""
    stages = int(value or 1)
    if stages not in (1, 3):
        raise ValueError(f"BLINK_EDU_TILE_STAGES must be 1 or 3, got {value!r}")
    return stages


STAGES = tile_stages(os.environ.get("BLINK_EDU_TILE_STAGES"))
# k per shared-memory step: 64 on a GPU (a thread then has 8 + 4 sixteen-byte loads in flight a
# step), 32 in the simulator, so that tests with a small I still cross several steps and both
# buffers; 32 for three stages (three of 64 would not fit a block's 48 KB of static shared memory).
GEOMETRY = tile_geometry(THREADS, 32 if SIMULATOR or STAGES > 1 else 64)
# Numba reads module globals as compile-time constants (and global tuples as array shapes).
(THREADS, WARPS, WARPS_M, WARPS_N, BM, BN, BK, KP, STRIDE, A_QUADS, A_ROWS, A_LOADS, B_QUADS,
 B_ROWS, B_LOADS, A_TILE, B_TILE, REGS_SHAPE, ROWS_SHAPE) = GEOMETRY
A_VALUES, B_WORDS = QUAD * A_LOADS, QUAD * B_LOADS  # registers a thread stages per k step
LOADS = A_LOADS + B_LOADS  # 16-byte loads a thread issues per k step
# The pipelined tile keeps the activations as they arrive, float32 (converted to fp16 as the
# fragments are built): rows of BK + 8 words, so that lane (g, t)'s word 2t of row g falls in
# bank 8g + 2t — no two lanes of a half-warp on one bank.
A32_STRIDE = BK + 8
A32_TILE = STAGES * BM * A32_STRIDE  # (STAGES x BM x A32_STRIDE,) float32, flat
B_STAGES_TILE = STAGES * BN * STRIDE  # (STAGES x BN x STRIDE,) fp16 pairs, flat

# --- the two instructions: inline PTX on a GPU, Python in the simulator ------------------------
if SIMULATOR:

    def _as_float32(words):
        """fp16 pairs (uint32 words) to float32, in order: the lower half of each word first."""
        return np.asarray(words, np.uint32).view(np.float16).astype(np.float32)

    @cuda.jit(device=True)
    def mma_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Simulator form of ``mma.sync.m16n8k16``: every lane of the warp puts its six fragment
        registers in shared memory (the warp's "register file"), then computes its own four
        outputs from the A rows and B columns they hold, exactly as laid out in the drawing."""
        warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
        regs = cuda.shared.array(REGS_SHAPE, uint32)  # (WARPS, 32 lanes, a0 a1 a2 a3 b0 b1)
        regs[warp, lane, 0], regs[warp, lane, 1] = a0, a1
        regs[warp, lane, 2], regs[warp, lane, 3] = a2, a3
        regs[warp, lane, 4], regs[warp, lane, 5] = b0, b1
        cuda.syncthreads()
        g, t = lane // 4, lane % 4
        # k pair j (k = 2j, 2j+1) of A's row g is in lane 4g + j % 4: a0 for j < 4, a2 for j >= 4;
        # of row g + 8 in a1 / a3. Of B's column n in lane 4n + j % 4: b0 for j < 4, b1 after.
        row_g = _as_float32([regs[warp, 4 * g + j % 4, 2 * (j // 4)] for j in range(8)])  # (16,)
        row_g8 = _as_float32([regs[warp, 4 * g + j % 4, 1 + 2 * (j // 4)] for j in range(8)])
        col_0 = _as_float32([regs[warp, 4 * (2 * t) + j % 4, 4 + j // 4] for j in range(8)])
        col_1 = _as_float32([regs[warp, 4 * (2 * t + 1) + j % 4, 4 + j // 4] for j in range(8)])
        cuda.syncthreads()  # every lane has read the registers: the next mma may overwrite them
        return (float32(c0 + row_g @ col_0), float32(c1 + row_g @ col_1),
                float32(c2 + row_g8 @ col_0), float32(c3 + row_g8 @ col_1))

    @cuda.jit(device=True)
    def pack_half2(lo, hi):
        """Two float32 rounded to fp16 (to nearest even) in one 32-bit word, ``lo`` in the low half."""
        return np.array([lo, hi], np.float16).view(np.uint32)[0]

    @cuda.jit(device=True)
    def fp16_pairs(w):
        """w (O, I) float16 seen as (O, I // 2) uint32 (see the GPU form); other weights refused."""
        if w.ndim != 2 or w.dtype != np.float16:
            raise TypeError(f"tc_matmul takes (O, I) float16 weights, got {w.ndim}-d {w.dtype}")
        return w.view(np.uint32)

    @cuda.jit(device=True)
    def ldmatrix_x4(tile, at):
        """Simulator form of ``ldmatrix.x4``: every lane puts the offset of its row in shared
        memory, then takes word t of row g of each of the four 8 x 8 matrices (see the GPU form)."""
        warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
        rows = cuda.shared.array(ROWS_SHAPE, uint32)  # (WARPS, 32 lanes) each lane's row offset
        rows[warp, lane] = at
        cuda.syncthreads()
        g, t = lane // 4, lane % 4
        words = (tile[rows[warp, g] + t], tile[rows[warp, 8 + g] + t],
                 tile[rows[warp, 16 + g] + t], tile[rows[warp, 24 + g] + t])
        cuda.syncthreads()  # every lane has read the offsets: the next call may overwrite them
        return words

    @cuda.jit(device=True)
    def cp_async16(tile, at, src, src_at, nbytes):
        """Simulator form of ``cp.async`` (16 bytes): words ``src_at .. + 3`` of ``src`` (flat)
        into ``tile[at .. at + 3]`` at once; zeros where ``nbytes`` is 0."""
        flat = src.reshape(-1)
        for u in range(4):
            tile[at + u] = flat[src_at + u] if nbytes else 0

    @cuda.jit(device=True)
    def cp_async4(tile, at, src, src_at, nbytes):
        """Simulator form of ``cp.async`` (4 bytes): one word, or a zero where ``nbytes`` is 0."""
        tile[at] = src.reshape(-1)[src_at] if nbytes else 0

    @cuda.jit(device=True)
    def cp_async_commit():
        """Simulator form: the copies have landed already."""

    @cuda.jit(device=True)
    def cp_async_wait_stages():
        """Simulator form: nothing is in flight."""

    cp_async_wait_all = cp_async_wait_stages

else:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic, overload

    def fp16_pairs(w):
        """w (O, I) float16 seen as (O, I // 2) uint32: word j of row o holds w[o, 2j] in its low
        half and w[o, 2j + 1] in its high half — one 4-byte load brings two weights. Other
        weights are refused when the kernel is compiled (they would be read as garbage)."""

    @overload(fp16_pairs, target="cuda", inline="always")
    def _fp16_pairs(w):
        if not (isinstance(w, types.Array) and w.ndim == 2 and w.dtype == types.float16):
            raise TypingError(f"tc_matmul takes (O, I) float16 weights, got {w}")
        return lambda w: w.view(np.uint32)

    @intrinsic
    def mma_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """``(d0, d1, d2, d3) = A @ B + C`` for the warp's 16x8x16 fragments (layout in the module
        docstring): a0..a3, b0, b1 are uint32 fp16 pairs, c and d float32. All 32 lanes of the
        warp must call it together (``.sync.aligned``) with the same tile."""
        sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = ir.InlineAsm(fnty, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                               "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            d = builder.call(asm, args)
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_value(d, i) for i in range(4)])

        return sig, codegen

    @intrinsic
    def ldmatrix_x4(typingctx, tile, at):
        """Four 8 x 8 matrices of fp16 from shared memory into the warp's fragments, in one
        instruction: ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``. Lane l gives the word offset
        ``at`` in ``tile`` (a 1-d uint32 shared array) of row l % 8 of matrix l // 8 (8 fp16 =
        16 bytes, 16-byte aligned); lane (g, t) gets back, from each matrix, word t of its row g
        — exactly an ``mma`` operand's fragment (module docstring). One instruction where
        loading each word of the fragments took four."""
        sig = types.UniTuple(types.uint32, 4)(tile, at)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            offset = context.cast(builder, args[1], signature.args[1], types.intp)
            word = builder.gep(builder.bitcast(ary.data, i32.as_pointer()), [offset])
            shared = builder.addrspacecast(word, ir.PointerType(i32, 3))  # generic -> .shared
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
            asm = ir.InlineAsm(fnty, "ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                               "{$0,$1,$2,$3}, [$4];", "=r,=r,=r,=r,r,~{memory}",
                               side_effect=True)
            d = builder.call(asm, [builder.ptrtoint(shared, i32)])
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_value(d, k) for k in range(4)])

        return sig, codegen

    @intrinsic
    def pack_half2(typingctx, lo, hi):
        """Two float32 rounded to fp16 (to nearest even) in one 32-bit word, ``lo`` in the low half:
        one ``cvt.rn.f16x2.f32``, which puts its *first* source in the upper half."""
        sig = types.uint32(types.float32, types.float32)

        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), "cvt.rn.f16x2.f32 $0, $1, $2;",
                               "=r,f,f")
            return builder.call(asm, [args[1], args[0]])

        return sig, codegen


    def _cp_async(size: int, cache: str):
        """An intrinsic ``(tile, at, src, src_at, nbytes)``: ``cp.async.{cache}.shared.global`` of
        ``size`` bytes from word ``src_at`` of ``src`` (flat) to word ``at`` of the shared ``tile``,
        in the background; ``nbytes`` < ``size`` fills the rest with zeros (0: nothing is read)."""

        @intrinsic
        def cp_async(typingctx, tile, at, src, src_at, nbytes):
            sig = types.void(tile, at, src, src_at, nbytes)

            def codegen(context, builder, signature, args):
                i32, i64 = ir.IntType(32), ir.IntType(64)

                def word(k, space):  # the address of word args[k + 1] of array args[k]
                    ary = context.make_array(signature.args[k])(context, builder, args[k])
                    offset = context.cast(builder, args[k + 1], signature.args[k + 1], types.intp)
                    at = builder.gep(builder.bitcast(ary.data, i32.as_pointer()), [offset])
                    return builder.addrspacecast(at, ir.PointerType(i32, space))

                dst = builder.ptrtoint(word(0, 3), i32)  # generic -> .shared
                src_ = builder.ptrtoint(word(2, 1), i64)  # generic -> .global
                n = context.cast(builder, args[4], signature.args[4], types.uint32)
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]),
                                   f"cp.async.{cache}.shared.global [$0], [$1], {size}, $2;",
                                   "r,l,r,~{memory}", side_effect=True)
                builder.call(asm, [dst, src_, n])
                return context.get_dummy_value()

            return sig, codegen

        return cp_async

    def _asm_statement(text: str):
        """An intrinsic of no arguments that emits one PTX statement (a memory clobber: the
        compiler moves no load or store across it)."""

        @intrinsic
        def statement(typingctx):
            def codegen(context, builder, signature, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                                   side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.void(), codegen

        return statement

    cp_async16 = _cp_async(16, "cg")  # 16 bytes, L2 only (.cg takes 16 bytes alone)
    cp_async4 = _cp_async(4, "ca")
    cp_async_commit = _asm_statement("cp.async.commit_group;")  # close this thread's group
    # wait until at most STAGES - 2 of this thread's groups are still in flight: the oldest landed
    cp_async_wait_stages = _asm_statement(f"cp.async.wait_group {max(STAGES - 2, 0)};")
    cp_async_wait_all = _asm_statement("cp.async.wait_all;")


# --- the tile ----------------------------------------------------------------------------------
@cuda.jit(device=True, inline=True)
def load_quad(a, at, row, col, n, wide, dst, j):
    """dst[4j : 4j + 4] = a[row, col : col + 4] (32-bit numbers), zeros past column ``n``.
    ``wide`` (a constant of the compiled kernel: every row 16-byte aligned): one 16-byte load
    of the words from flat offset ``at`` = row * n + col (``loads.load4_flat``), a quad being
    all inside or all outside; else one number at a time."""
    if wide:
        if col < n:
            dst[4 * j], dst[4 * j + 1], dst[4 * j + 2], dst[4 * j + 3] = load4_flat(a, at)
        else:
            dst[4 * j], dst[4 * j + 1], dst[4 * j + 2], dst[4 * j + 3] = 0, 0, 0, 0
    else:
        for u in range(QUAD):
            dst[4 * j + u] = a[row, col + u] if col + u < n else 0


@cuda.jit(device=True, inline=True)
def load_step(x, w2, rows, at, kt, wide, xa, wb):
    """Global memory -> registers, k step ``kt``: A_LOADS quads of fp32 activations into ``xa``
    (A_VALUES,) and B_LOADS quads of fp16 weight pairs into ``wb`` (B_WORDS,). A_QUADS
    consecutive threads read one activation row, B_QUADS one weight row: coalesced, 16 bytes a
    thread. ``rows`` (A_LOADS + B_LOADS,): the x row, then the w row, of each of this thread's
    loads; ``at``: their flat offsets at k step 0 (``tc_matmul``), so that a step's address is
    one addition away."""
    tid = cuda.threadIdx.x
    k = kt * BK + QUAD * (tid % A_QUADS)  # this thread's first activation column
    for j in range(A_LOADS):
        load_quad(x, at[j] + uint32(kt * BK), rows[j], k, x.shape[1], wide, xa, j)
    kw = kt * KP + QUAD * (tid % B_QUADS)  # and its first weight word (pair) column
    for j in range(B_LOADS):
        load_quad(w2, at[A_LOADS + j] + uint32(kt * KP), rows[A_LOADS + j], kw, w2.shape[1], wide,
                  wb, j)


@cuda.jit(device=True, inline=True)
def norm_weights(norm_w, k, wide):
    """The RMSNorm weights of inputs k .. k + 3; 1 without a norm (an empty ``norm_w``) or past
    I. ``wide``: k is a multiple of 4 and I of 8, so the four are all inside or all outside."""
    if norm_w.shape[0] == 0:
        return float32(1), float32(1), float32(1), float32(1)
    if wide:
        if k < norm_w.shape[0]:
            return load4_flat(norm_w, k)
        return float32(1), float32(1), float32(1), float32(1)
    g = cuda.local.array(QUAD, float32)
    for u in range(QUAD):
        g[u] = norm_w[k + u] if k + u < norm_w.shape[0] else float32(1)
    return g[0], g[1], g[2], g[3]


@cuda.jit(device=True, inline=True)
def store_step(xa, wb, norm_w, kt, wide, a_tile, b_tile, buf):
    """Registers -> shared buffer ``buf``: activations times the norm weight, rounded to fp16
    pairs (2 words a quad); weights as they are (4 words a quad). The shared tiles are flat:
    word (buf, row, col) at ``(buf * rows + row) * STRIDE + col``, indexed by unsigned offsets
    (``mma_step`` says why)."""
    tid = cuda.threadIdx.x
    qa = tid % A_QUADS
    g0, g1, g2, g3 = norm_weights(norm_w, kt * BK + QUAD * qa, wide)
    a_at = uint32((buf * BM + tid // A_QUADS) * STRIDE + 2 * qa)  # row tid // A_QUADS, word 2 qa
    for j in range(A_LOADS):
        at = a_at + uint32(j * A_ROWS * STRIDE)
        a_tile[at] = pack_half2(xa[QUAD * j] * g0, xa[QUAD * j + 1] * g1)
        a_tile[at + uint32(1)] = pack_half2(xa[QUAD * j + 2] * g2, xa[QUAD * j + 3] * g3)
    b_at = uint32((buf * BN + tid // B_QUADS) * STRIDE + QUAD * (tid % B_QUADS))
    for j in range(B_LOADS):
        at = b_at + uint32(j * B_ROWS * STRIDE)
        for u in range(QUAD):
            b_tile[at + uint32(u)] = wb[QUAD * j + u]


@cuda.jit(device=True, inline=True)
def mma_k16(a_tile, b_tile, a_at, b_at, acc, afrag, bfrag):
    """One 16-wide k slice of the warp tile: the A fragments of its MI row tiles and the B
    fragments of its NI column tiles from shared memory, one ``ldmatrix_x4`` for each row tile
    (a0..a3) and each pair of column tiles (b0, b1 of both), then MI x NI mma into the
    accumulators ``acc`` (MI, NI, 4). ``a_at``, ``b_at``: this lane's row of the first row tile
    and column-tile pair (``mma_step``)."""
    for mi in range(MI):
        afrag[mi, 0], afrag[mi, 1], afrag[mi, 2], afrag[mi, 3] = ldmatrix_x4(
            a_tile, a_at + uint32(mi * 16 * STRIDE))
    b_fragments_and_mma(b_tile, b_at, acc, afrag, bfrag)


@cuda.jit(device=True, inline=True)
def b_fragments_and_mma(b_tile, b_at, acc, afrag, bfrag):
    """The rest of a k slice once the A fragments are in ``afrag``: the B fragments of the NI
    column tiles, one ``ldmatrix_x4`` a pair (this lane's row at ``b_at``), then MI x NI mma."""
    for pair in range(NI // 2):
        bfrag[2 * pair, 0], bfrag[2 * pair, 1], bfrag[2 * pair + 1, 0], bfrag[2 * pair + 1, 1] = (
            ldmatrix_x4(b_tile, b_at + uint32(pair * 16 * STRIDE)))
    for mi in range(MI):
        for ni in range(NI):
            d = mma_m16n8k16(afrag[mi, 0], afrag[mi, 1], afrag[mi, 2], afrag[mi, 3],
                             bfrag[ni, 0], bfrag[ni, 1],
                             acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3])
            acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3] = d


@cuda.jit(device=True, inline=True)
def mma_step(a_tile, b_tile, buf, acc, afrag, bfrag):
    """The warp's share of one k step: ``mma_k16`` for each 16-wide k slice of the buffer.

    ``ldmatrix_x4`` takes, from lane l, the row of matrix i = l // 8 it reads, r = l % 8. For a
    row tile the four matrices are a0 (rows 0-7, k 0-7), a1 (rows 8-15), a2 (rows 0-7, k 8-15)
    and a3; for a pair of column tiles b0, b1 of the first (rows = outputs 0-7, k 0-7 then
    8-15) and b0, b1 of the second (outputs 8-15).

    Every shared-memory word is found from one offset computed here plus constants, and the
    offsets are unsigned: a signed index makes Numba check it for a negative value (Python's
    ``a[-1]``) at every access, and with 3-d indices and a rolled k loop the GPU spent more
    instructions on integer arithmetic than on loads and ``mma`` (SASS of this kernel for sm_90:
    ~50 integer instructions for each 8 ``HMMA``). The slices are written out, with constant
    offsets, rather than left to a loop that LLVM did not unroll."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    i, r = lane // 8, lane % 8  # the matrix this lane addresses for ldmatrix, and its row
    m0 = (warp // WARPS_N) * WM  # the warp tile's first row and column in the block tile
    n0 = (warp % WARPS_N) * WN
    a_at = uint32((buf * BM + m0 + (i % 2) * 8 + r) * STRIDE + (i // 2) * 4)
    b_at = uint32((buf * BN + n0 + (i // 2) * 8 + r) * STRIDE + (i % 2) * 4)
    mma_k16(a_tile, b_tile, a_at, b_at, acc, afrag, bfrag)  # pairs 0..7 = k 0..15
    mma_k16(a_tile, b_tile, a_at + uint32(8), b_at + uint32(8), acc, afrag, bfrag)
    if KP > 16:  # (a constant: 2 slices in the simulator's k step of 32, 4 on a GPU's 64)
        mma_k16(a_tile, b_tile, a_at + uint32(16), b_at + uint32(16), acc, afrag, bfrag)
        mma_k16(a_tile, b_tile, a_at + uint32(24), b_at + uint32(24), acc, afrag, bfrag)


@cuda.jit(device=True, inline=True)
def plus_bias(y, bias, o):
    """y + bias[o], or y when there is no bias (an empty ``bias``)."""
    return y + bias[o] if bias.shape[0] > 0 else y


@cuda.jit(device=True, inline=True)
def store_output(out, r, o, y, bias, accumulate):
    """The epilogue for one element: add the bias, add onto ``out`` (the residual) or replace it;
    nothing past the last column (a tile overhangs an O that is not a multiple of its width)."""
    if o < out.shape[1]:
        y = plus_bias(y, bias, o)
        if accumulate:
            y += out[r, o]
        out[r, o] = y


@cuda.jit(device=True, inline=True)
def add_rows(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, shared, full):
    """Each lane's accumulators onto ``out``: c0, c1 at row g, columns 2t, 2t+1 of every mma
    tile, c2, c3 at row g + 8; with a norm each row scaled by its ``row_scale`` (1 / rms);
    nothing past the last row, or column unless the tile is ``full``. Where other blocks add
    their part of k to the same elements (``shared``: the k range is split) an atomic add onto
    what ``tc_prologue`` put there (the bias, the residual, zeros). Otherwise this block owns the
    elements and writes them whole — the bias added here, and with ``accumulate`` the residual
    already in ``out`` — in three passes: scale and bias, then *every* load of the residual, then
    every store. Interleaved (``out[r, o] += y`` element after element) each load had to wait for
    the store before it (the compiler cannot tell that the addresses differ): 32 round trips to
    memory one after another a lane, where batched they overlap as one.
    The caller passes ``shared`` and ``full`` as constants (``add_tile``): straight-line code for
    each case, where tests on every element made the epilogue as long as the rest of the kernel.
    Column indices are unsigned (no check for Python's negative ones: ``mma_step``)."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    g, t = lane // 4, lane % 4
    m0 = (warp // WARPS_N) * WM
    n0 = (warp % WARPS_N) * WN
    R, O = out.shape
    for mi in range(MI):
        for half in range(2):  # rows g (c0, c1) and g + 8 (c2, c3)
            r = r0 + m0 + mi * 16 + half * 8 + g
            if r < R:
                scale = row_scale[r] if norm_w.shape[0] > 0 else float32(1)
                for ni in range(NI):
                    for c in range(2):
                        o = uint32(o0 + n0 + ni * 8 + 2 * t + c)
                        y = acc[mi, ni, 2 * half + c] * scale
                        if shared:
                            if full or o < O:
                                cuda.atomic.add(out[r], o, y)
                        elif full or o < O:
                            acc[mi, ni, 2 * half + c] = plus_bias(y, bias, o)
    if shared:
        return
    if accumulate:  # the residual: every load issued before any store
        whole_tile_pass(out, r0, o0, acc, True, full)
    whole_tile_pass(out, r0, o0, acc, False, full)


@cuda.jit(device=True, inline=True)
def whole_tile_pass(out, r0, o0, acc, load, full):
    """One pass over this lane's outputs of a tile its block writes whole: with ``load`` (a
    constant) each accumulator gets the residual already in ``out`` added, else it is stored
    into ``out``; nothing past the last row, or column unless the tile is ``full``."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    g, t = lane // 4, lane % 4
    m0, n0 = (warp // WARPS_N) * WM, (warp % WARPS_N) * WN
    R, O = out.shape
    for mi in range(MI):
        for half in range(2):
            r = r0 + m0 + mi * 16 + half * 8 + g
            if r < R:
                for ni in range(NI):
                    for c in range(2):
                        o = uint32(o0 + n0 + ni * 8 + 2 * t + c)
                        if full or o < O:
                            if load:
                                acc[mi, ni, 2 * half + c] += out[r, o]
                            else:
                                out[r, o] = acc[mi, ni, 2 * half + c]


@cuda.jit(device=True, inline=True)
def add_tile(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, shared):
    """``add_rows`` for the tile at (r0, o0), with its two flags made constants."""
    if o0 + BN <= out.shape[1]:  # every column of the tile exists (all but an odd O's last)
        if shared:
            add_rows(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, True, True)
        else:
            add_rows(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, False, True)
    elif shared:
        add_rows(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, True, False)
    else:
        add_rows(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, False, False)


def tile_counts(R, O, I, steps_per_split):
    """(row tiles, tiles, k steps, splits of the k steps) of ``out (R, O)`` over I inputs: the
    work items are tiles x splits (``tc_work_items``)."""
    m_tiles = (R + BM - 1) // BM
    k_steps = (I + BK - 1) // BK
    return (m_tiles, m_tiles * ((O + BN - 1) // BN), k_steps,
            (k_steps + steps_per_split - 1) // steps_per_split)


tile_counts_device = cuda.jit(device=True)(tile_counts)


@cuda.jit(device=True, inline=True)
def work_item(item, tiles, m_tiles, steps_per_split, k_steps):
    """(r0, o0, k_first, k_end): the first row and column of work item ``item``'s tile and its
    range of k steps. Consecutive items share a weight tile: blocks running together read it
    from HBM once."""
    tile, split = item % tiles, item // tiles
    k_first = split * steps_per_split
    return ((tile % m_tiles) * BM, (tile // m_tiles) * BN, k_first,
            min(k_steps, k_first + steps_per_split))


@cuda.jit(device=True, inline=True)
def start_item(x_rows, I, O, r0, o0, rows, at, acc):
    """Before a work item's first k step: this thread's loads — ``rows`` (LOADS,) the x row,
    then the w row, of each; ``at`` their flat offsets at k step 0, so that a step's address is
    one addition away — and zero accumulators ``acc`` (MI, NI, 4). A row past R or O reads a
    real one instead (its outputs are never stored): no test on the way, and only the column is
    checked, once a step."""
    tid = cuda.threadIdx.x
    R = x_rows.shape[0]
    for j in range(A_LOADS):
        rows[j] = x_rows[min(r0 + tid // A_QUADS + j * A_ROWS, R - 1)]
        at[j] = uint32(rows[j] * I + QUAD * (tid % A_QUADS))
    for j in range(B_LOADS):
        rows[A_LOADS + j] = min(o0 + tid // B_QUADS + j * B_ROWS, O - 1)
        at[A_LOADS + j] = uint32(rows[A_LOADS + j] * (I // 2) + QUAD * (tid % B_QUADS))
    for mi in range(MI):
        for ni in range(NI):
            for q in range(4):
                acc[mi, ni, q] = 0


@cuda.jit(device=True, inline=True)
def tc_matmul(x, x_rows, norm_w, w, bias, row_scale, out, accumulate, steps_per_split, wide,
              block, n_blocks):
    """out (R, O) (+)= rms_norm?(x[x_rows]) @ w.T + bias, on tensor cores, work items ``block``,
    ``block + n_blocks``, ... of ``tc_work_items(R, O, I, steps_per_split)``; ``row_scale`` (R,)
    holds each row's 1 / rms (``tc_prologue``). When the k range is split, ``out`` holds what
    the prologue put there (the bias, the residual, zeros) and the splits add onto it; when it
    is not, each block writes its tile whole (``add_rows``).
    x (T, I) f32; x_rows (R,) i32; norm_w (I,) f32 or (0,); w (O, I) f16, I even; bias (O,) f32
    or (0,); ``wide``: I % 8 == 0, every row 16-byte aligned (a constant of each build of
    ``tc_matmul_kernel``). A work item is one BM x BN tile of ``out`` over ``steps_per_split``
    k steps of BK. Every thread of the block must call it."""
    R = x_rows.shape[0]
    O, I = w.shape
    w2 = fp16_pairs(w)  # (O, I // 2) uint32: word j of row o = w[o, 2j] (low half), w[o, 2j+1]
    a_tile = cuda.shared.array(A_TILE, uint32)  # (2 x BM x STRIDE,) fp16 pairs of activations
    b_tile = cuda.shared.array(B_TILE, uint32)  # (2 x BN x STRIDE,) fp16 pairs of weights
    acc = cuda.local.array(ACC_SHAPE, float32)  # (MI, NI, 4) this lane's outputs
    afrag = cuda.local.array(A_FRAG, uint32)  # (MI, 4)
    bfrag = cuda.local.array(B_FRAG, uint32)  # (NI, 2)
    xa = cuda.local.array(A_VALUES, float32)  # (A_VALUES,) staged activations
    wb = cuda.local.array(B_WORDS, uint32)  # (B_WORDS,) staged weight pairs
    rows = cuda.local.array(LOADS, int32)  # (A_LOADS + B_LOADS,) the row of each load
    at = cuda.local.array(LOADS, uint32)  # (A_LOADS + B_LOADS,) its flat offset at k step 0
    m_tiles, tiles, k_steps, splits = tile_counts_device(R, O, I, steps_per_split)
    for item in range(block, tiles * splits, n_blocks):
        r0, o0, k_first, k_end = work_item(item, tiles, m_tiles, steps_per_split, k_steps)
        start_item(x_rows, I, O, r0, o0, rows, at, acc)
        load_step(x, w2, rows, at, k_first, wide, xa, wb)
        store_step(xa, wb, norm_w, k_first, wide, a_tile, b_tile, 0)
        cuda.syncthreads()
        for kt in range(k_first, k_end):
            buf = (kt - k_first) % 2
            if kt + 1 < k_end:  # issue the next step's loads before this step's math
                load_step(x, w2, rows, at, kt + 1, wide, xa, wb)
            mma_step(a_tile, b_tile, buf, acc, afrag, bfrag)
            if kt + 1 < k_end:  # the other buffer: nobody reads it during this step
                store_step(xa, wb, norm_w, kt + 1, wide, a_tile, b_tile, 1 - buf)
            cuda.syncthreads()
        add_tile(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, splits > 1)


# --- the pipelined tile (BLINK_EDU_TILE_STAGES=3: an experiment, measured slower) ---------------
# ``tc_matmul`` has one k step of loads in flight: it issues step k + 1's loads into registers,
# multiplies step k, then waits for them to land, converts and stores them, and meets the block
# at a barrier. Measured on the H200 its blocks take ~2.5 µs a k step at 512 tokens, and bigger
# block tiles were slower (``tc_matmul_tile_variants_h200_19410e8.json``). Here the loads are
# ``cp.async``: the memory system copies global memory into shared memory by itself, no registers
# on the way, and a thread only waits when it needs a step. With STAGES buffers, the copies of the
# next STAGES - 1 k steps are in flight while one is multiplied. The activations land as float32
# and become fp16 fragments as each warp reads them (times the RMSNorm weight), where
# ``tc_matmul`` converted them once on their way into shared memory. Measured (one H200 call,
# Nsight Compute): the memory stalls went (long_scoreboard 2.4 -> 0.8 cycles an instruction) and
# the instructions nearly doubled, so the kernel got slower (23.5 -> 28.5 µs, 512-token gate/up).


@cuda.jit(device=True, inline=True)
def copy_quad(tile, at, src, src_at, col, n, wide):
    """Start copying words ``src_at .. + 3`` of ``src`` (flat; columns ``col .. col + 3`` of a row
    of ``n``) to ``tile[at .. at + 3]``; zeros past column ``n``. ``wide``: one 16-byte copy, the
    quad all inside or all outside; else a word at a time."""
    if wide:
        cp_async16(tile, at, src, src_at, 16 if col < n else 0)
    else:
        for u in range(QUAD):
            cp_async4(tile, at + uint32(u), src, src_at + uint32(u), 4 if col + u < n else 0)


@cuda.jit(device=True, inline=True)
def issue_step(x, w2, at, kt, wide, a32, b_tile, stage):
    """Start the copies of k step ``kt`` into buffer ``stage``: this thread's A_LOADS quads of fp32
    activations (rows as ``load_step`` reads them) and B_LOADS quads of fp16 weight pairs."""
    tid = cuda.threadIdx.x
    qa, qb = tid % A_QUADS, tid % B_QUADS
    a_at = uint32((stage * BM + tid // A_QUADS) * A32_STRIDE + QUAD * qa)
    for j in range(A_LOADS):
        copy_quad(a32, a_at + uint32(j * A_ROWS * A32_STRIDE), x, at[j] + uint32(kt * BK),
                  kt * BK + QUAD * qa, x.shape[1], wide)
    b_at = uint32((stage * BN + tid // B_QUADS) * STRIDE + QUAD * qb)
    for j in range(B_LOADS):
        copy_quad(b_tile, b_at + uint32(j * B_ROWS * STRIDE), w2,
                  at[A_LOADS + j] + uint32(kt * KP), kt * KP + QUAD * qb, w2.shape[1], wide)


@cuda.jit(device=True, inline=True)
def norm_at(norm_w, k):
    """The RMSNorm weight of input k; 1 without a norm or past I."""
    return norm_w[k] if k < norm_w.shape[0] else float32(1)


@cuda.jit(device=True, inline=True)
def mma_step_fp32(a32, b_tile, stage, kt, norm_w, acc, afrag, bfrag):
    """The warp's share of k step ``kt`` from buffer ``stage``: for each 16-wide k slice, the A
    fragments built from the float32 activations (lane (g, t): rows g, g + 8, k pairs 2t and
    2t + 8, times their norm weights, rounded to fp16 pairs), the B fragments by ``ldmatrix_x4``,
    then MI x NI mma."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    g, t = lane // 4, lane % 4
    i, r = lane // 8, lane % 8
    m0, n0 = (warp // WARPS_N) * WM, (warp % WARPS_N) * WN
    a_at = uint32((stage * BM + m0 + g) * A32_STRIDE + 2 * t)
    b_at = uint32((stage * BN + n0 + (i // 2) * 8 + r) * STRIDE + (i % 2) * 4)
    for ks in range(BK // 16):
        k = kt * BK + ks * 16 + 2 * t
        g0, g1 = norm_at(norm_w, k), norm_at(norm_w, k + 1)
        g2, g3 = norm_at(norm_w, k + 8), norm_at(norm_w, k + 9)
        for mi in range(MI):
            row_g = a_at + uint32(mi * 16 * A32_STRIDE + ks * 16)  # row g, k pair t
            row_g8 = row_g + uint32(8 * A32_STRIDE)  # row g + 8
            afrag[mi, 0] = pack_half2(a32[row_g] * g0, a32[row_g + uint32(1)] * g1)
            afrag[mi, 1] = pack_half2(a32[row_g8] * g0, a32[row_g8 + uint32(1)] * g1)
            afrag[mi, 2] = pack_half2(a32[row_g + uint32(8)] * g2, a32[row_g + uint32(9)] * g3)
            afrag[mi, 3] = pack_half2(a32[row_g8 + uint32(8)] * g2, a32[row_g8 + uint32(9)] * g3)
        b_fragments_and_mma(b_tile, b_at + uint32(ks * 8), acc, afrag, bfrag)


@cuda.jit(device=True, inline=True)
def tc_matmul_pipelined(x, x_rows, norm_w, w, bias, row_scale, out, accumulate, steps_per_split,
                        wide, block, n_blocks):
    """``tc_matmul``'s contract and work items, its k steps copied by ``cp.async`` into STAGES
    shared buffers (the section above). Every thread of the block must call it."""
    R = x_rows.shape[0]
    O, I = w.shape
    w2 = fp16_pairs(w)  # (O, I // 2) uint32
    a32 = cuda.shared.array(A32_TILE, float32)  # (STAGES x BM x A32_STRIDE,) activations
    b_tile = cuda.shared.array(B_STAGES_TILE, uint32)  # (STAGES x BN x STRIDE,) weight pairs
    acc = cuda.local.array(ACC_SHAPE, float32)  # (MI, NI, 4) this lane's outputs
    afrag = cuda.local.array(A_FRAG, uint32)  # (MI, 4)
    bfrag = cuda.local.array(B_FRAG, uint32)  # (NI, 2)
    rows = cuda.local.array(LOADS, int32)  # (A_LOADS + B_LOADS,) the row of each copy
    at = cuda.local.array(LOADS, uint32)  # (A_LOADS + B_LOADS,) its flat offset at k step 0
    m_tiles, tiles, k_steps, splits = tile_counts_device(R, O, I, steps_per_split)
    for item in range(block, tiles * splits, n_blocks):
        r0, o0, k_first, k_end = work_item(item, tiles, m_tiles, steps_per_split, k_steps)
        start_item(x_rows, I, O, r0, o0, rows, at, acc)
        for s in range(STAGES - 1):  # the first steps' copies, one group each (empty past k_end)
            if k_first + s < k_end:
                issue_step(x, w2, at, k_first + s, wide, a32, b_tile, s)
            cp_async_commit()
        for kt in range(k_first, k_end):
            step = kt - k_first
            cp_async_wait_stages()  # this thread's copies of step kt have landed ...
            cuda.syncthreads()  # ... every thread's; and step kt - 1's buffer is free again
            if kt + STAGES - 1 < k_end:
                issue_step(x, w2, at, kt + STAGES - 1, wide, a32, b_tile,
                           (step + STAGES - 1) % STAGES)
            cp_async_commit()
            mma_step_fp32(a32, b_tile, step % STAGES, kt, norm_w, acc, afrag, bfrag)
        cp_async_wait_all()
        cuda.syncthreads()  # every warp is done with the buffers before the next item fills them
        add_tile(out, r0, o0, acc, norm_w, row_scale, bias, accumulate, splits > 1)


@cuda.jit(device=True, inline=True)
def tc_prologue(x, x_rows, norm_w, eps, bias, out, accumulate, split, row_scale, block,
                n_blocks):
    """What the tile needs before it starts, one row r of R a work item:
    ``row_scale[r] = 1 / rms(x[x_rows[r]])`` with a norm, and, when the tile's k range is
    ``split`` (its partial sums are added onto ``out``), ``out[r, :] = (out[r, :] if accumulate
    else 0) + bias`` (left alone when that changes nothing)."""
    tid = cuda.threadIdx.x
    I, O = x.shape[1], out.shape[1]
    scratch = cuda.shared.array(OP_THREADS, float32)
    for r in range(block, x_rows.shape[0], n_blocks):
        if norm_w.shape[0] > 0:  # the same for the whole block
            squares = float32(0)
            for i in range(tid, I, OP_THREADS):
                xi = x[x_rows[r], i]
                squares += xi * xi
            total = block_sum(squares, scratch)
            if tid == 0:
                row_scale[r] = float32(1) / math.sqrt(total / I + eps)
        if split and (bias.shape[0] > 0 or not accumulate):
            for o in range(tid, O, OP_THREADS):  # the other paths' epilogue, of a zero product
                store_output(out, r, o, float32(0), bias, accumulate)


@cuda.jit
def tc_prologue_kernel(x, x_rows, norm_w, eps, bias, out, accumulate, split, row_scale):
    """``tc_prologue`` as a kernel: launch ``[grid_for(R), reduce.THREADS]``."""
    tc_prologue(x, x_rows, norm_w, eps, bias, out, accumulate, split, row_scale,
                cuda.blockIdx.x, cuda.gridDim.x)


def tile_kernel(aligned: bool):
    """``tc_matmul`` as a kernel for ``aligned`` operands or not (``loads.ByAlignment``)."""

    @cuda.jit
    def tc_matmul_kernel(x, x_rows, norm_w, w, bias, row_scale, out, accumulate, steps_per_split):
        if STAGES > 1:  # (a constant: one of the two is compiled)
            tc_matmul_pipelined(x, x_rows, norm_w, w, bias, row_scale, out, accumulate,
                                steps_per_split, aligned and loads.WIDE_LOADS, cuda.blockIdx.x,
                                cuda.gridDim.x)
        else:
            tc_matmul(x, x_rows, norm_w, w, bias, row_scale, out, accumulate, steps_per_split,
                      aligned and loads.WIDE_LOADS, cuda.blockIdx.x, cuda.gridDim.x)

    return tc_matmul_kernel  # (its own name: Nsight Compute's -k filters on it)


# Launch ``[grid_for(tc_work_items(R, O, I, steps)), THREADS]``; one build for I % 8 == 0, one for
# the rest, picked from w's in_features.
tc_matmul_kernel = ByAlignment(tile_kernel, lambda x, x_rows, norm_w, w, *rest: w.shape[1])


def tc_work_items(R: int, O: int, I: int, steps_per_split: int) -> int:
    """Work items of ``tc_matmul``: BM x BN tiles of ``out``, times the splits of its k steps."""
    _, tiles, _, splits = tile_counts(R, O, I, steps_per_split)
    return tiles * splits


# Fewest k steps a work item takes when the k range is split (measured on the H200:
# ``tools/tc_matmul_probe.py``).
MIN_STEPS_PER_SPLIT = 2


def tc_steps_per_split(R: int, O: int, I: int, num_sms: int) -> int:
    """How many k steps each work item takes: all of them when the tiles alone fill the GPU's
    ``num_sms`` multiprocessors; otherwise the k range is split among more blocks (split-K), so
    that a decode batch's few tiles do not leave most of the GPU idle while each block walks k
    one memory latency a step — but never below MIN_STEPS_PER_SPLIT, since every split adds its
    whole tile to ``out`` with atomics."""
    _, tiles, k_steps, _ = tile_counts(R, O, I, 1)
    splits = max(1, min(k_steps, -(-num_sms // tiles)))
    return max(min(k_steps, MIN_STEPS_PER_SPLIT), -(-k_steps // splits))


def is_split(I: int, steps_per_split: int) -> bool:
    """Whether the k range is split among blocks (their partial tiles added onto ``out``)."""
    return tile_counts(1, 1, I, steps_per_split)[3] > 1


def needs_prologue(norm_w, bias, accumulate, split) -> bool:
    """Whether ``tc_prologue`` has anything to do: a norm, or for a split k range a bias or an
    ``out`` to overwrite (an unsplit tile writes its outputs whole)."""
    return norm_w.shape[0] > 0 or (split and (bias.shape[0] > 0 or not accumulate))


def launch_tc_linear(x, x_rows, norm_w, eps, w, bias, out, accumulate, row_scale, stream=0,
                     num_sms: int = 1, steps_per_split: int | None = None) -> None:
    """out (R, O) (+)= rms_norm?(x[x_rows]) @ w.T + bias on tensor cores: the prologue (if it has
    work) and the tile, two launches on ``stream``. ``row_scale`` (>= R,) f32 device scratch."""
    R, (O, I) = x_rows.shape[0], w.shape
    steps = steps_per_split or tc_steps_per_split(R, O, I, num_sms)
    split = is_split(I, steps)
    if needs_prologue(norm_w, bias, accumulate, split):
        tc_prologue_kernel[grid_for(R), OP_THREADS, stream](x, x_rows, norm_w, eps, bias, out,
                                                        accumulate, split, row_scale)
    tc_matmul_kernel[grid_for(tc_work_items(R, O, I, steps)), THREADS, stream](
        x, x_rows, norm_w, w, bias, row_scale, out, accumulate, steps)


def require_tc_operands(x_rows, w, out) -> None:
    """Raise ``ValueError`` before a launch for operands the tile cannot take (NumPy, CuPy or
    Numba arrays): w (O, I) must be C-contiguous float16 with I even, out (R, O)."""
    (O, I), R = w.shape, x_rows.shape[0]
    if w.dtype != np.float16:
        raise ValueError(f"tc_matmul takes float16 weights, got {w.dtype}")
    if I % 2:
        raise ValueError(f"tc_matmul reads weights as fp16 pairs: in_features must be even, got {I}")
    if w.strides != (I * 2, 2):
        raise ValueError(f"tc_matmul needs C-contiguous weights, got strides {w.strides}")
    if tuple(out.shape) != (R, O):
        raise ValueError(f"out must be (R, O) = {(R, O)}, got {tuple(out.shape)}")
