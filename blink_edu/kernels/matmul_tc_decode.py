"""Tensor cores for decode batches: weights streamed from memory straight into ``mma`` fragments.

The linear layers of a decode step of 8 to 128 sequences, ``out (+)= rms_norm?(x[x_rows]) @ W.T
+ b`` with the RoPE or SwiGLU that follows it in the epilogue. ``matmul_tc.py`` explains the
instruction (``mma.sync.m16n8k16``) and its fragment layout; this kernel feeds it differently.

**Why another tile.** A decode batch is *skinny*: 64 tokens against a 576 x 960 weight matrix.
Each weight is used 64 times and then never again this step, so the step is a stream of weights
from HBM with a little math on each — a GEMV with a few more rows, not a matmul. The shared-memory
tile of ``matmul_tc.py`` spends its time staging, waiting at barriers and adding partial tiles
with atomics. Here nothing is staged: every lane loads its B fragment *from global memory* into
registers, 16 bytes at a time, and hands it to the tensor core.

**The k permutation.** A B fragment wants lane ``(g, t)`` to hold ``W[n, 2t : 2t + 2]`` and
``W[n, 2t + 8 : 2t + 10]`` — two 4-byte pieces, eight lanes' worth of a 32-byte sector. But an
``mma`` sums over k, and a sum does not care about order: any relabelling of the 16 k of a step
gives the same result, *provided A and B use the same one*. So lane ``(g, t)`` loads the eight
consecutive weights ``W[n, k0 + 8t : k0 + 8t + 8]`` — one 16-byte load, the quad of lanes of a
group covering 64 contiguous bytes — and feeds them to two ``mma`` k-steps::

    words p0 p1 p2 p3 of W[n, k0 + 8t : + 8]        step 0: b0 = p0, b1 = p1  (k0 + 8t + 0..3)
                                                    step 1: b0 = p2, b1 = p3  (k0 + 8t + 4..7)

and the activations of rows ``g`` and ``g + 8`` at the same eight k the same way (a0/a2 from row
``g``'s p0/p1, a1/a3 from row ``g + 8``'s). A *chunk* of 32 k is two ``mma`` steps.

**The work.** A work item is a *pair of 8-column groups* of ``out`` (``NJ = 2`` n-tiles) for one
*row group* of 16 tokens (``MT`` m-tiles). The four warps of the block split the item's k chunks
(warp w takes chunks w, w + 4, ...), so a 576-wide row is walked in ~5 chunks a warp, each
chunk's weights and activations loaded while the previous chunk computes. At the end the warps
add up their accumulators in shared memory, one m-tile at a time (``RED_SHAPE``, 5 KB) — no
atomics, the sums in a fixed order — and each thread of the block finishes one output *of both
column groups at once*.

**Paired columns, fused epilogues.** Which columns the two groups are is the caller's choice,
and it is what makes the epilogue free:

* plain linear: columns ``o0 .. o0 + 8`` and ``o0 + 8 .. o0 + 16``; bias, residual add;
* gate/up + SwiGLU: ``j0 ..`` of the gate and ``F + j0 ..`` of the up projection, so a thread
  holds ``g`` and ``u`` of the same ``j`` and writes ``silu(g) * u`` (``act``), never ``gate_up``;
* qkv + RoPE + KV write: ``i0 ..`` and ``E/2 + i0 ..`` of one head, a rotation pair, so a thread
  rotates and places it (``rope.place_pair``) as the batch-1 GEMV does.

The RMSNorm rides along as in the other linear kernels: the activations are multiplied by the
norm weight before they are rounded to fp16, the lanes add up the squares of the activations they
load anyway, and the sums (``red``'s last two entries a row group) scale each row.

**Two forms.** In Numba's simulator the ``mma`` and ``pack_half2`` of ``matmul_tc`` take their
Python forms and a block is one warp; the loops and indexing are this same code. Weights may be
float16 or float32 (rounded to fp16 as they are loaded — which the executors never ask for: they
take this path for float16 weights only, ``linear.linear_path``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import float32, int32, uint32

from . import loads
from .elementwise import silu_times
from .loads import VEC, ByAlignment, load4_flat, load8_at
from .matmul_tc import mma_m16n8k16, pack_half2, plus_bias, store_output
from .reduce import SIMULATOR, THREADS, WARP, cuda
from .rope import pair_target, place_pair

MT = 1  # m16 tiles a row group (a work item's rows): 16 tokens
NJ = 2  # n8 tiles a work item: the two column groups of a pair
GROUP = 8  # columns in a column group (an mma's n)
CHUNK = 4 * VEC  # k a chunk: the quad of lanes loads 4 x 8 consecutive k (two mma k16 steps)
WARPS = THREADS // WARP  # 4 on a GPU, 1 in the simulator
ROWS = 16 * MT  # tokens a row group
PER_TILE = 4 * NJ + 2  # shared entries an m-tile: c0..c3 of both groups, squares of g, g + 8
RED_SHAPE = (WARPS, PER_TILE, WARP)  # every warp's partial sums of one m-tile, lane by lane (5 KB)
ACC_SHAPE = (MT, NJ, 4)  # a lane's accumulators: c0..c3 of every (m-tile, column group)
A_SHAPE = (MT, 2, 4)  # a lane's A words this chunk: (m-tile, row g | g + 8, p0..p3)
B_SHAPE = (NJ, 4)  # a lane's B words: (column group, p0..p3)
SQ_SHAPE = (MT, 2)  # a lane's sums of squares of rows g and g + 8 of each m-tile
X_SHAPE = (MT, 2, VEC)  # a lane's activations of a chunk: (m-tile, row g | g + 8, 8 k)


def column_groups(count: int, groups: int) -> int:
    """Work items over ``count`` columns (or rotation pairs, or gate/up pairs) taken ``groups``
    column groups of 8 at a time."""
    return -(-count // (groups * GROUP))


items_over = cuda.jit(device=True, inline=True)(column_groups)  # the same, in a kernel


@cuda.jit(device=True, inline=True)
def at_or_zero(a, row, col):
    """a[row, col] as float32, 0 past a's last column."""
    return float32(a[row, col]) if col < a.shape[1] else float32(0)


