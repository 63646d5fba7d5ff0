"""Tensor cores from Python: a matmul tile on ``mma.sync`` fragments, written in Numba.

What it teaches: how the matrix multiplies of a *batched* step (decode of many sequences at once,
a prompt chunk) reach the GPU's tensor cores; the same contract as the ``linear`` kernels,
``out (+)= rms_norm?(x[x_rows]) @ W.T + b``, so it drops into the same launches.

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
  (fp16, loaded as 32-bit pairs) into shared memory — each value loaded once serves ``BN``
  (resp. ``BM``) outputs. Two shared buffers: the loads of step ``k + 1`` are issued before the
  ``mma`` of step ``k`` and land in the other buffer, so memory latency overlaps the math;
* warp tile (``WM x WN``): each warp owns ``MI x NI`` mma tiles of the block tile and keeps their
  accumulators in registers across all of k (register blocking: an A fragment serves ``NI``
  mma, a B fragment ``MI``);
* mma (16x8x16): the instruction above.

The fused prologue and epilogue of the ``linear`` kernels carry over: RMSNorm is folded in (the
norm weight ``g`` scales the activations as they are staged, the per-token ``inv_rms`` — from
sums of squares gathered during the same staging — scales each output row at the end), then the
bias, then the residual (``accumulate=1`` adds onto ``out``).

The activations are rounded to fp16 after the norm weight and before ``1 / rms``: ``|x * g|``
must stay below fp16's largest value, 65504 (a residual stream is far below it).

**Two forms, one tile.** Inline PTX cannot run in Numba's simulator, so the two instructions this
tile needs — ``mma_m16n8k16`` and ``pack_half2`` (two fp32 to an fp16 pair) — have a simulator
form chosen once at import, as ``reduce.block_sum`` does: there every thread writes its
fragment registers to shared memory and computes its own four outputs from the warp's registers,
the way the hardware gathers them. (Two helpers have two forms as well: ``row_group_sum`` adds
with atomics where the GPU shuffles, and ``fp16_pairs`` refuses weights that are not fp16 when the
kernel runs, where the GPU refuses them when it compiles.) Everything else — the staging, the buffers, the fragment indexing, the
loops — is the same Python code in both places, so CI checks the indexing of the real tile.

Requirements: ``I`` even (the weights are read as fp16 pairs), ``w`` C-contiguous float16
(``require_tc_operands`` checks them on the host). Launch with ``reduce.THREADS`` threads a block
(128 on a GPU, 32 in the simulator), like every other op kernel.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import float32, int32, uint32

from .reduce import FULL_MASK, SIMULATOR, THREADS, WARP, cuda

# --- tile geometry ---------------------------------------------------------------------------
MI, NI = 2, 2  # mma tiles per warp: MI along m (16 rows each), NI along n (8 columns each)
WM, WN = 16 * MI, 8 * NI  # warp tile: 32 x 16
ACC_SHAPE = (MI, NI, 4)  # each lane's accumulators: c0..c3 of every mma tile of its warp tile
A_FRAG = (MI, 4)  # a0..a3 for each of the MI row tiles
B_FRAG = (NI, 2)  # b0, b1 for each of the NI column tiles


class TileGeometry(NamedTuple):
    """The block-level constants, which follow from the threads a block and the k step."""

    THREADS: int
    WARPS: int  # 4 on a GPU, 1 in the simulator
    WARPS_M: int  # warps stacked along the rows (tokens) of the block tile
    WARPS_N: int  # and side by side along its columns (outputs)
    BM: int  # block tile: BM x BN (64 x 32 on a GPU, 32 x 16 in the simulator)
    BN: int
    BK: int  # k per shared-memory step
    KP: int  # 32-bit words (fp16 pairs) per row of a k step
    STRIDE: int  # words per row of a shared tile
    STAGE_ROWS: int  # rows one pass of the block's threads stages (KP threads a row)
    A_PER_THREAD: int  # activation rows each thread stages per k step
    B_PER_THREAD: int  # weight rows each thread stages per k step
    A_VALUES: int  # fp32 activations each thread holds between its loads and stores
    A_TILE: tuple  # (2 buffers, BM rows, STRIDE words) of fp16 pairs (uint32)
    B_TILE: tuple  # (2 buffers, BN rows, STRIDE words)
    REGS_SHAPE: tuple  # simulator: (warps, lanes, 6): every lane's a0..a3, b0, b1


def tile_geometry(threads: int, bk: int) -> TileGeometry:
    warps = threads // WARP
    warps_m = 2 if warps >= 4 else 1
    bm, bn, kp = warps_m * WM, warps // warps_m * WN, bk // 2
    # One spare group of 4 words per row: lane (g, t) reads word g * stride + t, and with
    # stride = 4 (mod 8) the 32 lanes of a fragment load hit 32 different shared-memory banks.
    stride = kp + 4
    stage_rows = threads // kp
    assert threads % kp == 0 and bm % stage_rows == 0 and bn % stage_rows == 0 and kp % 8 == 0
    return TileGeometry(threads, warps, warps_m, warps // warps_m, bm, bn, bk, kp, stride,
                        stage_rows, bm // stage_rows, bn // stage_rows, 2 * bm // stage_rows,
                        (2, bm, stride), (2, bn, stride), (warps, WARP, 6))


# k per shared-memory step. A small batch is latency-bound: every step waits once for memory, so
# fewer, longer steps pay (I = 576 is 9 steps at 64). The price is registers: at BK 64 a thread
# holds 32 fp32 activations and 16 weight pairs in flight (sm_90: ~245 registers, no spills,
# 2 blocks an SM); BK 32 needs ~160. In the simulator 32, so that tests with a small I still
# cross several steps and both buffers.
GEOMETRY = tile_geometry(THREADS, 32 if SIMULATOR else 64)
# Numba reads module globals as compile-time constants (and global tuples as array shapes).
(THREADS, WARPS, WARPS_M, WARPS_N, BM, BN, BK, KP, STRIDE, STAGE_ROWS, A_PER_THREAD, B_PER_THREAD,
 A_VALUES, A_TILE, B_TILE, REGS_SHAPE) = GEOMETRY

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
    def row_group_sum(value, row, sums, kc):
        """sums[row] += the ``value`` of the KP threads staging that row (simulator: atomics)."""
        cuda.atomic.add(sums, row, value)

    @cuda.jit(device=True)
    def fp16_pairs(w):
        """w (O, I) float16 seen as (O, I // 2) uint32 (see the GPU form); other weights refused."""
        if w.ndim != 2 or w.dtype != np.float16:
            raise TypeError(f"tc_matmul takes (O, I) float16 weights, got {w.ndim}-d {w.dtype}")
        return w.view(np.uint32)

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

    @cuda.jit(device=True, inline=True)
    def row_group_sum(value, row, sums, kc):
        """sums[row] = the sum of ``value`` over the KP consecutive lanes staging that row:
        butterfly shuffles inside the group, then its first lane writes."""
        offset = KP // 2
        while offset > 0:
            value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
            offset //= 2
        if kc == 0:
            sums[row] = value


# --- the tile ----------------------------------------------------------------------------------
@cuda.jit(device=True, inline=True)
def load_step(x, w2, xrow, o0, kt, xa, wb):
    """Global memory -> registers, k step ``kt``: this thread's fp32 activation pairs into ``xa``
    (A_VALUES,) and fp16 weight pairs into ``wb`` (B_PER_THREAD,), zeros past the edges.
    KP consecutive threads read one row's KP consecutive words: coalesced."""
    kc = cuda.threadIdx.x % KP
    kp = kt * KP + kc  # this thread's pair column: k = 2 kp, 2 kp + 1
    I2 = w2.shape[1]
    for j in range(A_PER_THREAD):
        lo, hi = float32(0), float32(0)
        if xrow[j] >= 0 and kp < I2:
            lo, hi = x[xrow[j], 2 * kp], x[xrow[j], 2 * kp + 1]
        xa[2 * j], xa[2 * j + 1] = lo, hi
    for j in range(B_PER_THREAD):
        o = o0 + cuda.threadIdx.x // KP + j * STAGE_ROWS
        word = uint32(0)
        if o < w2.shape[0] and kp < I2:
            word = w2[o, kp]
        wb[j] = word


@cuda.jit(device=True, inline=True)
def store_step(xa, wb, norm_w, kt, a_tile, b_tile, buf, sumsq):
    """Registers -> shared buffer ``buf``: activations times the norm weight, rounded to fp16
    pairs; weights as they are. Adds the squares of the raw activations to ``sumsq``."""
    kc = cuda.threadIdx.x % KP
    first = cuda.threadIdx.x // KP
    k = 2 * (kt * KP + kc)
    g0, g1 = float32(1), float32(1)
    if norm_w.shape[0] > 0 and k < norm_w.shape[0]:
        g0, g1 = norm_w[k], norm_w[k + 1]
    for j in range(A_PER_THREAD):
        lo, hi = xa[2 * j], xa[2 * j + 1]
        sumsq[j] += lo * lo + hi * hi
        a_tile[buf, first + j * STAGE_ROWS, kc] = pack_half2(lo * g0, hi * g1)
    for j in range(B_PER_THREAD):
        b_tile[buf, first + j * STAGE_ROWS, kc] = wb[j]


@cuda.jit(device=True, inline=True)
def mma_step(a_tile, b_tile, buf, acc, afrag, bfrag):
    """The warp's share of one k step: for every 16-wide k slice, load the A fragments of its MI
    row tiles and the B fragments of its NI column tiles from shared memory (layout in the module
    docstring), then MI x NI mma into the accumulators ``acc`` (MI, NI, 4)."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    g, t = lane // 4, lane % 4
    m0 = (warp // WARPS_N) * WM  # the warp tile's first row and column in the block tile
    n0 = (warp % WARPS_N) * WN
    for ks in range(KP // 8):  # 8 pairs = 16 k per mma
        c = ks * 8 + t
        for mi in range(MI):
            m = m0 + mi * 16 + g
            afrag[mi, 0], afrag[mi, 1] = a_tile[buf, m, c], a_tile[buf, m + 8, c]
            afrag[mi, 2], afrag[mi, 3] = a_tile[buf, m, c + 4], a_tile[buf, m + 8, c + 4]
        for ni in range(NI):
            n = n0 + ni * 8 + g
            bfrag[ni, 0], bfrag[ni, 1] = b_tile[buf, n, c], b_tile[buf, n, c + 4]
        for mi in range(MI):
            for ni in range(NI):
                d = mma_m16n8k16(afrag[mi, 0], afrag[mi, 1], afrag[mi, 2], afrag[mi, 3],
                                 bfrag[ni, 0], bfrag[ni, 1],
                                 acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3])
                acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3] = d


@cuda.jit(device=True, inline=True)
def plus_bias(y, bias, o):
    """y + bias[o], or y when there is no bias (an empty ``bias``)."""
    return y + bias[o] if bias.shape[0] > 0 else y


@cuda.jit(device=True, inline=True)
def store_output(out, r, o, y, bias, accumulate):
    """The epilogue for one element: add the bias, add onto ``out`` (the residual) or replace it;
    nothing past the last column (the block tile overhangs an O that is not a multiple of BN)."""
    if o < out.shape[1]:
        y = plus_bias(y, bias, o)
        if accumulate:
            y += out[r, o]
        out[r, o] = y


@cuda.jit(device=True, inline=True)
def write_tile(out, r0, o0, acc, sums, use_norm, eps, bias, accumulate):
    """Each lane's accumulators to ``out``: c0, c1 at row g, columns 2t, 2t+1 of every mma tile,
    c2, c3 at row g + 8; each row scaled by its 1 / rms when there is a norm."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    g, t = lane // 4, lane % 4
    m0 = (warp // WARPS_N) * WM
    n0 = (warp % WARPS_N) * WN
    R = out.shape[0]
    for mi in range(MI):
        for half in range(2):  # rows g (c0, c1) and g + 8 (c2, c3)
            m = m0 + mi * 16 + half * 8 + g
            if r0 + m < R:
                scale = float32(1)
                if use_norm:
                    scale = float32(1) / math.sqrt(sums[m] + eps)
                for ni in range(NI):
                    o = o0 + n0 + ni * 8 + 2 * t
                    store_output(out, r0 + m, o, acc[mi, ni, 2 * half] * scale, bias, accumulate)
                    store_output(out, r0 + m, o + 1, acc[mi, ni, 2 * half + 1] * scale, bias,
                                 accumulate)


@cuda.jit(device=True, inline=True)
def tc_matmul(x, x_rows, norm_w, eps, w, bias, out, accumulate, block, n_blocks):
    """out (R, O) (+)= rms_norm?(x[x_rows]) @ w.T + bias, on tensor cores, work items ``block``,
    ``block + n_blocks``, ... of ``tc_work_items(R, O)``. x (T, I) f32; x_rows (R,) i32;
    norm_w (I,) f32 or (0,); eps f32; w (O, I) f16, I even; bias (O,) f32 or (0,);
    out (R, O) f32; accumulate 0/1. Every thread of the block must call it."""
    tid = cuda.threadIdx.x
    R = x_rows.shape[0]
    O, I = w.shape
    w2 = fp16_pairs(w)  # (O, I // 2) uint32: word j of row o = w[o, 2j] (low half), w[o, 2j+1]
    use_norm = norm_w.shape[0] > 0
    a_tile = cuda.shared.array(A_TILE, uint32)  # (2, BM, STRIDE) fp16 pairs of activations
    b_tile = cuda.shared.array(B_TILE, uint32)  # (2, BN, STRIDE) fp16 pairs of weights
    sums = cuda.shared.array(BM, float32)  # (BM,) per row of the tile: mean square of x
    acc = cuda.local.array(ACC_SHAPE, float32)  # (MI, NI, 4) this lane's outputs
    afrag = cuda.local.array(A_FRAG, uint32)  # (MI, 4)
    bfrag = cuda.local.array(B_FRAG, uint32)  # (NI, 2)
    xa = cuda.local.array(A_VALUES, float32)  # (A_VALUES,) staged activations, pairs
    wb = cuda.local.array(B_PER_THREAD, uint32)  # (B_PER_THREAD,) staged weight pairs
    xrow = cuda.local.array(A_PER_THREAD, int32)  # (A_PER_THREAD,) x row of each staged row
    sumsq = cuda.local.array(A_PER_THREAD, float32)  # (A_PER_THREAD,) partial sums of squares
    m_tiles = (R + BM - 1) // BM
    n_items = m_tiles * ((O + BN - 1) // BN)  # = tc_work_items(R, O)
    k_steps = (I // 2 + KP - 1) // KP
    for item in range(block, n_items, n_blocks):
        # Consecutive items share a weight tile: blocks running together read it from HBM once.
        r0, o0 = (item % m_tiles) * BM, (item // m_tiles) * BN
        for j in range(A_PER_THREAD):
            r = r0 + tid // KP + j * STAGE_ROWS
            xrow[j] = x_rows[r] if r < R else -1
            sumsq[j] = 0
        for e in range(tid, BM, THREADS):
            sums[e] = 0
        for mi in range(MI):
            for ni in range(NI):
                for q in range(4):
                    acc[mi, ni, q] = 0
        load_step(x, w2, xrow, o0, 0, xa, wb)
        store_step(xa, wb, norm_w, 0, a_tile, b_tile, 0, sumsq)
        cuda.syncthreads()
        for kt in range(k_steps):
            if kt + 1 < k_steps:  # issue the next step's loads before this step's math
                load_step(x, w2, xrow, o0, kt + 1, xa, wb)
            mma_step(a_tile, b_tile, kt % 2, acc, afrag, bfrag)
            if kt + 1 < k_steps:  # the other buffer: nobody reads it during this step
                store_step(xa, wb, norm_w, kt + 1, a_tile, b_tile, (kt + 1) % 2, sumsq)
            cuda.syncthreads()
        if use_norm:
            for j in range(A_PER_THREAD):
                row_group_sum(sumsq[j] / float32(I), tid // KP + j * STAGE_ROWS, sums, tid % KP)
            cuda.syncthreads()
        write_tile(out, r0, o0, acc, sums, use_norm, eps, bias, accumulate)
        cuda.syncthreads()  # the next item's staging reuses the buffers and ``sums``


@cuda.jit
def tc_matmul_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    """``tc_matmul`` as a kernel: launch ``[grid_for(tc_work_items(R, O)), THREADS]``."""
    tc_matmul(x, x_rows, norm_w, eps, w, bias, out, accumulate, cuda.blockIdx.x, cuda.gridDim.x)


def tc_work_items(R: int, O: int) -> int:
    """How many work items (BM x BN tiles of ``out``) ``tc_matmul`` has for R rows and O outputs."""
    return -(-R // BM) * -(-O // BN)


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
