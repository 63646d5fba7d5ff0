"""Linear layers: ``out = [out +] rms_norm?(x) @ W.T + b`` — a GEMV, tensor cores, an FMA tile.

The matrix multiplies are almost all of a decoder's work and, at small batch, almost all of its
memory traffic: every decode step streams every weight once. Four ways to do it, chosen from the
number of rows and the weights' dtype in one place (``linear_path`` for a host's launch,
``linear`` inside the persistent kernel, ``fuses_next_op`` for the epilogues):

* **GEMV** (``R <= GEMV_MAX_ROWS`` tokens, i.e. decode): a warp (``LANES`` threads) owns one
  output row ``o``; lane ``l`` reads ``W[o, 8l : 8l + 8]``, then 256 further on, ... — eight
  fp16 weights in one 16-byte load (``loads.py``), consecutive lanes on consecutive addresses —
  keeping a partial dot product, then the warp adds its partials with shuffles: no shared
  memory, no barrier. Each lane issues its ``UNROLL`` wide loads before it uses any of them: a
  load from HBM takes ~1 µs, and a thread that waits for each before issuing the next leaves
  the memory system idle — a small decode GEMV is *latency*-bound long before it is
  bandwidth-bound, and what it spends its time on is instructions at a few warps per SM. (For a
  second token the row is read again, from the L1 cache, where the first one left it.)
* **Tensor cores for a decode batch** (``GEMV_MAX_ROWS < R <= TC_DECODE_MAX_ROWS``, float16
  weights): ``matmul_tc_decode.py`` — weights streamed from memory straight into ``mma``
  fragments, a GEMV with tensor-core math, with RoPE + the KV write or SwiGLU in its epilogue
  as at batch 1. The eager and graph executors take it for the qkv and gate/up projections;
  the persistent kernel's forward for *every* linear layer of a batched step (it needs 5 KB of
  shared memory, where the tile below needs 41 KB, and every op of the persistent kernel
  shares one static allocation).
* **Tensor-core tile** (more rows, float16 weights of an even width): ``matmul_tc.py``'s
  shared-memory ``mma.sync`` tile with split-K, for the other layers of a batched step and
  for prompt chunks, launched by the eager and graph executors.
* **FMA tile** (more rows, float32 weights, or BLINK_EDU_TENSOR_CORES=0): the block loads a
  ``TILE x TILE`` tile of inputs and one of weights into shared memory and each thread
  accumulates several outputs from them, so every weight loaded serves ``TILE`` tokens.

Fusions save whole kernels and round trips through memory:

* **RMSNorm in the prologue**: ``rms_norm(x) @ W.T = inv_rms(x) * ((x * g) @ W.T)``, so the norm
  weight ``g`` is folded into the weights as they stream by and the per-token ``inv_rms`` scales
  the result (pass an empty ``norm_w`` for no norm). In the GEMV the lanes of a row see all of
  ``x`` anyway, so they add up its squares on the way: no separate pass, no barrier.
* **Residual add in the epilogue**: with ``accumulate=1`` the result is added to ``out`` (which
  holds the residual stream) instead of overwriting it.
* **The next op in the epilogue** (``gemv_qkv_rope``, ``gemv_swiglu`` at batch 1, their
  ``matmul_tc_decode`` twins for a decode batch): the work is split so that one thread ends up
  with the *pair* of outputs one result needs — rows ``i`` and ``i + E/2`` of a head (a RoPE
  rotation pair), or rows ``j`` and ``F + j`` of gate/up — so it rotates q and k and writes k
  and v to the paged pool, or applies SwiGLU, itself. Two launches (or grid barriers) a layer
  fewer (``executors/forward_ops.py`` skips the RoPE and SwiGLU ops then: ``fuses_next_op``;
  a host's gate/up of more than ``TC_SWIGLU_HOST_MAX_ROWS`` tokens, and its qkv of more than
  ``TC_DECODE_MAX_ROWS``, take ``matmul_tc``'s tile, which pairs its columns by relabelling
  them). A GEMV of 2 tokens keeps them apart (``FUSED_GEMV_MAX_ROWS``: measured, a fused
  warp's two rows cost more than the launch they save once there are several tokens).

Accumulation is float32 whatever the weights' dtype (float32 or float16).
"""

