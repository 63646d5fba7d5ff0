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
there (``accumulate=1``), and each token's ``1 / rms`` for the RMSNorm put in ``row_scale`` — no
block of a split sees a whole row. Where it is not split, there is no prologue: each block adds up
the squares of the activations it stages anyway into shared memory (``store_step``), one
thread a row sums them at the end (``tile_inv_rms``), and the block writes its tile whole — bias and residual added
in its epilogue, every load of the residual issued before the first store (``add_rows``). The
norm is folded in as in the ``linear`` kernels: ``rms_norm(x) @ W.T = inv_rms(x) * ((x * g) @
W.T)`` — the norm weight ``g`` scales the activations as they are staged, ``1 / rms`` each row
of the tile as it is written. The activations are rounded to fp16 after the norm weight and
before ``1 / rms``: ``|x * g|`` must stay below fp16's largest value, 65504 (a residual stream
is far below it). ``launch_tc_linear`` makes the launches.

**SwiGLU in the epilogue.** The MLP's gate/up projection is followed by ``silu(gate) * up``, an
element-wise op that would cost a launch and a round trip of ``(R, 2F)`` through memory. If
``gate[:, j]`` and ``up[:, j]`` end up in the same lane's registers, the tile can apply it before
it stores anything. The ``mma`` layout makes that cheap: a lane holds the same positions of every
n tile of its warp, so the tile's columns are *relabelled* — 8 gate rows of ``[W_gate; W_up]``,
then the same 8 up rows, and so on (``gate_up_row``: only the weight rows a thread loads
change) — and n tiles 2q and 2q + 1 of a warp hold the gate and the up of the same ``j`` in the
same accumulator slots (``swiglu_rows``). SwiGLU needs whole sums, so this tile never splits its
k range: ``launch_tc_swiglu``, one launch for what was a prologue, a tile and a SwiGLU kernel.

**RoPE and the KV write in the epilogue.** The same relabelling serves the qkv projection of a
prompt chunk: each group of 16 columns of a head is 8 rotation pairs' first elements ``i``, then
their partners ``i + E/2`` (``rope_row``), so a lane holds both of a pair and rotates q and k,
and places q in ``qkv`` and k and v in the paged pool itself (``rope.place_pair``, as the decode
kernels do; ``rope_rows``): ``launch_tc_qkv_rope``, one launch for a prologue, a tile and the
RoPE kernel.

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
from typing import NamedTuple

import numpy as np
from numba import float32, int32, uint32

from . import loads
from .loads import ByAlignment, load4_flat
from .elementwise import silu_times
from .reduce import SIMULATOR, THREADS, WARP, block_sum, cuda, divmod32, grid_for
from .rope import pair_target, place_pair
from .reduce import THREADS as OP_THREADS  # the prologue's block: the reductions' size

# --- tile geometry ---------------------------------------------------------------------------
MI, NI = 2, 4  # mma tiles per warp: MI along m (16 rows each), NI along n (8 columns each)
WM, WN = 16 * MI, 8 * NI  # warp tile: 32 x 32
ACC_SHAPE = (MI, NI, 4)  # each lane's accumulators: c0..c3 of every mma tile of its warp tile
A_FRAG = (MI, 4)  # a0..a3 for each of the MI row tiles
B_FRAG = (NI, 2)  # b0, b1 for each of the NI column tiles
QUAD = 4  # 32-bit words one 16-byte load brings: 4 fp32 activations, or 4 fp16 weight pairs
SWIGLU_GROUP = 8  # gate/up with SwiGLU: columns alternate, 8 of the gate, the same 8 of the up
ROPE_GROUP = SWIGLU_GROUP  # qkv with RoPE: 8 pairs' first elements, then their 8 partners
# What the tile does with its sums — and so which weight row each of its columns reads
# (``column_row``): add them to ``out``, apply SwiGLU, or rotate and place q, k and v.
EPILOGUE_ADD, EPILOGUE_SWIGLU, EPILOGUE_ROPE = 0, 1, 2


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
    # (mma_step writes out the 16-wide k slices of a step: 2 or 4; a thread a row adds up the
    # norm's squares; a warp's columns are whole gate/up groups of 16 for the SwiGLU epilogue)
    assert threads % a_quads == 0 and bm % a_rows == 0 and bn % b_rows == 0 and kp in (16, 32)
    assert bm <= threads and WN % (2 * SWIGLU_GROUP) == 0
    return TileGeometry(threads, warps, warps_m, warps // warps_m, bm, bn, bk, kp, stride,
                        a_quads, a_rows, bm // a_rows, b_quads, b_rows, bn // b_rows,
                        2 * bm * stride, 2 * bn * stride, (warps, WARP, 6), (warps, WARP))


