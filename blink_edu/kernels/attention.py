"""Paged attention over a ragged flat batch: every token attends to its own sequence's past.

A work item is one (token, query head), and a **warp** takes it on its own — or, when the batch
has few of them, one *split* of a (token, head): its context cut into spans walked by different
warps at once (flash-decoding, Dao et al. 2023), so that a batch-1 step does not leave all but a
few SMs idle. A block's warps take different items: no barrier for the whole block, so an item
costs what its own loads cost. The warp walks its span — positions of the token's sequence,
found through the block table — in chunks of 32 positions, one a lane:

1. each lane scores its position: ``s = q . k / sqrt(E)``, the key read from its paged slot eight
   dimensions a load (``loads.py``), all issued before the first is used; the lane also notes
   where the position's value lives (a row of the pool seen as E-long rows), in shared memory;
2. an *online softmax* (Milakov & Gimelshein; FlashAttention) keeps a running max ``m`` and
   running sum ``l`` — reduced over the warp's lanes with shuffles: a new chunk with a larger max
   rescales what was accumulated by ``exp(m_old - m_new)``, so the scores never need to be
   stored beyond one chunk;
3. the lanes turn to the values: lane ``l`` owns dimensions ``l, l + 32, ...`` of the output and
   adds ``exp(s_j - m) * v_j`` over the chunk's positions — the 32 lanes read a value row as one
   coalesced access, ``UNROLL`` positions' loads in flight at once.

Addresses are flat: the 6-d pool ``(N, L, 2, B, K, E)`` is indexed as one vector, one multiply-add
an address where an index tuple costs one per dimension — on a GPU an item this small is bound
by its instructions, not its bytes (docs/design.md §5). At the end ``out = acc / l`` when the
span was the whole context. A split instead leaves ``(acc, m, l)`` in ``partials`` and counts
itself in ``arrivals``; the split that arrives last merges them — ``M = max m_s``,
``out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s`` — and resets the count, so no second
kernel and no barrier are needed (the "last block" pattern of CUDA's threadFenceReduction
sample, here the last warp). Grouped-query attention: query head ``h`` reads kv head
``h // (H / K)``. Causality needs no mask: a token only walks positions ``<= p``, and this step's
keys were written (``rope.py``) before this kernel runs.

A prompt chunk on an fp16 model takes the tensor-core tile of ``attention_tc.py`` instead — one
work item a KV head and a tile of the chunk's tokens, each key read once a tile rather than once
a token; ``paged_attention`` picks per tile.
"""

from __future__ import annotations

import math
import os

import numpy as np
from numba import float32, int32, int64

from . import loads
from .attention_tc import (ROWS, WORKSPACE_WORDS, attend_tile, one_sequence, tc_attention_tiles,
                           tc_attention_tiles_device)
from .loads import VEC, load1_flat, load4_flat, load8_at
from .reduce import (NEG_INF, THREADS, WARP, cuda, kernel_for_blocks_per_sm, lanes_max, lanes_sum,
                     sync_lanes)

UNROLL = 8  # value loads each lane has in flight in the inner loop
KEY_LOADS = 4  # wide loads of one key in flight at once: half a 64-dim key
WARPS = THREADS // WARP  # warps a block: each takes its own (token, head) work items
MAX_HEAD_DIM = 4 * WARP  # E <= 128: a lane accumulates dimensions lane, lane + 32, lane + 64, ...
# a warp's shared memory (32-bit words): weights, value rows, scratch, the groups' partial sums
WARP_WORDS = 3 * WARP + WARP * VEC
# One shared allocation serves both paths (the persistent kernel's shared memory is the sum of
# every op's): 32-bit words, seen as float32 and int32 by the warps and as fp16 pairs by the tile.
WORKSPACE = max(WARPS * WARP_WORDS, WORKSPACE_WORDS)


def span_from_environment(value: str | None) -> int:
    """The fewest KV positions a split walks, from ``BLINK_EDU_DECODE_SPAN`` (read once, at
    import; a compile-time constant, so that ``tools/attention_probe.py --decode`` can time
    several side by side). 0: never split."""
    span = int(value) if value and value.strip().isdigit() else (-1 if value else 2 * WARP)
    if span < 0 or span % 32:
        raise ValueError(f"BLINK_EDU_DECODE_SPAN must be 0 or a multiple of 32, got {value!r}")
    return span