from __future__ import annotations

import math
import os

import numpy as np
from numba import float32

from ..backend import get_backend
from . import loads
from .loads import VEC, load8, load8_1d
from .elementwise import silu_times
from .matmul_tc import (launch_tc_linear, launch_tc_qkv_rope, launch_tc_swiglu, plus_bias,
                        store_output, takes_qkv_rope)
from .matmul_tc_decode import (tc_decode_items, tc_decode_linear, tc_decode_linear_kernel,
                               tc_decode_qkv_rope, tc_decode_qkv_rope_kernel, tc_decode_swiglu,
                               tc_decode_swiglu_kernel)
from .reduce import THREADS, cuda, grid_for, warp_sum
from .rope import pair_target, place_pair

# Decode batches up to this many tokens take the GEMV path. Measured on the H200 (the 135M
# shapes, ``tools/tc_matmul_probe.py``): the GEMV's time grows with every token (it reads each
# weight once a token, from L1 after the first); at 4 tokens the tensor-core kernels are faster.
GEMV_MAX_ROWS = 2
# Steps of up to this many tokens run gemv_qkv_rope and gemv_swiglu (the next op in the GEMV's
# epilogue). Their warp computes two rows, one token after the other, where the plain GEMV gives
# each row a warp: on the H200 (bench.decode at db4e630) the fused step at batch 1 was as fast as
# the unfused one (the 135M shape) or 3% faster (the bundled model), and at batch 8 15-20% slower.
FUSED_GEMV_MAX_ROWS = 1
# Batched steps of up to this many tokens take matmul_tc_decode's kernels (with float16 weights);
# more take matmul_tc's shared-memory tile in the eager and graph executors (qkv with RoPE in the
# tile's epilogue: not yet timed against matmul_tc_decode's at this boundary).
TC_DECODE_MAX_ROWS = 128
# ... but a host-launched gate/up (eager, graph) of more tokens than this takes the tensor-core
# tile with SwiGLU in its epilogue (``matmul_tc.launch_tc_swiglu``). Measured on the H200 with the
# weights streamed from HBM: at 64 / 128 tokens the tile's SwiGLU 15.0 / 15.0 µs, matmul_tc_decode's
# 16.4 / 23.3 (``tc_matmul_swiglu_h200_eecb88a.json``); at 32, matmul_tc_decode's 12.6 against 16.6
# for the tile then a SwiGLU kernel (``tc_matmul_probe_h200_c9c8812.json``; the tile's own SwiGLU
# not timed there). The persistent kernel has no tile (shared memory): it keeps
# matmul_tc_decode's fusion up to TC_DECODE_MAX_ROWS.
TC_SWIGLU_HOST_MAX_ROWS = 32
# Threads sharing one output row in the GEMV: a warp on a GPU, whose lanes add their partial sums
# with shuffles. Numba's simulator has no shuffles, so there each thread owns a whole row.
LANES = 1 if get_backend().is_simulator else 32
ROWS_PER_ITEM = THREADS // LANES  # output rows one block computes per GEMV work item
# Wide loads each lane has in flight at once in the GEMV's inner loop (``row_dots_wide`` writes
# its four out): 4 x 8 weights cover a 1024-wide row in one round. More would be issued for
# nothing on short rows and cost instructions, which at one warp per scheduler is what a small
# GEMV spends its time on.
UNROLL = 4
TILE = 32  # tiled path: TILE tokens x TILE outputs per work item, TILE-wide k steps
PER_THREAD = TILE * TILE // THREADS  # outputs each thread accumulates in the tiled path
TY_STEP = THREADS // TILE
# Shared-array shapes must be compile-time constants: Numba reads a global tuple as one.
TILE_SHAPE = (TILE, TILE + 1)  # one spare column per row: no shared-memory bank conflicts


def gemv_work_items(rows: int) -> int:
    """Work items of a GEMV over ``rows`` output rows (or row pairs): ROWS_PER_ITEM each."""
    return (rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM


gemv_items = cuda.jit(device=True, inline=True)(gemv_work_items)  # the same, in a kernel


@cuda.jit(device=True, inline=True)
def _one_lane(value):
    return value


lane_sum = _one_lane if LANES == 1 else warp_sum  # the sum over the lanes sharing a row


@cuda.jit(device=True, inline=True)
def dot8(a, b):
    return (a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]
            + a[4] * b[4] + a[5] * b[5] + a[6] * b[6] + a[7] * b[7])


