"""Paged attention over a ragged flat batch: every token attends to its own sequence's past.

A work item is one (token, query head). The block walks the token's context — positions
``0..p`` of its sequence, found through the block table — in chunks of ``THREADS`` positions:

1. each thread scores one position: ``s = q . k / sqrt(E)`` (the key read from its paged slot,
   eight dimensions a load — ``loads.py`` — all issued before the first is used);
2. an *online softmax* (Milakov & Gimelshein; FlashAttention) keeps a running max ``m`` and
   running sum ``l``: a new chunk with a larger max rescales what was accumulated by
   ``exp(m_old - m_new)``, so the scores never need to be stored beyond one chunk;
3. the threads split into groups that each accumulate ``acc += exp(s_j - m) * v_j`` over a share
   of the chunk's positions. With ``E % 8 == 0`` a group is ``E / 8`` threads, each owning 8
   dimensions read with one wide load (16 position groups at E = 64, so a 48-token context
   costs each thread three loads, all in flight at once); otherwise a group is ``E`` threads,
   thread ``e`` owning dimension ``e`` (consecutive threads on consecutive addresses).

At the end the groups' partial sums are added and ``out = acc / l``. Both inner loops issue
``UNROLL`` loads before using any (see ``linear.py``: decode is latency-bound). Grouped-query attention: query head ``h`` reads kv head
``h // (H / K)``. Causality needs no mask: a token only walks positions ``<= p``, and this
step's keys were written (``rope.py``) before this kernel runs.

That is the decode path (``attend_token``). ``attend_token_warp`` is its one-warp form, four
(token, head) pairs a block, its max and sum warp shuffles with no block barrier (Nsight Compute
found the block form's warps waiting at barriers 38% of the time, one warp a scheduler, at batch
1): a compile-time choice (``BLINK_EDU_DECODE_ATTENTION=warp``) until the H200 has timed the two
side by side (``tools/attention_probe.py --decode``). A prompt chunk on an fp16 model takes the tensor-core
tile of ``attention_tc.py`` instead — one work item a KV head and a tile of the chunk's tokens,
each key read once a tile rather than once a token; ``paged_attention`` picks per tile.
"""

from __future__ import annotations

import math
import os

import numpy as np
from numba import float32

from . import loads
from .attention_tc import (ROWS, WORKSPACE_WORDS, attend_tile, one_sequence, tc_attention_tiles,
                           tc_attention_tiles_device)
from .loads import VEC, load8_at
from .reduce import (NEG_INF, THREADS, WARP, block_max, block_sum, cuda, fold_lane_groups,
                     lanes_max, lanes_sum, warp_barrier)

UNROLL = 8  # loads each thread has in flight in the inner loops
KEY_LOADS = 8  # wide loads of one key in flight at once: a whole 64-dim key, half a 128-dim one
PARTS = THREADS * VEC  # (THREADS / (E / 8)) position groups x E partial sums, at most
SCALAR_WORDS = 3 * THREADS + PARTS  # attend_token's shared memory: q, weights, scratch, parts
MAX_HEAD_DIM = 128  # attend_token_warp: dims a lane owns, E / 32 <= 4
WARPS = THREADS // WARP
WARP_WORDS = MAX_HEAD_DIM + WARP  # attend_token_warp's shared memory a warp: q, then p


def decode_path(value: str | None) -> str:
    """The per-token path, from ``BLINK_EDU_DECODE_ATTENTION`` (read once, at import): "block" (a
    block a (token, head), the path measured so far) or "warp" (a warp a (token, head), four a
    block: no block barriers; to compare with ``tools/attention_probe.py --decode``)."""
    path = (value or "block").strip()
    if path not in ("block", "warp"):
        raise ValueError(f"BLINK_EDU_DECODE_ATTENTION must be block or warp, got {value!r}")
    return path


WARP_PAIRS = decode_path(os.environ.get("BLINK_EDU_DECODE_ATTENTION")) == "warp"
PAIRS_A_BLOCK = WARPS if WARP_PAIRS else 1  # (token, head) pairs a block serves at once
# One shared allocation serves both paths (the persistent kernel's shared memory is the sum of
# every op's): 32-bit words, seen as float32 by attend_token and as fp16 pairs by the tile.
WORKSPACE = max(SCALAR_WORDS, WARPS * WARP_WORDS, WORKSPACE_WORDS)