# k per shared-memory step: 64 on a GPU (a thread then has 8 + 4 sixteen-byte loads in flight a
# step), 32 in the simulator, so that tests with a small I still cross several steps and both
# buffers.
GEOMETRY = tile_geometry(THREADS, 32 if SIMULATOR else 64)
# Numba reads module globals as compile-time constants (and global tuples as array shapes).
(THREADS, WARPS, WARPS_M, WARPS_N, BM, BN, BK, KP, STRIDE, A_QUADS, A_ROWS, A_LOADS, B_QUADS,
 B_ROWS, B_LOADS, A_TILE, B_TILE, REGS_SHAPE, ROWS_SHAPE) = GEOMETRY
A_VALUES, B_WORDS = QUAD * A_LOADS, QUAD * B_LOADS  # registers a thread stages per k step
LOADS = A_LOADS + B_LOADS  # 16-byte loads a thread issues per k step
SQ_SHAPE = (BM, A_QUADS)  # each staging thread's sum of squares of its share of a row (norm)

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
def store_step(xa, wb, norm_w, kt, wide, a_tile, b_tile, buf, squares, row_sq):
    """Registers -> shared buffer ``buf``: activations times the norm weight, rounded to fp16
    pairs (2 words a quad); weights as they are (4 words a quad). The shared tiles are flat:
    word (buf, row, col) at ``(buf * rows + row) * STRIDE + col``, indexed by unsigned offsets
    (``mma_step`` says why). With ``squares`` (the norm's 1 / rms is the tile's to find) the
    activations' squares are added onto this thread's entries of ``row_sq`` (BM, A_QUADS)
    shared — there, not in registers: eight running sums held across the k loop cost the
    kernel 36 registers (202 against 166 for sm_90), a block of occupancy."""
    tid = cuda.threadIdx.x
    qa = tid % A_QUADS
    g0, g1, g2, g3 = norm_weights(norm_w, kt * BK + QUAD * qa, wide)
    a_at = uint32((buf * BM + tid // A_QUADS) * STRIDE + 2 * qa)  # row tid // A_QUADS, word 2 qa
    for j in range(A_LOADS):
        x0, x1, x2, x3 = xa[QUAD * j], xa[QUAD * j + 1], xa[QUAD * j + 2], xa[QUAD * j + 3]
        at = a_at + uint32(j * A_ROWS * STRIDE)
        a_tile[at] = pack_half2(x0 * g0, x1 * g1)
        a_tile[at + uint32(1)] = pack_half2(x2 * g2, x3 * g3)
        if squares:
            row_sq[tid // A_QUADS + j * A_ROWS, qa] += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
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
def lane_outputs():
    """(g, t, m0, n0): this lane's group and place in it, and its warp tile's first row and
    column in the block tile. Its outputs are rows m0 + 16 mi + g (c0, c1) and + 8 (c2, c3),
    columns n0 + 8 ni + 2t (c0, c2) and + 1 (c1, c3) — the walk of every epilogue below."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    return lane // 4, lane % 4, (warp // WARPS_N) * WM, (warp % WARPS_N) * WN


@cuda.jit(device=True, inline=True)
def row_scale_of(norm_w, row_scale, inv_rms, r, tile_row, shared):
    """Row r's 1 / rms: 1 without a norm; the prologue's ``row_scale[r]`` where the k range is
    ``shared`` (split: no block sees all of a row); else the tile's ``inv_rms[tile_row]``."""
    if norm_w.shape[0] == 0:
        return float32(1)
    return row_scale[r] if shared else inv_rms[tile_row]


@cuda.jit(device=True, inline=True)
def add_rows(out, r0, o0, acc, norm_w, row_scale, inv_rms, bias, accumulate, shared, full):
    """Each lane's accumulators onto ``out``: c0, c1 at row g, columns 2t, 2t+1 of every mma
    tile, c2, c3 at row g + 8; with a norm each row scaled by its 1 / rms (``row_scale[r]`` from
    the prologue where k is split, else ``inv_rms``, the tile's own: ``tile_inv_rms``);
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
    g, t, m0, n0 = lane_outputs()
    R, O = out.shape
    for mi in range(MI):
        for half in range(2):  # rows g (c0, c1) and g + 8 (c2, c3)
            r = r0 + m0 + mi * 16 + half * 8 + g
            if r < R:
                scale = row_scale_of(norm_w, row_scale, inv_rms, r, r - r0, shared)
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
    g, t, m0, n0 = lane_outputs()
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
def add_tile(out, r0, o0, acc, norm_w, row_scale, inv_rms, bias, accumulate, shared):
    """``add_rows`` for the tile at (r0, o0), with its two flags made constants."""
    if o0 + BN <= out.shape[1]:  # every column of the tile exists (all but an odd O's last)
        if shared:
            add_rows(out, r0, o0, acc, norm_w, row_scale, inv_rms, bias, accumulate, True, True)
        else:
            add_rows(out, r0, o0, acc, norm_w, row_scale, inv_rms, bias, accumulate, False, True)
    elif shared:
        add_rows(out, r0, o0, acc, norm_w, row_scale, inv_rms, bias, accumulate, True, False)
    else:
        add_rows(out, r0, o0, acc, norm_w, row_scale, inv_rms, bias, accumulate, False, False)


@cuda.jit(device=True, inline=True)
def swiglu_rows(act, r0, o0, acc, norm_w, inv_rms, bias):
    """The SwiGLU epilogue: act[r, j] = silu(gate) * up for this lane's outputs. The tile's
    columns alternate (``gate_up_row``): 8 of the gate, then the same 8 of the up projection, so
    a warp's n tiles 2q and 2q + 1 hold the gate and the up of the same j in the same registers,
    and j = (o0 + n0) / 2 + 8q + 2t + c. Scaled by the tile's 1 / rms (the k range is never
    split here), plus the bias of each of the two rows of ``[W_gate; W_up]``; act (R, F)."""
    g, t, m0, n0 = lane_outputs()
    R, F = act.shape
    for mi in range(MI):
        for half in range(2):  # rows g (c0, c1) and g + 8 (c2, c3)
            r = r0 + m0 + mi * 16 + half * 8 + g
            if r < R:
                scale = inv_rms[r - r0] if norm_w.shape[0] > 0 else float32(1)
                for q in range(NI // 2):
                    for c in range(2):
                        j = uint32((o0 + n0) // 2 + q * SWIGLU_GROUP + 2 * t + c)
                        if j < F:
                            gate = plus_bias(acc[mi, 2 * q, 2 * half + c] * scale, bias, j)
                            up = plus_bias(acc[mi, 2 * q + 1, 2 * half + c] * scale, bias, F + j)
                            act[r, j] = silu_times(gate, up)


def swiglu_columns(F: int) -> int:
    """The tile's columns for gate/up with SwiGLU: F gate and F up rows in alternating groups of
    SWIGLU_GROUP, the last group padded."""
    return 2 * SWIGLU_GROUP * ((F + SWIGLU_GROUP - 1) // SWIGLU_GROUP)


swiglu_columns_device = cuda.jit(device=True, inline=True)(swiglu_columns)


@cuda.jit(device=True, inline=True)
def gate_up_row(col, F):
    """The row of ``[W_gate; W_up]`` (2F rows) behind column ``col`` of the SwiGLU tile: groups of
    SWIGLU_GROUP columns alternate gate, up, gate, up ...; a padding column reads a real row."""
    j = min((col // (2 * SWIGLU_GROUP)) * SWIGLU_GROUP + col % SWIGLU_GROUP, F - 1)
    return j + F if col % (2 * SWIGLU_GROUP) >= SWIGLU_GROUP else j


@cuda.jit(device=True, inline=True)
def rope_row(col, head_dim):
    """The row of w_qkv ((H + 2K) E rows) behind column ``col`` of the RoPE tile: a head's E
    columns are groups of 2 ROPE_GROUP, 8 rotation pairs' first elements i, then their partners
    i + E/2 (E a multiple of 16)."""
    head, within = col // head_dim, col % head_dim
    group, k = within // (2 * ROPE_GROUP), within % (2 * ROPE_GROUP)
    i = group * ROPE_GROUP + k % ROPE_GROUP
    return head * head_dim + i + (head_dim // 2 if k >= ROPE_GROUP else 0)


@cuda.jit(device=True, inline=True)
def rope_rows(qkv, r0, o0, acc, x_rows, norm_w, inv_rms, bias, positions, seq_rows, block_tables,
              cos, sin, kv_pool, layer, num_heads, num_kv_heads):
    """The RoPE epilogue: this lane's outputs are whole rotation pairs (``rope_row``): n tiles 2q
    and 2q + 1 of its warp hold elements i and i + E/2 of one head in the same accumulator
    slots, with i = 8 (group of 16 in the head) + 2t + c. Each row scaled by the tile's 1 / rms
    (the k range is never split here), the bias added, the pair placed by ``rope.place_pair``:
    q rotated into qkv (T, (H + 2K) E), k rotated and v as it is into the token's paged slot."""
    g, t, m0, n0 = lane_outputs()
    R, E = x_rows.shape[0], kv_pool.shape[5]
    half, heads = E // 2, num_heads + 2 * num_kv_heads
    for mi in range(MI):
        for pair_half in range(2):  # rows g (c0, c1) and g + 8 (c2, c3)
            r = r0 + m0 + mi * 16 + pair_half * 8 + g
            if r < R:
                token = x_rows[r]
                scale = inv_rms[r - r0] if norm_w.shape[0] > 0 else float32(1)
                for q in range(NI // 2):
                    head, within = divmod32(o0 + n0 + q * 2 * ROPE_GROUP, E)
                    if head < heads:  # (past the last head: a tile's overhang)
                        for c in range(2):
                            i = (within // (2 * ROPE_GROUP)) * ROPE_GROUP + 2 * t + c
                            target = pair_target(positions, seq_rows, block_tables, cos, sin,
                                                 token, i, kv_pool.shape[3])
                            x1 = plus_bias(acc[mi, 2 * q, 2 * pair_half + c] * scale, bias,
                                           head * E + i)
                            x2 = plus_bias(acc[mi, 2 * q + 1, 2 * pair_half + c] * scale, bias,
                                           head * E + i + half)
                            place_pair(qkv, token, head, i, x1, x2, target, kv_pool, layer,
                                       num_heads, num_kv_heads)


@cuda.jit(device=True, inline=True)
def tile_inv_rms(I, eps, row_sq, inv_rms):
    """The norm's 1 / rms of the tile's BM rows into ``inv_rms`` (BM,) shared, from the staging
    threads' sums of squares in ``row_sq`` (BM, A_QUADS) shared: A_QUADS threads stage a row,
    and one thread a row adds up their sums. (The last k step ended at a barrier: every sum is
    in.) Ends at a barrier: ``row_sq`` may be zeroed for the next item."""
    tid = cuda.threadIdx.x
    if tid < BM:
        total = float32(0)
        for q in range(A_QUADS):
            total += row_sq[tid, q]
        inv_rms[tid] = float32(1) / math.sqrt(total / I + eps)
    cuda.syncthreads()


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
def column_row(col, O, epilogue, head_dim):
    """The row of w (O, I) behind column ``col`` of the tile: itself, or for the SwiGLU and RoPE
    epilogues (``epilogue``, a constant) ``gate_up_row`` and ``rope_row``."""
    if epilogue == EPILOGUE_SWIGLU:
        return gate_up_row(col, O // 2)
    if epilogue == EPILOGUE_ROPE:
        return rope_row(col, head_dim)
    return col


@cuda.jit(device=True, inline=True)
def start_item(x_rows, I, N, O, r0, o0, rows, at, acc, row_sq, epilogue, head_dim):
    """Before a work item's first k step: this thread's loads — ``rows`` (LOADS,) the x row,
    then the w row, of each; ``at`` their flat offsets at k step 0, so that a step's address is
    one addition away — and zero accumulators ``acc`` (MI, NI, 4) and this thread's sums of
    squares in ``row_sq``.
    Column ``o`` of the tile's N reads row ``column_row(o)`` of w's O. A row past R or N reads a
    real one instead (its outputs are never stored): no test on the way, and only the column is
    checked, once a step."""
    tid = cuda.threadIdx.x
    R = x_rows.shape[0]
    for j in range(A_LOADS):
        rows[j] = x_rows[min(r0 + tid // A_QUADS + j * A_ROWS, R - 1)]
        at[j] = uint32(rows[j] * I + QUAD * (tid % A_QUADS))
        row_sq[tid // A_QUADS + j * A_ROWS, tid % A_QUADS] = 0
    for j in range(B_LOADS):
        o = min(o0 + tid // B_QUADS + j * B_ROWS, N - 1)
        rows[A_LOADS + j] = column_row(o, O, epilogue, head_dim)
        at[A_LOADS + j] = uint32(rows[A_LOADS + j] * (I // 2) + QUAD * (tid % B_QUADS))
    for mi in range(MI):
        for ni in range(NI):
            for q in range(4):
                acc[mi, ni, q] = 0


@cuda.jit(device=True, inline=True)
def tile_columns(O, epilogue):
    """The tile's columns over w's O rows: O, or for SwiGLU ``swiglu_columns(O / 2)`` (the last
    group padded); RoPE's relabelling keeps O (a head is whole groups of 16)."""
    return swiglu_columns_device(O // 2) if epilogue == EPILOGUE_SWIGLU else O


@cuda.jit(device=True, inline=True)
def tile_product(x, x_rows, norm_w, eps, w, item, steps_per_split, wide, epilogue, head_dim, acc,
                 inv_rms):
    """Work item ``item`` (of ``tc_work_items``): its tile of rms_norm?(x[x_rows]) @ w.T over its
    range of k steps into this lane's ``acc`` (MI, NI, 4), unscaled, and — when it has the whole
    k range and a norm — its rows' 1 / rms into ``inv_rms`` (BM,) shared. Returns (r0, o0,
    split): the tile's first row and column, and whether its k range is split among blocks.
    Every thread of the block must call it (``tc_matmul`` explains the tile)."""
    R = x_rows.shape[0]
    O, I = w.shape
    N = tile_columns(O, epilogue)
    w2 = fp16_pairs(w)  # (O, I // 2) uint32: word j of row o = w[o, 2j] (low half), w[o, 2j+1]
    a_tile = cuda.shared.array(A_TILE, uint32)  # (2 x BM x STRIDE,) fp16 pairs of activations
    b_tile = cuda.shared.array(B_TILE, uint32)  # (2 x BN x STRIDE,) fp16 pairs of weights
    row_sq = cuda.shared.array(SQ_SHAPE, float32)  # (BM, A_QUADS) partial sums of squares
    afrag = cuda.local.array(A_FRAG, uint32)  # (MI, 4)
    bfrag = cuda.local.array(B_FRAG, uint32)  # (NI, 2)
    xa = cuda.local.array(A_VALUES, float32)  # (A_VALUES,) staged activations
    wb = cuda.local.array(B_WORDS, uint32)  # (B_WORDS,) staged weight pairs
    rows = cuda.local.array(LOADS, int32)  # (A_LOADS + B_LOADS,) the row of each load
    at = cuda.local.array(LOADS, uint32)  # (A_LOADS + B_LOADS,) its flat offset at k step 0
    m_tiles, tiles, k_steps, splits = tile_counts_device(R, N, I, steps_per_split)
    squares = norm_w.shape[0] > 0 and splits == 1  # this tile finds its rows' 1 / rms
    r0, o0, k_first, k_end = work_item(item, tiles, m_tiles, steps_per_split, k_steps)
    start_item(x_rows, I, N, O, r0, o0, rows, at, acc, row_sq, epilogue, head_dim)
    load_step(x, w2, rows, at, k_first, wide, xa, wb)
    store_step(xa, wb, norm_w, k_first, wide, a_tile, b_tile, 0, squares, row_sq)
    cuda.syncthreads()
    for kt in range(k_first, k_end):
        buf = (kt - k_first) % 2
        if kt + 1 < k_end:  # issue the next step's loads before this step's math
            load_step(x, w2, rows, at, kt + 1, wide, xa, wb)
        mma_step(a_tile, b_tile, buf, acc, afrag, bfrag)
        if kt + 1 < k_end:  # the other buffer: nobody reads it during this step
            store_step(xa, wb, norm_w, kt + 1, wide, a_tile, b_tile, 1 - buf, squares, row_sq)
        cuda.syncthreads()
    if squares:
        tile_inv_rms(I, eps, row_sq, inv_rms)
    return r0, o0, splits > 1


@cuda.jit(device=True, inline=True)
def tile_items(x_rows, w, steps_per_split, epilogue):
    """How many work items the tile has: ``tc_work_items`` inside a kernel."""
    O, I = w.shape
    _, tiles, _, splits = tile_counts_device(x_rows.shape[0], tile_columns(O, epilogue), I,
                                             steps_per_split)
    return tiles * splits


@cuda.jit(device=True, inline=True)
def tc_matmul(x, x_rows, norm_w, eps, w, bias, row_scale, out, accumulate, steps_per_split,
              wide, swiglu, block, n_blocks):
    """out (R, O) (+)= rms_norm?(x[x_rows]) @ w.T + bias, on tensor cores, work items ``block``,
    ``block + n_blocks``, ... of ``tc_work_items(R, O, I, steps_per_split)``. When the k range
    is split, ``out`` holds what the prologue put there (the bias, the residual, zeros), the
    splits add onto it and ``row_scale`` (R,) holds each row's 1 / rms (``tc_prologue``); when
    it is not, each block finds its rows' 1 / rms itself and writes its tile whole
    (``add_rows``). With ``swiglu`` (a constant; k never split) w is ``[W_gate; W_up]`` (2F, I),
    the tile's columns alternate between them (``gate_up_row``: ``swiglu_columns(F)`` of them)
    and ``out`` is act (R, F) = silu(gate) * up (``swiglu_rows``).
    x (T, I) f32; x_rows (R,) i32; norm_w (I,) f32 or (0,); w (O, I) f16, I even; bias (O,) f32
    or (0,); ``wide``: I % 8 == 0, every row 16-byte aligned (a constant of each build of
    ``tc_matmul_kernel``). A work item is one BM x BN tile of ``out`` over ``steps_per_split``
    k steps of BK (``tile_product``). Every thread of the block must call it."""
    epilogue = EPILOGUE_SWIGLU if swiglu else EPILOGUE_ADD
    inv_rms = cuda.shared.array(BM, float32)  # (BM,) the tile's rows' 1 / rms
    acc = cuda.local.array(ACC_SHAPE, float32)  # (MI, NI, 4) this lane's outputs
    for item in range(block, tile_items(x_rows, w, steps_per_split, epilogue), n_blocks):
        r0, o0, split = tile_product(x, x_rows, norm_w, eps, w, item, steps_per_split, wide,
                                     epilogue, 0, acc, inv_rms)
        if swiglu:
            swiglu_rows(out, r0, o0, acc, norm_w, inv_rms, bias)
        else:
            add_tile(out, r0, o0, acc, norm_w, row_scale, inv_rms, bias, accumulate, split)


@cuda.jit(device=True, inline=True)
def tc_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables, cos,
                sin, kv_pool, layer, num_heads, num_kv_heads, wide, block, n_blocks):
    """The qkv projection of ``x_rows`` (R,) tokens with RoPE and the KV write in its epilogue
    (``linear.gemv_qkv_rope``'s contract, ``rope_rows``): w (O, I) = (H + 2K) E rows, every k step
    in one block (the rotation needs whole sums)."""
    E = kv_pool.shape[5]
    steps = (w.shape[1] + BK - 1) // BK
    inv_rms = cuda.shared.array(BM, float32)  # (BM,) the tile's rows' 1 / rms
    acc = cuda.local.array(ACC_SHAPE, float32)  # (MI, NI, 4) this lane's outputs
    for item in range(block, tile_items(x_rows, w, steps, EPILOGUE_ROPE), n_blocks):
        r0, o0, _ = tile_product(x, x_rows, norm_w, eps, w, item, steps, wide, EPILOGUE_ROPE, E,
                                 acc, inv_rms)
        rope_rows(qkv, r0, o0, acc, x_rows, norm_w, inv_rms, bias, positions, seq_rows,
                  block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads)


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
    def tc_matmul_kernel(x, x_rows, norm_w, eps, w, bias, row_scale, out, accumulate,
                         steps_per_split):
        tc_matmul(x, x_rows, norm_w, eps, w, bias, row_scale, out, accumulate, steps_per_split,
                  aligned and loads.WIDE_LOADS, False, cuda.blockIdx.x, cuda.gridDim.x)

    return tc_matmul_kernel  # (its own name: Nsight Compute's -k filters on it)


def swiglu_tile_kernel(aligned: bool):
    """``tc_matmul`` with SwiGLU in its epilogue as a kernel, every k step in one block."""

    @cuda.jit
    def tc_swiglu_kernel(x, x_rows, norm_w, eps, w, bias, act):
        k_steps = (w.shape[1] + BK - 1) // BK
        tc_matmul(x, x_rows, norm_w, eps, w, bias, norm_w, act, 0, k_steps,  # (no row_scale:
                  aligned and loads.WIDE_LOADS, True, cuda.blockIdx.x, cuda.gridDim.x)  # unsplit)

    return tc_swiglu_kernel


def qkv_rope_tile_kernel(aligned: bool):
    """``tc_qkv_rope`` as a kernel."""

    @cuda.jit
    def tc_qkv_rope_kernel(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows,
                           block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads):
        tc_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables, cos,
                    sin, kv_pool, layer, num_heads, num_kv_heads, aligned and loads.WIDE_LOADS,
                    cuda.blockIdx.x, cuda.gridDim.x)

    return tc_qkv_rope_kernel


def _in_features(x, x_rows, norm_w, eps, w, *rest):
    return w.shape[1]


# Launch ``[grid_for(tc_work_items(R, O, I, steps)), THREADS]``; one build for I % 8 == 0, one for
# the rest, picked from w's in_features.
tc_matmul_kernel = ByAlignment(tile_kernel, _in_features)
# Launch ``[grid_for(tc_work_items(R, swiglu_columns(F), I, k steps)), THREADS]``.
tc_swiglu_kernel = ByAlignment(swiglu_tile_kernel, _in_features)
# Launch ``[grid_for(tc_work_items(R, (H + 2K) E, I, k steps)), THREADS]``.
tc_qkv_rope_kernel = ByAlignment(qkv_rope_tile_kernel, _in_features)


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
    """Whether ``tc_prologue`` has anything to do: only for a split k range, with a norm (no
    block sees a whole row), a bias or an ``out`` to overwrite — an unsplit tile finds its 1 /
    rms and writes its outputs whole itself."""
    return split and (norm_w.shape[0] > 0 or bias.shape[0] > 0 or not accumulate)


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
        x, x_rows, norm_w, eps, w, bias, row_scale, out, accumulate, steps)


def launch_tc_swiglu(x, x_rows, norm_w, eps, w, bias, act, stream=0) -> None:
    """act (R, F) = silu(gate) * up of ``rms_norm?(x[x_rows]) @ [W_gate; W_up].T + bias`` on
    tensor cores, one launch: the tile walks every k step of its columns (SwiGLU needs whole
    sums: no split, so no prologue — the tile finds its rows' 1 / rms itself). w (2F, I) f16."""
    R, (O, I), F = x_rows.shape[0], w.shape, act.shape[1]
    if O != 2 * F:
        raise ValueError(f"gate/up weights must be (2F, I) = ({2 * F}, I) for act (R, {F}), got "
                         f"{tuple(w.shape)}")
    N = swiglu_columns(F)
    tc_swiglu_kernel[grid_for(tc_work_items(R, N, I, tile_counts(R, N, I, 1)[2])), THREADS,
                     stream](x, x_rows, norm_w, eps, w, bias, act)


def takes_qkv_rope(w, head_dim: int) -> bool:
    """Whether ``launch_tc_qkv_rope`` takes these qkv weights: I even (read as fp16 pairs) and
    heads of whole groups of 16 columns (``rope_row``)."""
    return w.shape[1] % 2 == 0 and head_dim % (2 * ROPE_GROUP) == 0


def launch_tc_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables,
                       cos, sin, kv_pool, layer, num_heads, num_kv_heads, stream=0) -> None:
    """``rms_norm?(x[x_rows]) @ w_qkv.T + bias`` on tensor cores with RoPE and the KV write in the
    epilogue (``tc_qkv_rope``), one launch: q rotated into qkv (T, (H + 2K) E), k rotated and v
    into kv_pool (N, L, 2, B, K, E). Every k step in one block, so no prologue."""
    R, (O, I), E = x_rows.shape[0], w.shape, kv_pool.shape[5]
    if not takes_qkv_rope(w, E) or O != (num_heads + 2 * num_kv_heads) * E:
        raise ValueError(f"the RoPE tile takes (H + 2K) E = {(num_heads + 2 * num_kv_heads) * E}"
                         f" rows of an even width, heads a multiple of 16; got {tuple(w.shape)}, "
                         f"E = {E}")
    tc_qkv_rope_kernel[grid_for(tc_work_items(R, O, I, tile_counts(R, O, I, 1)[2])), THREADS,
                       stream](x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows,
                               block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads)


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