@cuda.jit(device=True, inline=True)
def dot8_scaled(a, b, g):
    return (a[0] * b[0] * g[0] + a[1] * b[1] * g[1] + a[2] * b[2] * g[2] + a[3] * b[3] * g[3]
            + a[4] * b[4] * g[4] + a[5] * b[5] * g[5] + a[6] * b[6] * g[6] + a[7] * b[7] * g[7])


@cuda.jit(device=True, inline=True)
def add_dots8(x, xr, norm_w, w, o, o2, k, dot, dot2, squares):
    """(dot, dot2, squares) plus inputs k .. k + 7 of ``row_dots_wide``'s three sums."""
    if k < w.shape[1]:
        wk = load8(w, o, k)
        xk = load8(x, xr, k)
        if norm_w.shape[0] > 0:
            gk = load8_1d(norm_w, k)
            dot += dot8_scaled(wk, xk, gk)
            squares += dot8(xk, xk)
            if o2 >= 0:
                dot2 += dot8_scaled(load8(w, o2, k), xk, gk)
        else:
            dot += dot8(wk, xk)
            if o2 >= 0:
                dot2 += dot8(load8(w, o2, k), xk)
    return dot, dot2, squares


@cuda.jit(device=True, inline=True)
def row_dots_wide(x, xr, norm_w, w, o, o2, lane):
    """This lane's share of ((x[xr] * norm_w?) . w[o], the same for row ``o2`` (0 when
    ``o2 < 0``: one row), x[xr] . x[xr]), eight weights per load (``loads.py``): lane l reads
    w[o, 8l : 8l + 8], then 8 (l + LANES) ... Needs I % 8 == 0. The two rows' loads are in
    flight together — one wait for memory, not two — and share the loads of x; the sum of
    squares (for the RMS norm) comes from those loads too; 0 without a norm.

    Each round issues UNROLL (4) groups of loads before it uses any of them: written out four
    times, because Numba has no unroll pragma and LLVM leaves a loop body this large rolled
    (each group's loads would then wait for the group before it)."""
    dot, dot2, squares = float32(0), float32(0), float32(0)
    step = LANES * VEC
    for k in range(lane * VEC, w.shape[1], step * UNROLL):
        dot, dot2, squares = add_dots8(x, xr, norm_w, w, o, o2, k, dot, dot2, squares)
        dot, dot2, squares = add_dots8(x, xr, norm_w, w, o, o2, k + step, dot, dot2, squares)
        dot, dot2, squares = add_dots8(x, xr, norm_w, w, o, o2, k + 2 * step, dot, dot2,
                                       squares)
        dot, dot2, squares = add_dots8(x, xr, norm_w, w, o, o2, k + 3 * step, dot, dot2,
                                       squares)
    return dot, dot2, squares


@cuda.jit(device=True, inline=True)
def row_dots(x, xr, norm_w, w, o, o2, lane):
    """``row_dots_wide`` one element at a time (any I): elements lane, lane + LANES, ..."""
    I = w.shape[1]
    use_norm = norm_w.shape[0] > 0
    dot, dot2, squares = float32(0), float32(0), float32(0)
    for i0 in range(lane, I, LANES * UNROLL):
        for u in range(UNROLL):
            i = i0 + u * LANES
            if i < I:
                xi = x[xr, i]
                if use_norm:
                    xi_g = xi * norm_w[i]
                    squares += xi * xi
                else:
                    xi_g = xi
                dot += float32(w[o, i]) * xi_g
                if o2 >= 0:
                    dot2 += float32(w[o2, i]) * xi_g
    return dot, dot2, squares


