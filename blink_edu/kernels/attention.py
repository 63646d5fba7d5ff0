"""Paged attention over a ragged flat batch: every token attends to its own sequence's past.

A work item is one (token, query head) — or, when the batch has few of them, one *split* of a
(token, head): its context cut into spans walked by different blocks at once (flash-decoding,
Dao et al. 2023), so that a batch-1 step does not leave all but nine SMs idle. A block walks its
span — positions of the token's sequence, found through the block table — in chunks of
``THREADS`` positions:

1. each thread scores one position: ``s = q . k / sqrt(E)`` (the key read from its paged slot,
   eight dimensions a load — ``loads.py`` — all issued before the first is used), and writes
   down where that position lives (its KV block and slot) for the value pass;
2. an *online softmax* (Milakov & Gimelshein; FlashAttention) keeps a running max ``m`` and
   running sum ``l``: a new chunk with a larger max rescales what was accumulated by
   ``exp(m_old - m_new)``, so the scores never need to be stored beyond one chunk;
3. the threads split into groups that each accumulate ``acc += exp(s_j - m) * v_j`` over a share
   of the chunk's positions. With ``E % 8 == 0`` a group is ``E / 8`` threads, each owning 8
   dimensions read with one wide load (16 position groups at E = 64, so a 48-token context
   costs each thread three loads, all in flight at once); otherwise a group is ``E`` threads,
   thread ``e`` owning dimension ``e`` (consecutive threads on consecutive addresses). The
   positions' blocks and slots come from step 1 (shared memory), not from the block table again:
   a division and a dependent global load less a position.

At the end the groups' partial sums are added: ``out = acc / l`` when the span was the whole
context. A split instead leaves ``(acc, m, l)`` in ``partials`` and counts itself in
``arrivals``; the split that arrives last merges them — ``M = max m_s``,
``out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s`` — and resets the count, so no second
kernel and no barrier are needed (the "last block" pattern of CUDA's threadFenceReduction sample).
Both inner loops issue ``UNROLL`` loads before using any (see ``linear.py``: decode is
latency-bound). Grouped-query attention: query head ``h`` reads kv head ``h // (H / K)``.
Causality needs no mask: a token only walks positions ``<= p``, and this step's keys were
written (``rope.py``) before this kernel runs.

A prompt chunk on an fp16 model takes the tensor-core tile of ``attention_tc.py`` instead — one
work item a KV head and a tile of the chunk's tokens, each key read once a tile rather than once
a token; ``paged_attention`` picks per tile.
"""

from __future__ import annotations

import math
import os

import numpy as np
from numba import float32

from . import loads
from .attention_tc import (ROWS, WORKSPACE_WORDS, attend_tile, one_sequence, tc_attention_tiles,
                           tc_attention_tiles_device)
from .loads import VEC, load8_at, load_from_l2
from .reduce import (NEG_INF, THREADS, block_max, block_sum, cuda, divmod32,
                     kernel_for_blocks_per_sm, last_block_to_arrive)
from .rope import paged_slot

UNROLL = 8  # loads each thread has in flight in the inner loops
KEY_LOADS = 8  # wide loads of one key in flight at once: a whole 64-dim key, half a 128-dim one
PARTS = THREADS * VEC  # (THREADS / (E / 8)) position groups x E partial sums, at most
MAX_HEAD_DIM = max(THREADS, 128)  # E <= THREADS, or E % 8 == 0 with wide loads, up to this
# attend_token's shared memory (32-bit words): q, weights, scratch, parts, then each chunk
# position's KV block and slot (int32)
SCALAR_WORDS = MAX_HEAD_DIM + 4 * THREADS + PARTS
# One shared allocation serves both paths (the persistent kernel's shared memory is the sum of
# every op's): 32-bit words, seen as float32 by attend_token and as fp16 pairs by the tile.
WORKSPACE = max(SCALAR_WORDS, WORKSPACE_WORDS)


def span_from_environment(value: str | None) -> int:
    """The fewest KV positions a split walks, from ``BLINK_EDU_DECODE_SPAN`` (read once, at
    import; a compile-time constant, so that ``tools/attention_probe.py --decode`` can time
    several side by side). 0: never split."""
    span = int(value) if value and value.strip().isdigit() else (-1 if value else THREADS)
    if span < 0 or span % 32:
        raise ValueError(f"BLINK_EDU_DECODE_SPAN must be 0 or a multiple of 32, got {value!r}")
    return span