@cuda.jit(device=True, inline=True)
def load8_or_zeros(a, row, col, wide):
    """a[row, col:col + 8] as eight float32, zeros past a's last column. ``wide``: one or two
    16-byte loads (``loads.load8_at``); the caller guarantees that the eight are then all inside
    or all outside."""
    if col < a.shape[1]:
        if wide:
            return load8_at(a, (row, col))
        return (at_or_zero(a, row, col), at_or_zero(a, row, col + 1),
                at_or_zero(a, row, col + 2), at_or_zero(a, row, col + 3),
                at_or_zero(a, row, col + 4), at_or_zero(a, row, col + 5),
                at_or_zero(a, row, col + 6), at_or_zero(a, row, col + 7))
    zero = float32(0)
    return (zero, zero, zero, zero, zero, zero, zero, zero)


@cuda.jit(device=True, inline=True)
def packed_words(w, row, col, wide):
    """W[row, col : col + 8] as four fp16 pairs, converted from whatever w holds (float32
    weights are rounded here; fp16 ones of an odd width cannot be read as pairs)."""
    v = load8_or_zeros(w, row, col, wide)
    return (pack_half2(v[0], v[1]), pack_half2(v[2], v[3]), pack_half2(v[4], v[5]),
            pack_half2(v[6], v[7]))