@cuda.jit(device=True, inline=True)
def normed_row_dots(x, xr, norm_w, eps, w, o, o2, lane):
    """(rms_norm?(x[xr]) . w[o], the same for row ``o2``, or 0 when ``o2 < 0``), in every lane
    of the LANES sharing the rows. The norm rides along: (x * g) . w scaled by 1 / rms(x),
    whose sum of squares the lanes gathered from the x they loaded anyway, so the GEMV needs no
    separate pass over x, no shared memory, no barrier."""
    I = w.shape[1]
    if loads.WIDE_LOADS and I % VEC == 0:  # every row 16-byte aligned: wide loads
        dot, dot2, squares = row_dots_wide(x, xr, norm_w, w, o, o2, lane)
    else:
        dot, dot2, squares = row_dots(x, xr, norm_w, w, o, o2, lane)
    dot = lane_sum(dot)
    if o2 >= 0:
        dot2 = lane_sum(dot2)
    if norm_w.shape[0] > 0:
        inv_rms = float32(1) / math.sqrt(lane_sum(squares) / I + eps)
        dot *= inv_rms
        dot2 *= inv_rms
    return dot, dot2


@cuda.jit(device=True)
def gemv(x, x_rows, norm_w, eps, w, bias, out, accumulate, block, n_blocks):
    """out[r, :] (+)= rms_norm?(x[x_rows[r]]) @ w.T + bias for r < R <= GEMV_MAX_ROWS.

    A warp (``LANES`` threads) owns one output row; a work item is the block's ROWS_PER_ITEM
    consecutive rows."""
    tid = cuda.threadIdx.x
    lane = tid % LANES
    for item in range(block, gemv_items(w.shape[0]), n_blocks):
        o = item * ROWS_PER_ITEM + tid // LANES  # this warp's output row
        if o < w.shape[0]:  # a whole warp agrees, so the shuffles inside see all 32 lanes
            for r in range(x_rows.shape[0]):
                dot, _ = normed_row_dots(x, x_rows[r], norm_w, eps, w, o, -1, lane)
                if lane == 0:
                    store_output(out, r, o, dot, bias, accumulate)


@cuda.jit(device=True)
def gemv_swiglu(x, x_rows, norm_w, eps, w, bias, act, block, n_blocks):
    """act[r, j] = silu(g) * u, where g and u are rows j and F + j of
    rms_norm?(x[x_rows[r]]) @ w.T + bias: the gate/up GEMV with SwiGLU in its epilogue, for a
    decode batch (R <= GEMV_MAX_ROWS). w (2F, I) = [W_gate; W_up]; act (R, F). A warp owns the
    pair of rows one output needs, so gate/up never goes through memory."""
    tid = cuda.threadIdx.x
    lane = tid % LANES
    F = act.shape[1]
    for item in range(block, gemv_items(F), n_blocks):
        j = item * ROWS_PER_ITEM + tid // LANES
        if j < F:
            for r in range(x_rows.shape[0]):
                g, u = normed_row_dots(x, x_rows[r], norm_w, eps, w, j, F + j, lane)
                if lane == 0:
                    g, u = plus_bias(g, bias, j), plus_bias(u, bias, F + j)
                    act[r, j] = silu_times(g, u)


@cuda.jit(device=True)
def gemv_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables, cos,
                  sin, kv_pool, layer, num_heads, num_kv_heads, block, n_blocks):
    """The qkv GEMV of a decode batch (R <= GEMV_MAX_ROWS) with RoPE and the KV write in its
    epilogue (``rope.place_pair``): a warp owns rows i and i + E/2 of one head, a rotation pair,
    so it can rotate what it computed and put it where it goes — queries into qkv (T, ...),
    keys and values into token x_rows[r]'s paged slot of kv_pool (N, L, 2, B, K, E)."""
    tid = cuda.threadIdx.x
    lane = tid % LANES
    half = kv_pool.shape[5] // 2
    E = 2 * half
    pairs = (num_heads + 2 * num_kv_heads) * half
    for item in range(block, gemv_items(pairs), n_blocks):
        pair = item * ROWS_PER_ITEM + tid // LANES
        if pair < pairs:
            head, i = pair // half, pair % half
            o = head * E + i
            for r in range(x_rows.shape[0]):
                t = x_rows[r]
                # where the pair goes, read before it is computed: its loads overlap the dots'
                target = pair_target(positions, seq_rows, block_tables, cos, sin, t, i,
                                     kv_pool.shape[3])
                x1, x2 = normed_row_dots(x, t, norm_w, eps, w, o, o + half, lane)
                if lane == 0:
                    place_pair(qkv, t, head, i, plus_bias(x1, bias, o),
                               plus_bias(x2, bias, o + half), target, kv_pool, layer, num_heads,
                               num_kv_heads)