SPAN = span_from_environment(os.environ.get("BLINK_EDU_DECODE_SPAN")) or 1 << 30  # 0: no split
SPLIT_BLOCKS = 264  # split the (token, head) pairs while they are fewer than half this: 2 an H200 SM
MAX_SPLITS = 16  # splits of one (token, head), at most


def attention_splits(pairs):
    """Blocks each of ``pairs`` (token, head) pairs is split over: enough to give ~SPLIT_BLOCKS
    blocks work, and 1 when the pairs alone are many. ``pairs * splits <= SPLIT_BLOCKS`` whenever
    splits > 1: the rows ``partials`` needs."""
    if SPAN >= 1 << 30 or 2 * pairs > SPLIT_BLOCKS:
        return 1
    return min(MAX_SPLITS, SPLIT_BLOCKS // max(pairs, 1))


attention_splits_device = cuda.jit(device=True, inline=True)(attention_splits)


def span_of(context, splits):
    """Positions each split of a ``context``-long (token, head) walks: ``context / splits``
    rounded up to a multiple of SPAN (so a short context stays in one split)."""
    if splits == 1:
        return context
    quanta = -(-context // SPAN)  # SPAN-long pieces of the context
    return -(-quanta // splits) * SPAN


span_of_device = cuda.jit(device=True, inline=True)(span_of)


def attention_scratch(head_dim: int):
    """What the splits of ``paged_attention`` exchange: ``partials`` (SPLIT_BLOCKS, E + 2) f32,
    a split's (acc, m, l), and ``arrivals`` (SPLIT_BLOCKS,) i32, the splits of a (token, head)
    done so far (zeros: the merging split resets its count)."""
    return (cuda.device_array((SPLIT_BLOCKS, head_dim + 2), np.float32),
            cuda.to_device(np.zeros(SPLIT_BLOCKS, np.int32)))


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
def add_values_wide(acc8, weights, n, kv_pool, blocks, slots, layer, kvh, pg, pgroups, sl):
    """acc8 (8,) += sum over this thread's positions j of weights[j] * v_j[8 sl : 8 sl + 8]:
    position group ``pg`` of ``pgroups`` takes chunk positions pg, pg + pgroups, ...; each of
    its E / 8 threads owns 8 dimensions, read with one wide load a position (position j in
    ``kv_pool[blocks[j], layer, 1, slots[j]]``)."""
    for j0 in range(pg, n, pgroups * UNROLL):
        for u in range(UNROLL):
            j = j0 + u * pgroups
            if j < n:
                v8 = load8_at(kv_pool, (blocks[j], layer, 1, slots[j], kvh, sl * VEC))
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
def attend_token(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h, num_heads, group,
                 split, splits, out, partials, arrivals, workspace):
    """out[t, h * E : (h + 1) * E] for token ``t`` and query head ``h``, or this block's share of
    it: split ``split`` of ``splits`` (the module docstring); ``workspace``: shared float32
    (>= SCALAR_WORDS). Every thread of the block must call it."""
    tid = cuda.threadIdx.x
    B = kv_pool.shape[3]
    E = kv_pool.shape[5]
    context = positions[t] + 1
    span = span_of_device(context, splits)
    used = divmod32(context + span - 1, span)[0]  # splits with positions to walk
    if split >= used:
        return  # (the whole block)
    lo, hi = split * span, min(context, split * span + span)
    scale = float32(1) / math.sqrt(float32(E))
    wide = loads.WIDE_LOADS and E % VEC == 0  # values in wide loads: 8 dims a thread
    # (the divisions by a head size known only as the kernel runs: ``reduce.divmod32``)
    n_groups = divmod32(THREADS, E)[0]  # narrow: thread groups sharing the V accumulation
    g, e_own = divmod32(tid, E)  # this thread's group and output dimension (E threads a group)
    slices = E // VEC  # wide: threads a position, 8 dims each
    pgroups = divmod32(THREADS, max(slices, 1))[0]  # wide: position groups
    pg, sl = divmod32(tid, max(slices, 1))
    q = workspace[:MAX_HEAD_DIM]  # this item's query vector
    weights = workspace[MAX_HEAD_DIM:MAX_HEAD_DIM + THREADS]  # exp(score - m) of the chunk
    scratch = workspace[MAX_HEAD_DIM + THREADS:MAX_HEAD_DIM + 2 * THREADS]
    parts = workspace[MAX_HEAD_DIM + 2 * THREADS:SCALAR_WORDS - 2 * THREADS]  # groups' (E,) sums
    where = workspace.view(np.int32)[SCALAR_WORDS - 2 * THREADS:SCALAR_WORDS]
    blocks, slots = where[:THREADS], where[THREADS:]  # each chunk position's KV block and slot
    acc8 = cuda.local.array(VEC, float32)
    kvh = divmod32(h, group)[0]
    row = seq_rows[t]
    for e in range(tid, E, THREADS):
        q[e] = qkv[t, h * E + e]
    cuda.syncthreads()
    m = NEG_INF
    total = float32(0)
    acc = float32(0)
    for d in range(VEC):
        acc8[d] = 0
    for start in range(lo, hi, THREADS):
        c = start + tid
        score = NEG_INF
        if c < hi:
            blk, slot = paged_slot(block_tables, row, c, B)
            blocks[tid], slots[tid] = blk, slot
            score = score_of(q, kv_pool, blk, layer, slot, kvh, E) * scale
        m_new = max(m, block_max(score, scratch))
        w = math.exp(score - m_new) if c < hi else float32(0)
        weights[tid] = w
        rescale = math.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        total = total * rescale + block_sum(w, scratch)  # (its barrier publishes weights, blocks)
        acc *= rescale
        n = min(THREADS, hi - start)
        if wide:
            for d in range(VEC):
                acc8[d] *= rescale
            if pg < pgroups:
                add_values_wide(acc8, weights, n, kv_pool, blocks, slots, layer, kvh, pg,
                                pgroups, sl)
        elif g < n_groups:
            for j0 in range(g, n, n_groups * UNROLL):
                for u in range(UNROLL):
                    j = j0 + u * n_groups
                    if j < n:
                        acc += weights[j] * kv_pool[blocks[j], layer, 1, slots[j], kvh, e_own]
        m = m_new
        cuda.syncthreads()
    if wide:  # every group's (E,) partial sums side by side in ``parts``, then added
        if pg < pgroups:
            for d in range(VEC):
                parts[pg * E + sl * VEC + d] = acc8[d]
    elif g < n_groups:
        parts[g * E + e_own] = acc
    cuda.syncthreads()
    pair = t * num_heads + h
    for e in range(tid, E, THREADS):
        value = float32(0)  # acc[e]
        for j in range(pgroups if wide else n_groups):
            value += parts[j * E + e]
        if used == 1:
            out[t, h * E + e] = value / total
        else:
            partials[pair * splits + split, e] = value
    if used > 1:
        merge_splits(t, h, pair, split, splits, used, m, total, out, partials, arrivals, scratch)
    cuda.syncthreads()


@cuda.jit(device=True, inline=True)
def merge_splits(t, h, pair, split, splits, used, m, total, out, partials, arrivals, scratch):
    """Leave this split's m and l beside its acc in ``partials`` (row ``pair * splits + split``);
    the last of the ``used`` splits of (t, h) to arrive adds them all up into ``out``. Every
    thread of the block must call it."""
    tid = cuda.threadIdx.x
    E = partials.shape[1] - 2
    first = pair * splits  # the pair's rows of ``partials``
    if tid == 0:
        partials[first + split, E] = m
        partials[first + split, E + 1] = total
    if not last_block_to_arrive(arrivals, pair, used, scratch):
        return
    # the last split: read every split's partials from L2 (``loads.load_from_l2``)
    top = NEG_INF
    for s in range(used):
        top = max(top, load_from_l2(partials, first + s, E))
    for e in range(tid, E, THREADS):
        num, den = float32(0), float32(0)
        for s in range(used):
            f = math.exp(load_from_l2(partials, first + s, E) - top)
            num += f * load_from_l2(partials, first + s, e)
            den += f * load_from_l2(partials, first + s, E + 1)
        out[t, h * E + e] = num / den


def attention_work_items(num_tokens, num_heads, num_kv_heads, head_dim, tensor_cores):
    """Work items of ``paged_attention`` (to size the grid): a tile a KV head where
    ``tensor_cores``, then the splits of the (token, query head) pairs."""
    tiles = tc_attention_tiles(num_tokens, num_heads // num_kv_heads, head_dim) if tensor_cores else 0
    pairs = num_tokens * num_heads
    return tiles * num_kv_heads + pairs * attention_splits(pairs)


@cuda.jit(device=True, inline=True)
def paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, partials, arrivals, tensor_cores, block, n_blocks):
    """out (T, H * E) = softmax(q k^T / sqrt(E)) v per (token, head), q read from qkv (T, ...).
    Requires E <= THREADS, or E % 8 == 0 (with wide loads) and E <= MAX_HEAD_DIM. With
    ``tensor_cores`` (an fp16 model), a tile of consecutive tokens of one sequence — a prompt
    chunk — is one work item of ``attention_tc.attend_tile`` for a KV head; the tokens of the
    other tiles (a decode batch: one token a sequence) take ``attend_token``, one split of a
    (token, query head) an item. Items ``[0, tiles * K)`` are the tiles, the rest the splits.
    ``partials``, ``arrivals``: ``attention_scratch``."""
    T = qkv.shape[0]
    group = divmod32(num_heads, num_kv_heads)[0]
    tiles = 0
    if tensor_cores:
        tiles = tc_attention_tiles_device(T, group, kv_pool.shape[5])
    per_tile = divmod32(ROWS, group)[0]  # tokens a tile
    tile_items = tiles * num_kv_heads
    workspace = cuda.shared.array(WORKSPACE, float32)  # one allocation, every path's views
    if tensor_cores:  # (a constant False compiles the tile out)
        for item in range(block, tile_items, n_blocks):
            tile, kvh = divmod32(item, num_kv_heads)
            t0 = tile * per_tile
            n = min(per_tile, T - t0)
            if one_sequence(positions, seq_rows, t0, n):
                attend_tile(qkv, positions, seq_rows, block_tables, kv_pool, layer, group, kvh,
                            t0, n, out, workspace.view(np.uint32))
    # the splits of the (token, query head) pairs, on the blocks after the tiles', each a run of
    # consecutive items (a split's items on consecutive blocks while they are fewer than the
    # blocks; else a token's heads, then the next token's), so that a block asks once per tile,
    # not once per item, whether a tile took its tokens (four dependent loads: at 2048 prompt
    # tokens, 18 skipped items a block asked one after another took 30 µs on the H200)
    splits = attention_splits_device(T * num_heads)
    items = T * num_heads * splits
    first = divmod32(block + n_blocks - divmod32(tile_items, n_blocks)[1], n_blocks)[1]
    run = divmod32(items + n_blocks - 1, n_blocks)[0]  # items a block
    checked, in_tile = -1, False  # the last tile asked about, and the answer
    for item in range(first * run, min(items, first * run + run)):
        pair, split = divmod32(item, splits)
        t, h = divmod32(pair, num_heads)
        tile = divmod32(t, per_tile)[0]
        if tensor_cores and tiles > 0 and tile != checked:
            t0 = tile * per_tile
            checked, in_tile = tile, one_sequence(positions, seq_rows, t0, min(per_tile, T - t0))
        if not in_tile:
            attend_token(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h, num_heads,
                         group, split, splits, out, partials, arrivals, workspace)


@kernel_for_blocks_per_sm(5)  # 96 registers: 660 blocks at once, a b64 step's 576 in one wave
def paged_attention_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                           num_kv_heads, out, partials, arrivals):
    """``paged_attention`` of a decode step (no prompt tiles: a constant, so the tile is not even
    compiled in and its registers do not weigh on the per-token path's occupancy). Launch
    ``[grid_for(attention_work_items(T, H, K, E, False)), THREADS]``; ``partials``,
    ``arrivals``: ``attention_scratch(E)``."""
    paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, partials, arrivals, False, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def paged_attention_tc_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                              num_kv_heads, out, partials, arrivals):
    """``paged_attention`` of a step with prompt chunks on an fp16 model: tiles on tensor cores.
    Launch ``[grid_for(attention_work_items(T, H, K, E, True)), THREADS]``."""
    paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, partials, arrivals, True, cuda.blockIdx.x, cuda.gridDim.x)


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