@cuda.jit(device=True, inline=True)
def fp16_words(w, row, col, wide):
    """W[row, col : col + 8] of fp16 weights as the four 32-bit words they are in memory: one
    16-byte load and nothing to convert (``wide``: I % 8 == 0, so a row's pairs start on a
    16-byte boundary); zeros past the last column."""
    if wide:
        if col < w.shape[1]:
            return load4_flat(w.view(np.uint32), (row * w.shape[1] + col) // 2)
        return uint32(0), uint32(0), uint32(0), uint32(0)
    return packed_words(w, row, col, wide)


if SIMULATOR:

    @cuda.jit(device=True)
    def weight_words(w, row, col, wide):
        """W[row, col : col + 8] as four fp16 pairs (see the GPU form)."""
        if w.dtype == np.float16:
            return fp16_words(w, row, col, wide)
        return packed_words(w, row, col, wide)

else:
    from numba import types
    from numba.cuda.extending import overload

    def weight_words(w, row, col, wide):
        """W[row, col : col + 8] as four fp16 pairs: for fp16 weights the words in memory
        (``fp16_words``), for float32 ones rounded as they are loaded (``packed_words``). Chosen
        when the kernel compiles, by the weights' type: a persistent kernel built for a float32
        model compiles this path though it never takes it."""

    @overload(weight_words, target="cuda")
    def _weight_words(w, row, col, wide):
        if isinstance(w, types.Array) and w.dtype == types.float16:
            return lambda w, row, col, wide: fp16_words(w, row, col, wide)
        return lambda w, row, col, wide: packed_words(w, row, col, wide)


@cuda.jit(device=True, inline=True)
def load_b_words(w, rows, k, wide, b):
    """b (NJ, 4) = this lane's weights W[rows[j], k : k + 8] of each column group j, as four fp16
    pairs (p0..p3 of the module docstring)."""
    for j in range(NJ):
        b[j, 0], b[j, 1], b[j, 2], b[j, 3] = weight_words(w, rows[j], k, wide)


@cuda.jit(device=True, inline=True)
def load_x(x, xrow, k, wide, active, xv):
    """xv (MT, 2, 8) = this lane's activations x[xrow[mi, h], k : k + 8] of rows g and g + 8 of
    each of the ``active`` m-tiles (those with a token in them), as float32."""
    for mi in range(MT):
        if mi < active:
            for h in range(2):
                (xv[mi, h, 0], xv[mi, h, 1], xv[mi, h, 2], xv[mi, h, 3], xv[mi, h, 4],
                 xv[mi, h, 5], xv[mi, h, 6], xv[mi, h, 7]) = load8_or_zeros(x, xrow[mi, h], k,
                                                                            wide)


@cuda.jit(device=True, inline=True)
def pack_a_words(xv, norm_w, k, wide, active, a, sq, gvals):
    """a (MT, 2, 4) = the activations xv times the norm weight, as fp16 pairs (p0..p3 of the
    module docstring); their squares added to sq (MT, 2)."""
    if norm_w.shape[0] == 0 or k >= norm_w.shape[0]:  # no norm, or past I: times 1
        for u in range(VEC):
            gvals[u] = float32(1)
    elif wide:
        (gvals[0], gvals[1], gvals[2], gvals[3], gvals[4], gvals[5], gvals[6],
         gvals[7]) = load8_at(norm_w, (k,))
    else:
        for u in range(VEC):
            gvals[u] = norm_w[k + u] if k + u < norm_w.shape[0] else float32(1)
    for mi in range(MT):
        if mi < active:
            for h in range(2):
                for u in range(VEC):
                    sq[mi, h] += xv[mi, h, u] * xv[mi, h, u]
                for p in range(4):
                    a[mi, h, p] = pack_half2(xv[mi, h, 2 * p] * gvals[2 * p],
                                             xv[mi, h, 2 * p + 1] * gvals[2 * p + 1])


@cuda.jit(device=True, inline=True)
def mma_chunk(a, b, acc, active):
    """The two k16 steps of a chunk for every active m-tile and both column groups."""
    for s in range(2):
        for mi in range(MT):
            if mi < active:
                for j in range(NJ):
                    d = mma_m16n8k16(a[mi, 0, 2 * s], a[mi, 1, 2 * s], a[mi, 0, 2 * s + 1],
                                     a[mi, 1, 2 * s + 1], b[j, 2 * s], b[j, 2 * s + 1],
                                     acc[mi, j, 0], acc[mi, j, 1], acc[mi, j, 2], acc[mi, j, 3])
                    acc[mi, j, 0], acc[mi, j, 1], acc[mi, j, 2], acc[mi, j, 3] = d


def row_group_count(num_rows: int) -> int:
    """Row groups of ROWS tokens over ``num_rows`` rows."""
    return -(-num_rows // ROWS)


row_groups = cuda.jit(device=True, inline=True)(row_group_count)  # the same, in a kernel


@cuda.jit(device=True, inline=True)
def tiles_in(R, r0):
    """m-tiles of the row group at r0 with at least one of the R tokens in them (<= MT)."""
    return min(MT, (R - r0 + 15) // 16)


@cuda.jit(device=True, inline=True)
def row_group_sums(x, x_rows, r0, norm_w, w, row_a, row_b, wide, acc, sq):
    """This warp's share of the products of rows r0 .. r0 + ROWS of rms_norm?(x[x_rows]) with
    weight rows ``row_a + n`` and ``row_b + n``, n < 8: its k chunks (w, w + WARPS, ...) into acc
    (MT, NJ, 4), and the squares of the activations it loaded into sq (MT, 2). ``share_tile``
    then adds the warps' parts up. A row past R, or past a group's last column, reads a real one
    instead of being tested at every load: its outputs are never stored."""
    tid = cuda.threadIdx.x
    warp, lane = tid // WARP, tid % WARP
    g, t = lane // 4, lane % 4
    R, I = x_rows.shape[0], x.shape[1]
    active = tiles_in(R, r0)
    a = cuda.local.array(A_SHAPE, uint32)  # (MT, 2, 4)
    b = cuda.local.array(B_SHAPE, uint32)  # (NJ, 4) this chunk's weights
    b_next = cuda.local.array(B_SHAPE, uint32)  # (NJ, 4) and the next chunk's, already loading
    xv = cuda.local.array(X_SHAPE, float32)  # (MT, 2, 8) this chunk's activations
    xv_next = cuda.local.array(X_SHAPE, float32)  # (MT, 2, 8) and the next chunk's
    xrow = cuda.local.array(SQ_SHAPE, int32)  # (MT, 2) x row of rows g, g + 8
    wrows = cuda.local.array(NJ, int32)  # (NJ,) this lane's weight row in each group
    gvals = cuda.local.array(VEC, float32)
    for mi in range(MT):
        for h in range(2):
            r = r0 + mi * 16 + h * 8 + g
            xrow[mi, h] = x_rows[min(r, R - 1)]  # past R: a real row (its outputs are not stored)
            sq[mi, h] = 0
        for j in range(NJ):
            for q in range(4):
                acc[mi, j, q] = 0
    wrows[0] = min(row_a + g, w.shape[0] - 1)  # past the group's columns: a real row, whose
    wrows[1] = min(row_b + g, w.shape[0] - 1)  # outputs are never stored
    n_chunks = (I + CHUNK - 1) // CHUNK
    if warp < n_chunks:
        load_b_words(w, wrows, warp * CHUNK + VEC * t, wide, b_next)
        load_x(x, xrow, warp * CHUNK + VEC * t, wide, active, xv_next)
    for c in range(warp, n_chunks, WARPS):
        k = c * CHUNK + VEC * t  # this lane's eight k of the chunk
        for j in range(NJ):
            for p in range(4):
                b[j, p] = b_next[j, p]
        for mi in range(MT):
            for h in range(2):
                for u in range(VEC):
                    xv[mi, h, u] = xv_next[mi, h, u]
        if c + WARPS < n_chunks:  # the next chunk's operands load while this one computes
            load_b_words(w, wrows, k + WARPS * CHUNK, wide, b_next)
            load_x(x, xrow, k + WARPS * CHUNK, wide, active, xv_next)
        pack_a_words(xv, norm_w, k, wide, active, a, sq, gvals)
        mma_chunk(a, b, acc, active)


@cuda.jit(device=True, inline=True)
def share_tile(acc, sq, mi, red):
    """m-tile ``mi`` of every warp's accumulators and squares into red (WARPS, PER_TILE, 32),
    then a barrier: ``pair_result`` reads them."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    for j in range(NJ):
        for q in range(4):
            red[warp, 4 * j + q, lane] = acc[mi, j, q]
    red[warp, 4 * NJ, lane] = sq[mi, 0]
    red[warp, 4 * NJ + 1, lane] = sq[mi, 1]
    cuda.syncthreads()


@cuda.jit(device=True, inline=True)
def pair_result(red, e, norm_w, eps, I):
    """Output ``e`` (0 <= e < 16 x 8) of an m-tile, summed over the warps: (row in the m-tile,
    column in the group, value in group a, value in group b), each value scaled by its row's
    1 / rms when there is a norm. Lane (g, t)'s c0, c1, c2, c3 are rows g, g, g + 8, g + 8 and
    columns 2t, 2t + 1, 2t, 2t + 1."""
    lane, q = e % WARP, e // WARP
    g, t, h = lane // 4, lane % 4, q // 2
    va = float32(0)
    vb = float32(0)
    squares = float32(0)
    for w in range(WARPS):
        va += red[w, q, lane]
        vb += red[w, 4 + q, lane]
        for u in range(4):  # the four lanes of group g loaded different k of the same rows
            squares += red[w, 4 * NJ + h, 4 * g + u]
    if norm_w.shape[0] > 0:
        scale = float32(1) / math.sqrt(squares / I + eps)
        va *= scale
        vb *= scale
    return h * 8 + g, 2 * t + q % 2, va, vb


@cuda.jit(device=True)
def tc_decode_linear(x, x_rows, norm_w, eps, w, bias, out, accumulate, wide, block, n_blocks):
    """out (R, O) (+)= rms_norm?(x[x_rows]) @ w.T + bias: the ``linear`` contract. A work item is
    columns o0 .. o0 + 16 (two groups of 8). Every thread of the block must call it."""
    tid = cuda.threadIdx.x
    R, (O, I) = x_rows.shape[0], w.shape
    red = cuda.shared.array(RED_SHAPE, float32)  # (WARPS, PER_TILE, 32)
    acc = cuda.local.array(ACC_SHAPE, float32)  # (MT, NJ, 4)
    sq = cuda.local.array(SQ_SHAPE, float32)  # (MT, 2)
    groups = row_groups(R)
    for item in range(block, items_over(O, NJ) * groups, n_blocks):
        o0, r0 = (item // groups) * NJ * GROUP, (item % groups) * ROWS
        row_group_sums(x, x_rows, r0, norm_w, w, o0, o0 + GROUP, wide, acc, sq)
        for mi in range(tiles_in(R, r0)):
            share_tile(acc, sq, mi, red)
            for e in range(tid, 16 * GROUP, THREADS):
                row, col, va, vb = pair_result(red, e, norm_w, eps, I)
                r = r0 + mi * 16 + row
                if r < R:
                    store_output(out, r, o0 + col, va, bias, accumulate)
                    store_output(out, r, o0 + GROUP + col, vb, bias, accumulate)
            cuda.syncthreads()  # everyone has read red before the next m-tile writes it


@cuda.jit(device=True)
def tc_decode_swiglu(x, x_rows, norm_w, eps, w, bias, act, wide, block, n_blocks):
    """act (R, F) = silu(g) * u with [g | u] = rms_norm?(x[x_rows]) @ w.T + bias, w (2F, I) =
    [W_gate; W_up]: gate/up with SwiGLU in the epilogue (gate columns j0.., up columns F + j0..)."""
    tid = cuda.threadIdx.x
    R, I, F = x_rows.shape[0], w.shape[1], act.shape[1]
    red = cuda.shared.array(RED_SHAPE, float32)
    acc = cuda.local.array(ACC_SHAPE, float32)
    sq = cuda.local.array(SQ_SHAPE, float32)
    groups = row_groups(R)
    for item in range(block, items_over(F, 1) * groups, n_blocks):
        j0, r0 = (item // groups) * GROUP, (item % groups) * ROWS
        row_group_sums(x, x_rows, r0, norm_w, w, j0, F + j0, wide, acc, sq)
        for mi in range(tiles_in(R, r0)):
            share_tile(acc, sq, mi, red)
            for e in range(tid, 16 * GROUP, THREADS):
                row, col, vg, vu = pair_result(red, e, norm_w, eps, I)
                r, j = r0 + mi * 16 + row, j0 + col
                if r < R and j < F:
                    act[r, j] = silu_times(plus_bias(vg, bias, j), plus_bias(vu, bias, F + j))
            cuda.syncthreads()


@cuda.jit(device=True)
def tc_decode_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables,
                       cos, sin, kv_pool, layer, num_heads, num_kv_heads, wide, block, n_blocks):
    """The qkv projection with RoPE and the KV write in its epilogue (``linear.gemv_qkv_rope``'s
    contract): a work item is columns i0.. and E/2 + i0.. of one head, rotation pairs."""
    tid = cuda.threadIdx.x
    R, I = x_rows.shape[0], w.shape[1]
    half = kv_pool.shape[5] // 2
    E = 2 * half
    per_head = items_over(half, 1)
    red = cuda.shared.array(RED_SHAPE, float32)
    acc = cuda.local.array(ACC_SHAPE, float32)
    sq = cuda.local.array(SQ_SHAPE, float32)
    groups = row_groups(R)
    for item in range(block, (num_heads + 2 * num_kv_heads) * per_head * groups, n_blocks):
        column_item, r0 = item // groups, (item % groups) * ROWS
        head, i0 = column_item // per_head, (column_item % per_head) * GROUP
        o0 = head * E + i0
        row_group_sums(x, x_rows, r0, norm_w, w, o0, o0 + half, wide, acc, sq)
        for mi in range(tiles_in(R, r0)):
            share_tile(acc, sq, mi, red)
            for e in range(tid, 16 * GROUP, THREADS):
                row, col, x1, x2 = pair_result(red, e, norm_w, eps, I)
                r, i = r0 + mi * 16 + row, i0 + col
                if r < R and i < half:
                    t = x_rows[r]
                    target = pair_target(positions, seq_rows, block_tables, cos, sin, t, i,
                                         kv_pool.shape[3])
                    place_pair(qkv, t, head, i, plus_bias(x1, bias, o0 + col),
                               plus_bias(x2, bias, o0 + half + col), target, kv_pool, layer,
                               num_heads, num_kv_heads)
            cuda.syncthreads()


def tc_decode_items(kind: str, num_rows: int, out_features: int, half_head: int = 0) -> int:
    """Work items of the three kernels over ``num_rows`` tokens: ``linear`` over O columns,
    ``swiglu`` over F outputs, ``qkv_rope`` over the (H + 2K) heads' E/2 rotation pairs
    (out_features = H + 2K heads); each column item once per row group."""
    if kind == "linear":
        columns = column_groups(out_features, NJ)
    elif kind == "swiglu":
        columns = column_groups(out_features, 1)
    else:
        columns = out_features * column_groups(half_head, 1)
    return columns * row_group_count(num_rows)


def _linear_kernel(aligned):
    @cuda.jit
    def tc_decode_linear_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate):
        tc_decode_linear(x, x_rows, norm_w, eps, w, bias, out, accumulate,
                         aligned and loads.WIDE_LOADS, cuda.blockIdx.x, cuda.gridDim.x)

    return tc_decode_linear_kernel


def _swiglu_kernel(aligned):
    @cuda.jit
    def tc_decode_swiglu_kernel(x, x_rows, norm_w, eps, w, bias, act):
        tc_decode_swiglu(x, x_rows, norm_w, eps, w, bias, act, aligned and loads.WIDE_LOADS,
                         cuda.blockIdx.x, cuda.gridDim.x)

    return tc_decode_swiglu_kernel


def _qkv_rope_kernel(aligned):
    @cuda.jit
    def tc_decode_qkv_rope_kernel(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows,
                                  block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads):
        tc_decode_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows,
                           block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads,
                           aligned and loads.WIDE_LOADS, cuda.blockIdx.x, cuda.gridDim.x)

    return tc_decode_qkv_rope_kernel


def in_features(x, x_rows, norm_w, eps, w, *rest):
    return w.shape[1]


# The three as kernels, launched ``[grid_for(tc_decode_items(...)), THREADS]``: each built for
# I % 8 == 0 and for the rest (``loads.ByAlignment``), picked from w's in_features. Each build
# has its kernel's own name, which Nsight Compute's ``-k`` filters on.
tc_decode_linear_kernel = ByAlignment(_linear_kernel, in_features)
tc_decode_swiglu_kernel = ByAlignment(_swiglu_kernel, in_features)
tc_decode_qkv_rope_kernel = ByAlignment(_qkv_rope_kernel, in_features)