@cuda.jit(device=True, inline=True)
def tiled_matmul(x, x_rows, norm_w, eps, w, bias, out, accumulate, block, n_blocks):
    """The same contract as ``gemv`` for any number of rows, through shared-memory tiles."""
    tid = cuda.threadIdx.x
    tx = tid % TILE  # this thread's output column within the tile
    ty = tid // TILE  # and its first row; rows ty, ty + TY_STEP, ...
    R = x_rows.shape[0]
    O, I = w.shape
    use_norm = norm_w.shape[0] > 0
    xs = cuda.shared.array(TILE_SHAPE, float32)
    ws = cuda.shared.array(TILE_SHAPE, float32)
    inv = cuda.shared.array(TILE, float32)
    acc = cuda.local.array(PER_THREAD, float32)
    col_tiles = (O + TILE - 1) // TILE
    n_items = ((R + TILE - 1) // TILE) * col_tiles
    for item in range(block, n_items, n_blocks):
        r0 = (item // col_tiles) * TILE
        o0 = (item % col_tiles) * TILE
        if tid < TILE:  # the tile's per-token norm scales, one thread per token
            scale = float32(1)
            if use_norm and r0 + tid < R:
                row = x_rows[r0 + tid]
                total = float32(0)
                for i in range(I):
                    total += x[row, i] * x[row, i]
                scale = float32(1) / math.sqrt(total / I + eps)
            inv[tid] = scale
        for m in range(PER_THREAD):
            acc[m] = 0
        for k0 in range(0, I, TILE):
            for e in range(tid, TILE * TILE, THREADS):  # stage both tiles in shared memory
                a, k = e // TILE, e % TILE
                xv = float32(0)
                if r0 + a < R and k0 + k < I:
                    xv = x[x_rows[r0 + a], k0 + k]
                xs[a, k] = xv
                wv = float32(0)
                if o0 + a < O and k0 + k < I:
                    wv = float32(w[o0 + a, k0 + k])
                    if use_norm:
                        wv *= norm_w[k0 + k]
                ws[a, k] = wv
            cuda.syncthreads()
            for k in range(TILE):
                wk = ws[tx, k]
                for m in range(PER_THREAD):
                    acc[m] += xs[ty + m * TY_STEP, k] * wk
            cuda.syncthreads()
        o = o0 + tx
        for m in range(PER_THREAD):
            r = r0 + ty + m * TY_STEP
            if r < R and o < O:
                store_output(out, r, o, acc[m] * inv[ty + m * TY_STEP], bias, accumulate)
        cuda.syncthreads()


# BLINK_EDU_TENSOR_CORES=0 keeps batched steps on the FMA tile (to compare the two, as chapter 02's
# ladder does); read once, when this module is imported.
TENSOR_CORES = os.environ.get("BLINK_EDU_TENSOR_CORES", "1").strip() != "0"


@cuda.jit(device=True)
def linear(x, x_rows, norm_w, eps, w, bias, out, accumulate, tensor_cores, block, n_blocks):
    """out (R, O) (+)= rms_norm?(x[x_rows]) @ w.T + bias, in one kernel: the GEMV for a decode
    batch of up to GEMV_MAX_ROWS tokens; for more, ``matmul_tc_decode`` where ``tensor_cores``
    (``uses_tensor_cores``), else the FMA tile. x (T, I) f32; x_rows (R,) i32; norm_w (I,) or
    (0,); w (O, I) f32/f16; bias (O,) or (0,). The persistent kernel's forward runs it between
    two grid barriers; the eager and graph executors launch the kernel ``linear_path`` names."""
    if x_rows.shape[0] <= GEMV_MAX_ROWS:
        gemv(x, x_rows, norm_w, eps, w, bias, out, accumulate, block, n_blocks)
    elif tensor_cores:
        tc_decode_linear(x, x_rows, norm_w, eps, w, bias, out, accumulate,
                         loads.wide_rows(w), block, n_blocks)
    else:
        tiled_matmul(x, x_rows, norm_w, eps, w, bias, out, accumulate, block, n_blocks)


def uses_tensor_cores(weight_dtype) -> bool:
    """Whether batched steps with weights of this dtype run on tensor cores: float16 weights,
    unless BLINK_EDU_TENSOR_CORES=0 (float32 weights stay exact, on the FMA tile)."""
    return TENSOR_CORES and np.dtype(weight_dtype) == np.float16


def linear_path(num_rows: int, w) -> str:
    """Which kernel a plain linear layer (o, down, the LM head; qkv and gate/up when nothing is
    fused) over ``num_rows`` rows of weights ``w`` takes when a host launches it (eager, graph):
    "gemv", "tc_tile" (``matmul_tc``), "tc_decode" (``matmul_tc_decode``, only for an odd
    ``I``, which the tile cannot read) or "fma_tile". Measured on the H200
    (``tc_matmul_probe_h200_*.json``): from 4 tokens up the tile's split-K beats both the GEMV
    and ``matmul_tc_decode`` on these layers; what ``matmul_tc_decode`` wins is the qkv and
    gate/up projections *with* RoPE and SwiGLU in their epilogue (``fuses_next_op``). The one
    place this is decided; the persistent kernel's ``linear`` takes ``matmul_tc_decode`` instead
    of the tile (shared memory)."""
    if num_rows <= GEMV_MAX_ROWS:
        return "gemv"
    if not uses_tensor_cores(w.dtype):
        return "fma_tile"
    return "tc_decode" if w.shape[1] % 2 else "tc_tile"


def fuses_next_op(num_rows, tensor_cores, max_batched_rows):
    """Whether a projection of a step of ``num_rows`` tokens does the next op in its epilogue
    (``gemv_qkv_rope``/``gemv_swiglu`` at batch 1, their ``matmul_tc_decode`` twins — and for a
    host's gate/up the tensor-core tile — for a batch of up to ``max_batched_rows`` tokens on
    tensor cores), so that that op has nothing left to do."""
    return num_rows <= FUSED_GEMV_MAX_ROWS or (
        tensor_cores and GEMV_MAX_ROWS < num_rows <= max_batched_rows)


fuses_next_op_device = cuda.jit(device=True)(fuses_next_op)


@cuda.jit(device=True)
def linear_swiglu(x, x_rows, norm_w, eps, w, bias, act, block, n_blocks):
    """The gate/up projection with SwiGLU in its epilogue, for a step ``fuses_next_op`` fuses."""
    if x_rows.shape[0] <= FUSED_GEMV_MAX_ROWS:
        gemv_swiglu(x, x_rows, norm_w, eps, w, bias, act, block, n_blocks)
    else:
        tc_decode_swiglu(x, x_rows, norm_w, eps, w, bias, act,
                         loads.wide_rows(w), block, n_blocks)


@cuda.jit(device=True)
def linear_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables, cos,
                    sin, kv_pool, layer, num_heads, num_kv_heads, block, n_blocks):
    """The qkv projection with RoPE and the KV write in its epilogue, for a step
    ``fuses_next_op`` fuses."""
    if x_rows.shape[0] <= FUSED_GEMV_MAX_ROWS:
        gemv_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables,
                      cos, sin, kv_pool, layer, num_heads, num_kv_heads, block, n_blocks)
    else:
        tc_decode_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows,
                           block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads,
                           loads.wide_rows(w), block, n_blocks)