SPAN = span_from_environment(os.environ.get("BLINK_EDU_DECODE_SPAN")) or 1 << 30  # 0: no split
# Split the (token, head) pairs while they are fewer than half this: 16 warps an H200 SM, which
# holds 3 of the kernel's blocks (12 warps) at once — a batch-64 step's 576 pairs split 3 ways
# when their contexts are long, a batch-128 step's 1152 not at all.
SPLIT_ITEMS = 2112
MAX_SPLITS = 16  # splits of one (token, head), at most


def attention_splits(pairs):
    """Warps each of ``pairs`` (token, head) pairs is split over: enough to give ~SPLIT_ITEMS
    warps work, and 1 when the pairs alone are many. ``pairs * splits <= SPLIT_ITEMS`` whenever
    splits > 1: the rows ``partials`` needs."""
    if SPAN >= 1 << 30 or 2 * pairs > SPLIT_ITEMS:
        return 1
    return min(MAX_SPLITS, SPLIT_ITEMS // max(pairs, 1))


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
    """What the splits of ``paged_attention`` exchange: ``partials`` (SPLIT_ITEMS, E + 2) f32,
    a split's (acc, m, l), and ``arrivals`` (SPLIT_ITEMS,) i32, the splits of a (token, head)
    done so far (zeros: the merging split resets its count)."""
    return (cuda.device_array((SPLIT_ITEMS, head_dim + 2), np.float32),
            cuda.to_device(np.zeros(SPLIT_ITEMS, np.int32)))


@cuda.jit(device=True, inline=True)
def key_dot(qkv, t, q_col, kv_pool, key, E):
    """q . k: q = ``qkv[t, q_col : q_col + E]``, k the E numbers of ``kv_pool`` from ``key`` on
    (a flat offset: the pool seen as one vector). Wide loads when E % 8 == 0, KEY_LOADS of them in flight."""
    score = float32(0)
    if loads.WIDE_LOADS and E % VEC == 0:
        for e0 in range(0, E, VEC * KEY_LOADS):
            for u in range(KEY_LOADS):  # a constant trip count: unrolled, and no branch in it
                e = e0 + u * VEC  # (past E: the last 8 again, counted as 0)
                at = min(e, E - VEC)
                k_lo = load4_flat(kv_pool, key + at)
                k_hi = load4_flat(kv_pool, key + at + 4)
                q = load8_at(qkv, (t, q_col + at))
                part = (q[0] * k_lo[0] + q[1] * k_lo[1] + q[2] * k_lo[2] + q[3] * k_lo[3]
                        + q[4] * k_hi[0] + q[5] * k_hi[1] + q[6] * k_hi[2] + q[7] * k_hi[3])
                score += part if e < E else float32(0)
        return score
    for e0 in range(0, E, UNROLL):
        for u in range(UNROLL):  # a constant trip count: unrolled, its loads issued together
            e = e0 + u
            if e < E:
                score += qkv[t, q_col + e] * load1_flat(kv_pool, key + e)
    return score


@cuda.jit(device=True, inline=True)
def add_values_wide(acc, weights, value_rows, n, kv_pool, E, lane):
    """acc (8,) += sum over this lane's positions j of weights[j] * v_j[8 sl : 8 sl + 8]: the lanes
    split into position groups of E / 8 lanes, group ``g`` taking the chunk's positions g,
    g + groups, ..., each lane ``sl`` of it 8 dimensions in one wide load a position — so the
    warp reads ``groups`` value rows at once, and a lane has its UNROLL loads in flight together.
    Position j's value is row ``value_rows[j]`` of the pool seen as E-long rows."""
    slices = E // VEC
    groups = WARP // slices
    g, sl = lane // slices, lane % slices
    if g < groups:
        for j0 in range(g, n, groups * UNROLL):
            for u in range(UNROLL):  # a constant trip count: unrolled, and no branch in it
                j = j0 + u * groups  # (past the chunk: a real row again, weighted 0)
                at = int64(value_rows[min(j, WARP - 1)]) * E + sl * VEC
                v_lo = load4_flat(kv_pool, at)
                v_hi = load4_flat(kv_pool, at + 4)
                w = weights[min(j, WARP - 1)] if j < n else float32(0)
                for d in range(4):
                    acc[d] += w * v_lo[d]
                    acc[4 + d] += w * v_hi[d]


@cuda.jit(device=True, inline=True)
def add_values_narrow(acc, weights, value_rows, n, kv_pool, E, lane):
    """The same where E % 8 != 0 (or without wide loads): lane ``l`` owns dimensions l, l + 32,
    l + 64, l + 96 (those < E) in acc[0..3], one 4-byte load each a position."""
    for j0 in range(0, n, UNROLL):
        for u in range(UNROLL):
            j = j0 + u
            if j < n:
                w = weights[j]
                at = int64(value_rows[j]) * E + lane
                for i in range(4):
                    if lane + WARP * i < E:
                        acc[i] += w * load1_flat(kv_pool, at + WARP * i)


@cuda.jit(device=True, inline=True)
def attend_warp(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h, group, pair,
                split, splits, out, partials, arrivals, mine):
    """out[t, h * E : (h + 1) * E] for token ``t`` and query head ``h``, or this warp's share of
    it: split ``split`` of ``splits`` (the module docstring). ``mine``: the warp's shared float32
    (WARP_WORDS). Every lane of the warp must call it; no other warp takes part."""
    lane = cuda.threadIdx.x % WARP
    L, B, K, E = kv_pool.shape[1], kv_pool.shape[3], kv_pool.shape[4], kv_pool.shape[5]
    context = positions[t] + 1
    span = span_of_device(context, splits)
    used = -(-context // span)  # splits with positions to walk
    if split >= used:
        return  # (the whole warp)
    lo, hi = split * span, min(context, split * span + span)
    scale = float32(1) / math.sqrt(float32(E))
    wide = loads.WIDE_LOADS and E % VEC == 0
    # the pool as E-long rows: kv_pool[blk, layer, 0, slot, kvh] is row
    # blk * block_rows + slot * K + key_rows, and its value row value_shift further
    block_rows = L * 2 * B * K
    key_rows = layer * 2 * B * K + h // group
    value_shift = B * K
    weights = mine[:WARP]  # exp(score - m) of the chunk's positions
    value_rows = mine.view(np.int32)[WARP:2 * WARP]  # each chunk position's value row
    scratch = mine[2 * WARP:3 * WARP]  # the simulator's reductions
    parts = mine[3 * WARP:WARP_WORDS]  # the position groups' (E,) sums, side by side
    acc = cuda.local.array(VEC, float32)  # this lane's share of the output (see add_values_*)
    for d in range(VEC):
        acc[d] = 0
    row, q_col = seq_rows[t], h * E
    m = NEG_INF
    total = float32(0)
    for start in range(lo, hi, WARP):
        c = start + lane  # this lane's position
        score = NEG_INF
        key = int32(0)
        if c < hi:
            page = c // B
            key = block_tables[row, page] * block_rows + (c - page * B) * K + key_rows
            score = key_dot(qkv, t, q_col, kv_pool, int64(key) * E, E) * scale
        m_new = max(m, lanes_max(score, scratch))
        w = math.exp(score - m_new) if c < hi else float32(0)
        rescale = math.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        total = total * rescale + lanes_sum(w, scratch)
        weights[lane] = w
        value_rows[lane] = key + value_shift
        sync_lanes()  # the chunk's weights and rows, for every lane
        for d in range(VEC):
            acc[d] *= rescale
        n = min(WARP, hi - start)
        if wide:
            add_values_wide(acc, weights, value_rows, n, kv_pool, E, lane)
        else:
            add_values_narrow(acc, weights, value_rows, n, kv_pool, E, lane)
        m = m_new
        sync_lanes()  # every lane is done with them before the next chunk's
    groups = WARP // (E // VEC) if wide else 1
    if wide and lane < groups * (E // VEC):
        for d in range(VEC):
            parts[(lane // (E // VEC)) * E + (lane % (E // VEC)) * VEC + d] = acc[d]
    elif not wide:
        for i in range(4):
            if lane + WARP * i < E:
                parts[lane + WARP * i] = acc[i]
    sync_lanes()
    for e in range(lane, E, WARP):
        value = float32(0)  # acc[e], the groups added
        for g in range(groups):
            value += parts[g * E + e]
        if used == 1:
            out[t, q_col + e] = value / total
        else:
            partials[pair * splits + split, e] = value
    if used > 1:
        merge_splits(t, q_col, pair, split, splits, used, m, total, out, partials, arrivals,
                     scratch)
    sync_lanes()  # every lane is done with ``parts`` before the warp's next item


@cuda.jit(device=True, inline=True)
def merge_splits(t, q_col, pair, split, splits, used, m, total, out, partials, arrivals,
                 scratch):
    """Leave this split's m and l beside its acc in ``partials`` (row ``pair * splits + split``);
    the last of the ``used`` splits of (t, h) to arrive adds them all up into ``out[t, q_col:]``.
    Every lane of the warp must call it."""
    lane = cuda.threadIdx.x % WARP
    E = partials.shape[1] - 2
    first = pair * splits  # the pair's rows of ``partials``
    if lane == 0:
        partials[first + split, E] = m
        partials[first + split, E + 1] = total
    cuda.threadfence()  # this lane's partials reach L2 before the warp's arrival is counted
    sync_lanes()
    last = float32(0)
    if lane == 0:
        arrived = cuda.atomic.add(arrivals, pair, 1)
        if arrived == used - 1:
            arrivals[pair] = 0  # ready for the next layer (after a kernel or grid barrier)
            last = float32(1)
    if lanes_sum(last, scratch) == 0:
        return
    # the last split: read every split's partials through L2 (an atomic add of 0: another SM's
    # writes, which this SM's L1 may hold an older copy of from an earlier layer)
    top = NEG_INF
    for s in range(used):
        top = max(top, cuda.atomic.add(partials, (first + s, E), float32(0)))
    for e in range(lane, E, WARP):
        num, den = float32(0), float32(0)
        for s in range(used):
            f = math.exp(cuda.atomic.add(partials, (first + s, E), float32(0)) - top)
            num += f * cuda.atomic.add(partials, (first + s, e), float32(0))
            den += f * cuda.atomic.add(partials, (first + s, E + 1), float32(0))
        out[t, q_col + e] = num / den


def attention_work_items(num_tokens, num_heads, num_kv_heads, head_dim, tensor_cores):
    """Blocks' worth of work items of ``paged_attention`` (to size the grid): a tile a KV head
    where ``tensor_cores``, then the splits of the (token, query head) pairs, WARPS a block."""
    tiles = tc_attention_tiles(num_tokens, num_heads // num_kv_heads, head_dim) if tensor_cores else 0
    pairs = num_tokens * num_heads
    return tiles * num_kv_heads + -(-pairs * attention_splits(pairs) // WARPS)


@cuda.jit(device=True, inline=True)
def paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, partials, arrivals, tensor_cores, block, n_blocks):
    """out (T, H * E) = softmax(q k^T / sqrt(E)) v per (token, head), q read from qkv (T, ...).
    Requires E <= MAX_HEAD_DIM, and a C-contiguous float32 ``kv_pool``. With ``tensor_cores``
    (an fp16 model), a tile of consecutive tokens of one sequence — a prompt chunk — is one
    block's work item of ``attention_tc.attend_tile`` for a KV head; the tokens of the other
    tiles (a decode batch: one token a sequence) take ``attend_warp``, one split of a (token,
    query head) a warp. Items ``[0, tiles * K)`` are the tiles, the rest the splits.
    ``partials``, ``arrivals``: ``attention_scratch``."""
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
        cuda.syncthreads()  # the tiles are done with the workspace: the warps' turn
    # the splits of the (token, query head) pairs: a warp each, from the block after the tiles
    # on — every pair's first split, then every pair's second, ...: with short contexts only the
    # first splits have positions to walk, and the blocks of the others, launched last, find
    # nothing to do and leave at once
    warp = cuda.threadIdx.x // WARP
    mine = workspace[warp * WARP_WORDS:(warp + 1) * WARP_WORDS]
    splits = attention_splits_device(T * num_heads)
    first = (block - tile_items % n_blocks + n_blocks) % n_blocks  # the block after the tiles
    for item in range(first * WARPS + warp, T * num_heads * splits, n_blocks * WARPS):
        split, pair = item // (T * num_heads), item % (T * num_heads)
        t, h = pair // num_heads, pair % num_heads
        t0 = (t // per_tile) * per_tile
        if not tensor_cores or tiles == 0 or not one_sequence(positions, seq_rows, t0,
                                                             min(per_tile, T - t0)):
            attend_warp(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, h, group,
                        pair, split, splits, out, partials, arrivals, mine)


@kernel_for_blocks_per_sm(3)
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