@cuda.jit(device=True, inline=True)
def score_of(q, kv_pool, blk, layer, slot, kvh, E):
    """q . k for the key in ``kv_pool[blk, layer, 0, slot, kvh, :]`` (q in shared memory)."""
    score = float32(0)
    if loads.WIDE_LOADS and E % VEC == 0:  # wide loads, 8 dims each, KEY_LOADS in flight
        for e0 in range(0, E, VEC * KEY_LOADS):
            for u in range(KEY_LOADS):  # a small constant trip count: unrolled
                e = e0 + u * VEC
                if e < E:
                    k8 = load8_at(kv_pool, (blk, layer, 0, slot, kvh, e))
                    score += (q[e] * k8[0] + q[e + 1] * k8[1] + q[e + 2] * k8[2]
                              + q[e + 3] * k8[3] + q[e + 4] * k8[4] + q[e + 5] * k8[5]
                              + q[e + 6] * k8[6] + q[e + 7] * k8[7])
        return score
    for e0 in range(0, E, UNROLL):
        for u in range(UNROLL):  # a constant trip count: unrolled, its loads issued together
            e = e0 + u
            if e < E:
                score += q[e] * kv_pool[blk, layer, 0, slot, kvh, e]
    return score


@cuda.jit(device=True, inline=True)
def add_values_wide(acc8, weights, n, start, kv_pool, block_tables, row, layer, kvh, pg, pgroups,
                    sl):
    """acc8 (8,) += sum over this thread's positions j of weights[j] * v_j[8 sl : 8 sl + 8]:
    position group ``pg`` of ``pgroups`` takes chunk positions pg, pg + pgroups, ...; each of
    its E / 8 threads owns 8 dimensions, read with one wide load a position."""
    B = kv_pool.shape[3]
    for j0 in range(pg, n, pgroups * UNROLL):
        for u in range(UNROLL):
            j = j0 + u * pgroups
            if j < n:
                c = start + j
                v8 = load8_at(kv_pool, (block_tables[row, c // B], layer, 1, c % B, kvh, sl * VEC))
                wj = weights[j]
                acc8[0] += wj * v8[0]
                acc8[1] += wj * v8[1]
                acc8[2] += wj * v8[2]
                acc8[3] += wj * v8[3]
                acc8[4] += wj * v8[4]
                acc8[5] += wj * v8[5]
                acc8[6] += wj * v8[6]
                acc8[7] += wj * v8[7]


@cuda.jit(device=True, inline=True)
def attend_token(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h, group, out,
                 workspace):
    """out[t, h * E : (h + 1) * E] for token ``t`` and query head ``h`` (the module docstring);
    ``workspace``: shared float32 (>= SCALAR_WORDS). Every thread of the block must call it."""
    tid = cuda.threadIdx.x
    B = kv_pool.shape[3]
    E = kv_pool.shape[5]
    scale = float32(1) / math.sqrt(float32(E))
    wide = loads.WIDE_LOADS and E % VEC == 0  # values in wide loads: 8 dims a thread
    n_groups = THREADS // E  # narrow: thread groups sharing the V accumulation, E threads each
    g, e_own = tid // E, tid % E  # this thread's group and output dimension
    slices = E // VEC  # wide: threads a position, 8 dims each
    pgroups = THREADS // max(slices, 1)  # wide: position groups
    pg, sl = tid // max(slices, 1), tid % max(slices, 1)
    q = workspace[:THREADS]  # this item's query vector (E <= THREADS)
    weights = workspace[THREADS:2 * THREADS]  # exp(score - m) of the current chunk
    scratch = workspace[2 * THREADS:3 * THREADS]
    parts = workspace[3 * THREADS:SCALAR_WORDS]  # each thread group's (E,) partial sums
    acc8 = cuda.local.array(VEC, float32)
    kvh = h // group
    row = seq_rows[t]
    context = positions[t] + 1
    if tid < E:
        q[tid] = qkv[t, h * E + tid]
    cuda.syncthreads()
    m = NEG_INF
    total = float32(0)
    acc = float32(0)
    for d in range(VEC):
        acc8[d] = 0
    for start in range(0, context, THREADS):
        c = start + tid
        score = NEG_INF
        if c < context:
            score = score_of(q, kv_pool, block_tables[row, c // B], layer, c % B, kvh, E) * scale
        m_new = max(m, block_max(score, scratch))
        w = math.exp(score - m_new) if c < context else float32(0)
        weights[tid] = w
        rescale = math.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        total = total * rescale + block_sum(w, scratch)  # (its barrier publishes weights)
        acc *= rescale
        n = min(THREADS, context - start)
        if wide:
            for d in range(VEC):
                acc8[d] *= rescale
            if pg < pgroups:
                add_values_wide(acc8, weights, n, start, kv_pool, block_tables, row, layer,
                                kvh, pg, pgroups, sl)
        elif g < n_groups:
            for j0 in range(g, n, n_groups * UNROLL):
                for u in range(UNROLL):
                    j = j0 + u * n_groups
                    if j < n:
                        c2 = start + j
                        acc += weights[j] * kv_pool[block_tables[row, c2 // B], layer, 1,
                                                    c2 % B, kvh, e_own]
        m = m_new
        cuda.syncthreads()
    if wide:  # every group's (E,) partial sums side by side in ``parts``, then added
        if pg < pgroups:
            for d in range(VEC):
                parts[pg * E + sl * VEC + d] = acc8[d]
    elif g < n_groups:
        parts[g * E + e_own] = acc
    cuda.syncthreads()
    if tid < E:
        value = float32(0)
        for j in range(pgroups if wide else n_groups):
            value += parts[j * E + tid]
        out[t, h * E + tid] = value / total
    cuda.syncthreads()


@cuda.jit(device=True, inline=True)
def attend_token_warp(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h, group, out,
                      q, p):
    """``attend_token``'s contract for one warp (E <= MAX_HEAD_DIM): lane j scores positions
    j, j + 32, ... of each chunk of 32; the max and the sum are warp shuffles, no block barrier;
    the values are added by position groups of E / 8 lanes, 8 dims a lane with one wide load
    (without wide loads: lane j owns dims j, j + 32, ... and walks every position), the groups
    folded by shuffles at the end. q (>= E,) and p (32,): this warp's shared floats. Every lane
    of the warp must call it."""
    lane = cuda.threadIdx.x % WARP
    B, E = kv_pool.shape[3], kv_pool.shape[5]
    kvh, row, context = h // group, seq_rows[t], positions[t] + 1
    for e in range(lane, E, WARP):
        q[e] = qkv[t, h * E + e]
    warp_barrier()
    # wide: E / 8 lanes a position, a power of two so that the groups fold by shuffles
    wide = loads.WIDE_LOADS and E % VEC == 0 and (E // VEC) & (E // VEC - 1) == 0
    slices = E // VEC if wide else 1  # lanes a position (wide: 8 dims each)
    pgroups = WARP // slices if wide else 1
    pg, sl = lane // slices, lane % slices
    scale = float32(1) / math.sqrt(float32(E))
    acc8 = cuda.local.array(VEC, float32)  # wide: dims 8 sl ..; else dims lane + 32 d
    for d in range(VEC):
        acc8[d] = 0
    m, total = NEG_INF, float32(0)
    for start in range(0, context, WARP):
        c = start + lane
        score = NEG_INF
        if c < context:
            score = score_of(q, kv_pool, block_tables[row, c // B], layer, c % B, kvh, E) * scale
        m_new = max(m, lanes_max(score))
        w = math.exp(score - m_new) if c < context else float32(0)
        rescale = math.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        total = total * rescale + lanes_sum(w)
        p[lane] = w
        warp_barrier()
        for d in range(VEC):
            acc8[d] *= rescale
        n = min(WARP, context - start)
        if wide:
            if pg < pgroups:
                add_values_wide(acc8, p, n, start, kv_pool, block_tables, row, layer, kvh, pg,
                                pgroups, sl)
        else:
            for j in range(n):
                c2 = start + j
                blk = block_tables[row, c2 // B]
                for d in range(MAX_HEAD_DIM // WARP):
                    if lane + d * WARP < E:
                        acc8[d] += p[j] * kv_pool[blk, layer, 1, c2 % B, kvh, lane + d * WARP]
        m = m_new
        warp_barrier()  # p is rewritten by the next chunk
    if wide:
        fold_lane_groups(acc8, VEC, slices)
        if pg == 0:
            for d in range(VEC):
                out[t, h * E + sl * VEC + d] = acc8[d] / total
    else:
        for d in range(MAX_HEAD_DIM // WARP):
            if lane + d * WARP < E:
                out[t, h * E + lane + d * WARP] = acc8[d] / total
    warp_barrier()  # q is rewritten by the next item


def attention_work_items(num_tokens, num_heads, num_kv_heads, head_dim, tensor_cores):
    """Work items of ``paged_attention`` (to size the grid): a tile a KV head where
    ``tensor_cores``, then the (token, query head) pairs, PAIRS_A_BLOCK a block."""
    tiles = tc_attention_tiles(num_tokens, num_heads // num_kv_heads, head_dim) if tensor_cores else 0
    return tiles * num_kv_heads + -(-num_tokens * num_heads // PAIRS_A_BLOCK)


@cuda.jit(device=True, inline=True)
def paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, tensor_cores, block, n_blocks):
    """out (T, H * E) = softmax(q k^T / sqrt(E)) v per (token, head), q read from qkv (T, ...).
    Requires E <= THREADS (block pairs) or E <= MAX_HEAD_DIM (warp pairs, ``WARP_PAIRS``).
    With ``tensor_cores`` (an fp16 model), a tile of consecutive tokens of
    one sequence — a prompt chunk — is one work item of ``attention_tc.attend_tile``; the tokens
    of the other tiles (a decode batch: one token a sequence) take ``attend_token``, one
    (token, query head) an item. Items ``[0, tiles * K)`` are the tiles, the rest the pairs."""
    T = qkv.shape[0]
    group = num_heads // num_kv_heads
    tiles = 0
    if tensor_cores:
        tiles = tc_attention_tiles_device(T, group, kv_pool.shape[5])
    per_tile = ROWS // group  # tokens a tile
    tile_items = tiles * num_kv_heads
    workspace = cuda.shared.array(WORKSPACE, float32)  # one allocation, every path's views
    if tensor_cores:  # (a constant False compiles the tile out)
        for item in range(block, tile_items, n_blocks):
            tile, kvh = item // num_kv_heads, item % num_kv_heads
            t0 = tile * per_tile
            n = min(per_tile, T - t0)
            if one_sequence(positions, seq_rows, t0, n):
                attend_tile(qkv, positions, seq_rows, block_tables, kv_pool, layer, group, kvh,
                            t0, n, out, workspace.view(np.uint32))
    # the (token, query head) pairs: items after the tiles, PAIRS_A_BLOCK of them a block
    warp = cuda.threadIdx.x // WARP if WARP_PAIRS else 0
    first = (block - tile_items % n_blocks + n_blocks) % n_blocks  # the block after the tiles
    for pair in range(first * PAIRS_A_BLOCK + warp, T * num_heads, n_blocks * PAIRS_A_BLOCK):
        t, h = pair // num_heads, pair % num_heads
        t0 = (t // per_tile) * per_tile
        if not tensor_cores or tiles == 0 or not one_sequence(positions, seq_rows, t0,
                                                             min(per_tile, T - t0)):
            if WARP_PAIRS:
                q = workspace[warp * WARP_WORDS:warp * WARP_WORDS + MAX_HEAD_DIM]
                p = workspace[warp * WARP_WORDS + MAX_HEAD_DIM:(warp + 1) * WARP_WORDS]
                attend_token_warp(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h,
                                  group, out, q, p)
            else:
                attend_token(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h, group,
                             out, workspace)


@cuda.jit
def paged_attention_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                           num_kv_heads, out):
    """``paged_attention`` of a decode step (no prompt tiles: a constant, so the tile is not even
    compiled in and its registers do not weigh on the per-token path's occupancy). Launch
    ``[grid_for(T * H), THREADS]``."""
    paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, False, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def paged_attention_tc_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                              num_kv_heads, out):
    """``paged_attention`` of a step with prompt chunks on an fp16 model: tiles on tensor cores.
    Launch ``[grid_for(attention_work_items(T, H, K, E, True)), THREADS]``."""
    paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, True, cuda.blockIdx.x, cuda.gridDim.x)


def uses_attention_tiles(tensor_cores: bool, has_prompt_chunks: bool, group: int,
                         head_dim: int) -> bool:
    """Whether a host launches ``paged_attention_tc_kernel``: a step that may hold a prompt chunk,
    on tensor cores, with heads the tile takes. Otherwise ``paged_attention_kernel``, compiled
    without the tile: the tile's registers (220 against 100) would cost the per-token path its
    occupancy — measured on the H200 at f2829c2, where the bundled model's 32-dim heads (no tile)
    ran their 512-token prefill attention in 1568 µs inside the tile's kernel against 978 µs in
    its own (decode_h200_f2829c2.json, decode_h200_7750320.json)."""
    return bool(tensor_cores and has_prompt_chunks and tc_attention_tiles(1, group, head_dim))


def attention_kernel(tiles: bool):
    """The kernel a host launches (``uses_attention_tiles`` says which)."""
    return paged_attention_tc_kernel if tiles else paged_attention_kernel