@cuda.jit
def linear_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate, tensor_cores):
    linear(x, x_rows, norm_w, eps, w, bias, out, accumulate, tensor_cores, cuda.blockIdx.x,
           cuda.gridDim.x)


@cuda.jit
def gemv_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    gemv(x, x_rows, norm_w, eps, w, bias, out, accumulate, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def gemv_swiglu_kernel(x, x_rows, norm_w, eps, w, bias, act):
    gemv_swiglu(x, x_rows, norm_w, eps, w, bias, act, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def gemv_qkv_rope_kernel(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables,
                         cos, sin, kv_pool, layer, num_heads, num_kv_heads):
    gemv_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows, block_tables, cos,
                  sin, kv_pool, layer, num_heads, num_kv_heads, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def tiled_matmul_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    tiled_matmul(x, x_rows, norm_w, eps, w, bias, out, accumulate, cuda.blockIdx.x, cuda.gridDim.x)


def launch_linear(x, x_rows, norm_w, eps, w, bias, out, accumulate, row_scale, stream,
                  num_sms: int) -> None:
    """out (R, O) (+)= rms_norm?(x[x_rows]) @ w.T + bias from the host, with the kernel
    ``linear_path`` names (so that a decode GEMV is not compiled beside a tile's shared arrays
    and registers). ``row_scale`` (>= R,) f32 scratch and ``num_sms`` serve the tensor-core tile."""
    R, O = x_rows.shape[0], w.shape[0]
    path = linear_path(R, w)
    if path == "tc_tile":
        launch_tc_linear(x, x_rows, norm_w, eps, w, bias, out, accumulate, row_scale, stream,
                         num_sms)
        return
    kernel = {"gemv": gemv_kernel, "tc_decode": tc_decode_linear_kernel,
              "fma_tile": tiled_matmul_kernel}[path]
    kernel[grid_for(linear_work_items(R, O, path == "tc_decode")), THREADS, stream](
        x, x_rows, norm_w, eps, w, bias, out, accumulate)


def launch_linear_swiglu(x, x_rows, norm_w, eps, w, bias, act, stream) -> None:
    """``linear_swiglu`` from the host, for a step ``fuses_next_op`` fuses: the GEMV's kernel at
    batch 1, ``matmul_tc_decode``'s up to TC_SWIGLU_HOST_MAX_ROWS tokens, the tensor-core tile's
    beyond (``matmul_tc.launch_tc_swiglu``; ``matmul_tc_decode``'s again for an odd hidden size,
    which the tile cannot read), each compiled without the others."""
    R, F = x_rows.shape[0], act.shape[1]
    if R > TC_SWIGLU_HOST_MAX_ROWS and w.shape[1] % 2 == 0:
        launch_tc_swiglu(x, x_rows, norm_w, eps, w, bias, act, stream)
        return
    kernel, items = ((gemv_swiglu_kernel, gemv_work_items(F)) if R <= FUSED_GEMV_MAX_ROWS
                     else (tc_decode_swiglu_kernel, tc_decode_items("swiglu", R, F)))
    kernel[grid_for(items), THREADS, stream](x, x_rows, norm_w, eps, w, bias, act)


def launch_linear_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows,
                           block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads,
                           stream) -> None:
    """``linear_qkv_rope`` from the host, for a step ``fuses_next_op`` fuses: the GEMV's kernel at
    batch 1, ``matmul_tc_decode``'s up to TC_DECODE_MAX_ROWS tokens, the tensor-core tile's
    beyond (``matmul_tc.launch_tc_qkv_rope``; ``matmul_tc_decode``'s again for weights or heads
    the tile cannot take)."""
    R, half = x_rows.shape[0], kv_pool.shape[5] // 2
    if R > TC_DECODE_MAX_ROWS and takes_qkv_rope(w, 2 * half):
        launch_tc_qkv_rope(x, x_rows, norm_w, eps, w, bias, qkv, positions, seq_rows,
                           block_tables, cos, sin, kv_pool, layer, num_heads, num_kv_heads, stream)
        return
    kernel, items = (
        (gemv_qkv_rope_kernel, gemv_work_items(w.shape[0] // 2)) if R <= FUSED_GEMV_MAX_ROWS
        else (tc_decode_qkv_rope_kernel,
              tc_decode_items("qkv_rope", R, num_heads + 2 * num_kv_heads, half)))
    kernel[grid_for(items), THREADS, stream](x, x_rows, norm_w, eps, w, bias, qkv, positions,
                                             seq_rows, block_tables, cos, sin, kv_pool, layer,
                                             num_heads, num_kv_heads)


def linear_work_items(num_rows: int, out_features: int, tensor_cores: bool = False) -> int:
    """How many work items ``linear`` has (to size the grid): GEMV row groups, or for a batched
    step ``matmul_tc_decode``'s column pairs x row groups (``tensor_cores``) or FMA tiles."""
    if num_rows <= GEMV_MAX_ROWS:
        return gemv_work_items(out_features)
    if tensor_cores:
        return tc_decode_items("linear", num_rows, out_features)
    return -(-num_rows // TILE) * -(-out_features // TILE)
