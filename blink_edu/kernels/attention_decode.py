"""Decode attention a KV head's query group at a time, and the splits that spread a few of them.

Blink §4's decode steps (docs/design.md §2.3): each sequence of the batch brings one new token,
whose query heads attend to the sequence's whole past. With grouped-query attention the ``G = H /
K`` query heads of a KV head read the *same* keys and values; a work item of one (token, query
head) reads them ``G`` times. Here a work item is one (token, KV head) — a *pair* — and a block
serves all of its group's query heads from each key and value it reads (``HEADS`` heads a pass).

**The walk.** The block's ``WARPS`` warps share the item's positions out in chunks of 32: warp
``w`` takes chunks ``w, w + WARPS, ...``, each warp on its own with an online softmax (Milakov &
Gimelshein; FlashAttention) — no block barrier inside the walk. Per chunk, in one warp:

1. **scores**, a lane a position: the lane finds its position's KV block and slot (block table),
   reads the whole key with 16-byte loads — all issued before the first is used, since a decode
   step is latency-bound — and takes its dot product with each head's query (queries in shared
   memory, ``1 / sqrt(E)`` folded in; every lane reads the same word: a broadcast);
2. **the softmax update**, per head: the chunk's max and sum over the warp's lanes (shuffles),
   the running max ``m`` and sum ``l``; a larger max rescales what was accumulated by
   ``exp(m_old - m_new)``. Each lane leaves its ``p = exp(s - m)`` and its position's block and
   slot in shared memory;
3. **values**, ``E / 4`` lanes a position, each owning four dimensions (one 16-byte load): the
   warp's lanes split into ``32 / (E / 4)`` position groups walking the chunk's positions, and
   accumulate ``acc[h] += p_h * v`` for every head.

At the end the position groups' sums are added (shuffles), each warp leaves its ``(m, l, acc)``
per head in shared memory, one barrier, and the block merges its warps:
``M = max m_w``, ``out = sum_w exp(m_w - M) acc_w / sum_w exp(m_w - M) l_w``.

**Splits** (flash-decoding, Dao et al. 2023). A step with few pairs — a batch of one or a few
sequences — would leave most SMs idle, so each pair's context is cut into spans walked by
``splits`` blocks at once (``attention_splits``, ``span_of``). A split leaves its ``(acc, m, l)``
per head in ``partials`` and counts itself in ``arrivals``; the split that arrives last merges
them with the same formula over splits and resets the count — no second kernel, no barrier (the
"last block" pattern of CUDA's threadFenceReduction sample). ``attention.attend_token``, the
path for head sizes this one does not take, splits and merges the same way (``last_to_arrive``,
``merged_rows``).

Simulator: one warp a block, shared memory and a barrier where a GPU shuffles (``reduce.py``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import float32

from .loads import load4_flat
from .reduce import (NEG_INF, SIMULATOR, THREADS, WARP, cuda, lanes_max, lanes_sum, warp_barrier)
from .rope import paged_slot

WARPS = THREADS // WARP  # 4 on a GPU, 1 in the simulator
HEADS = 4  # query heads a pass: the accumulators of each are registers (4 dims a lane)
MAX_GROUP = 8  # query heads a KV head, at most (``partials`` rows: SPLIT_BLOCKS x MAX_GROUP)
KEY_QUADS = 8  # 16-byte loads of one key in flight at once (32 dims)
VALUE_LOADS = 8  # and of values
SPAN = THREADS  # the fewest KV positions a split walks: one chunk a warp
SPLIT_BLOCKS = 264  # split the pairs while they are fewer than half this: 2 an H200 SM
MAX_SPLITS = 16  # splits of one pair, at most
ZERO = float32(0)


def attention_splits(pairs):
    """Blocks each of ``pairs`` work items is split over: enough to give ~SPLIT_BLOCKS blocks
    work, and 1 when the pairs alone are many. ``pairs * splits <= SPLIT_BLOCKS`` whenever
    splits > 1: the rows ``partials`` needs (times the heads a pair)."""
    if 2 * pairs > SPLIT_BLOCKS:
        return 1
    return min(MAX_SPLITS, SPLIT_BLOCKS // max(pairs, 1))


attention_splits_device = cuda.jit(device=True, inline=True)(attention_splits)


def span_of(context, splits):
    """Positions each split of a ``context``-long pair walks: ``context / splits`` rounded up to a
    multiple of SPAN (so a short context stays in one split)."""
    if splits == 1:
        return context
    quanta = -(-context // SPAN)  # SPAN-long pieces of the context
    return -(-quanta // splits) * SPAN


span_of_device = cuda.jit(device=True, inline=True)(span_of)


def attention_scratch(head_dim: int):
    """What the splits exchange: ``partials`` (SPLIT_BLOCKS x MAX_GROUP, E + 2) f32, a split's
    (acc, m, l) for one query head, and ``arrivals`` (SPLIT_BLOCKS,) i32, the splits of a pair
    done so far (zeros: the merging split resets its count)."""
    return (cuda.device_array((SPLIT_BLOCKS * MAX_GROUP, head_dim + 2), np.float32),
            cuda.to_device(np.zeros(SPLIT_BLOCKS, np.int32)))


def takes_group(head_dim, group, workspace_words):
    """Whether ``attend_group`` serves these heads: ``E / 4`` lanes a position dividing a warp
    (E in 4, 8, 16, 32, 64, 128), at most MAX_GROUP query heads a KV head, and its shared memory
    within the kernel's ``workspace_words`` 32-bit words — the queries of a pass, each warp's p and
    positions' (block, slot) of a chunk, each warp's (acc, m, l) a head, and the simulator's
    reduction scratch. Otherwise ``attention.attend_token``."""
    words = (HEADS * head_dim + WARPS * WARP * (HEADS + 2) + WARPS * HEADS * (head_dim + 2)
             + (WARP if SIMULATOR else 0))
    return (head_dim % 4 == 0 and 128 % head_dim == 0 and group <= MAX_GROUP
            and words <= workspace_words)


takes_group_device = cuda.jit(device=True, inline=True)(takes_group)


@cuda.jit(device=True, inline=True)
def last_to_arrive(arrivals, pair, used, flag):
    """Count this block's split of ``pair`` as done (after its partials reach L2); True in every
    thread of the block that arrives last, which also resets the count for the next layer.
    ``flag``: one shared float32. Every thread of the block must call it."""
    cuda.threadfence()  # this block's partials reach L2 before its arrival is counted
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        last = cuda.atomic.add(arrivals, pair, 1) == used - 1
        if last:
            arrivals[pair] = 0  # ready for the next layer (after a kernel or grid barrier)
        flag[0] = float32(1) if last else float32(0)
    cuda.syncthreads()
    return flag[0] != 0


@cuda.jit(device=True, inline=True)
def merged_rows(partials, first, stride, used, e):
    """Column ``e`` of the splits' rows ``first, first + stride, ...`` (``used`` of them) merged:
    ``sum_s exp(m_s - M) acc_s[e] / sum_s exp(m_s - M) l_s``. Read through L2 (an atomic add of
    0): other SMs wrote them, and this SM's L1 may hold an older copy from an earlier layer."""
    E = partials.shape[1] - 2
    top = NEG_INF
    for s in range(used):
        top = max(top, cuda.atomic.add(partials, (first + s * stride, E), float32(0)))
    num, den = ZERO, ZERO
    for s in range(used):
        r = first + s * stride
        f = math.exp(cuda.atomic.add(partials, (r, E), float32(0)) - top)
        num += f * cuda.atomic.add(partials, (r, e), float32(0))
        den += f * cuda.atomic.add(partials, (r, E + 1), float32(0))
    return num / den


@cuda.jit(device=True, inline=True)
def kv_at(blk, slot, block_words, layer_at, slot_words):
    """Flat offset (in numbers) of slot ``slot`` of KV block ``blk``: the pool is (N, L, 2, B, K, E),
    C-contiguous, a block ``block_words`` numbers, a slot ``slot_words`` (K E); ``layer_at``
    places the layer, keys or values, and the KV head. 64-bit: a pool may hold more than 2^32."""
    return blk * block_words + layer_at + slot * slot_words


@cuda.jit(device=True, inline=True)
def score_chunk(kv_pool, key_at, valid, q, s):
    """s[h] = q_h . k for the key at flat offset ``key_at`` (0 where not ``valid``); q (HEADS x E)
    in shared memory. The loads are unconditional (clamped to the key) so they issue together."""
    E = kv_pool.shape[5]
    for h in range(HEADS):
        s[h] = ZERO
    for e0 in range(0, E, 4 * KEY_QUADS):
        for u in range(KEY_QUADS):  # a constant trip count: unrolled, the loads in one run
            e = min(e0 + 4 * u, E - 4)
            k4 = load4_flat(kv_pool, key_at + e)
            if valid and e0 + 4 * u < E:
                for h in range(HEADS):
                    at = h * E + e
                    s[h] += q[at] * k4[0] + q[at + 1] * k4[1] + q[at + 2] * k4[2] + q[at + 3] * k4[3]


@cuda.jit(device=True, inline=True)
def add_chunk_values(kv_pool, block_words, values_at, n, p, blocks, slots, acc):
    """acc[h, :] += sum over this lane's positions j of the chunk of p[h, j] * v_j[4 q : 4 q + 4]:
    ``E / 4`` lanes a position, lane ``pg * (E / 4) + q`` taking positions pg, pg + groups, ...
    ``values_at``: ``kv_at``'s offset of the layer's values of the KV head."""
    E = kv_pool.shape[5]
    K = kv_pool.shape[4]
    lanes = E // 4  # lanes a position
    groups = WARP // lanes  # position groups
    lane = cuda.threadIdx.x % WARP
    pg, quad = lane // lanes, lane % lanes
    for j0 in range(pg, n, groups * VALUE_LOADS):
        for u in range(VALUE_LOADS):
            j = min(j0 + u * groups, n - 1)  # clamped: the loads issue together
            v4 = load4_flat(kv_pool, kv_at(blocks[j], slots[j], block_words, values_at, K * E) + 4 * quad)
            if j0 + u * groups < n:
                for h in range(HEADS):
                    w = p[h * WARP + j]
                    for d in range(4):
                        acc[h, d] += w * v4[d]


@cuda.jit(device=True, inline=True)
def attend_group(qkv, positions, seq_rows, block_tables, kv_pool, layer, t, kvh, group, split,
                 splits, out, partials, arrivals, workspace):
    """out[t, h * E : (h + 1) * E] for token ``t`` and the query heads h of KV head ``kvh``, or this
    block's share of them: split ``split`` of ``splits`` (the module docstring). ``workspace``:
    shared float32 (``takes_group``'s words). Every thread of the block must call it."""
    tid = cuda.threadIdx.x
    warp, lane = tid // WARP, tid % WARP
    _, L, _, B, K, E = kv_pool.shape
    context = positions[t] + 1
    span = span_of_device(context, splits)
    used = -(-context // span)  # splits with positions to walk
    if split >= used:
        return  # (the whole block)
    lo, hi = split * span, min(context, split * span + span)
    row = seq_rows[t]
    pair = t * K + kvh
    keys_at = layer * 2 * B * K * E + kvh * E  # flat offset of k[block 0, layer, slot 0, kvh, 0]
    block_words = L * 2 * B * K * E  # (the values: B * K * E further on)
    # shared memory: q (HEADS, E), then per warp: p (HEADS, 32), blocks (32), slots (32); then per
    # warp and head (E + 2): acc, m, l; then the simulator's reduction scratch
    q = workspace[:HEADS * E]
    at = HEADS * E + warp * WARP * (HEADS + 2)
    p = workspace[at:at + HEADS * WARP]
    where = workspace.view(np.int32)[at + HEADS * WARP:at + (HEADS + 2) * WARP]
    blocks, slots = where[:WARP], where[WARP:]
    merge_at = HEADS * E + WARPS * WARP * (HEADS + 2)
    merge = workspace[merge_at:merge_at + WARPS * HEADS * (E + 2)]
    scratch = workspace[merge_at + WARPS * HEADS * (E + 2):]
    s = cuda.local.array(HEADS, float32)  # this lane's position's score, a head
    m = cuda.local.array(HEADS, float32)  # running max and sum, a head (the same in every lane)
    total = cuda.local.array(HEADS, float32)
    acc = cuda.local.array((HEADS, 4), float32)  # this lane's 4 dims of sum p v, a head
    scale = float32(1) / math.sqrt(float32(E))
    lanes = E // 4
    for h0 in range(0, group, HEADS):  # passes of HEADS query heads
        heads = min(HEADS, group - h0)
        first_col = (kvh * group + h0) * E  # the pass's heads are consecutive in qkv and out
        for i in range(tid, HEADS * E, THREADS):
            q[i] = qkv[t, first_col + i] * scale if i < heads * E else ZERO
        for h in range(HEADS):
            m[h], total[h] = NEG_INF, ZERO
            for d in range(4):
                acc[h, d] = ZERO
        cuda.syncthreads()
        for c0 in range(lo + warp * WARP, hi, WARPS * WARP):  # this warp's chunks
            c = c0 + lane
            valid = c < hi
            blk, slot = paged_slot(block_tables, row, min(c, hi - 1), B)
            score_chunk(kv_pool, kv_at(blk, slot, block_words, keys_at, K * E), valid, q, s)
            for h in range(HEADS):
                sc = s[h] if valid else NEG_INF
                new = max(m[h], lanes_max(sc, 1, scratch))  # finite: position c0 is valid
                rescale = math.exp(m[h] - new)  # 0 on the first chunk (m = -inf)
                ph = math.exp(sc - new) if valid else ZERO
                total[h] = total[h] * rescale + lanes_sum(ph, 1, scratch)
                m[h] = new
                for d in range(4):
                    acc[h, d] *= rescale
                p[h * WARP + lane] = ph
            blocks[lane], slots[lane] = blk, slot
            warp_barrier()  # p, blocks, slots of the chunk, seen by the whole warp
            add_chunk_values(kv_pool, block_words, keys_at + B * K * E, min(WARP, hi - c0), p,
                             blocks, slots, acc)
            warp_barrier()  # the warp is done with them before the next chunk's
        # add the position groups' sums (lanes pg * lanes + quad, for each quad), leave the
        # warp's (acc, m, l) a head, and merge the warps
        for h in range(HEADS):
            for d in range(4):
                acc[h, d] = lanes_sum(acc[h, d], lanes, scratch)
            row_at = (warp * HEADS + h) * (E + 2)
            if lane < lanes:
                for d in range(4):
                    merge[row_at + 4 * lane + d] = acc[h, d]
            if lane == 0:
                merge[row_at + E], merge[row_at + E + 1] = m[h], total[h]
        cuda.syncthreads()
        for i in range(tid, heads * E, THREADS):
            h, e = i // E, i % E
            top = NEG_INF
            for w in range(WARPS):
                top = max(top, merge[(w * HEADS + h) * (E + 2) + E])
            num, den = ZERO, ZERO
            for w in range(WARPS):
                row_at = (w * HEADS + h) * (E + 2)
                f = math.exp(merge[row_at + E] - top)  # 0 for a warp with no chunk
                num += f * merge[row_at + e]
                den += f * merge[row_at + E + 1]
            if used == 1:
                out[t, first_col + i] = num / den
            else:
                r = (pair * splits + split) * group + h0 + h
                partials[r, e] = num
                if e == 0:
                    partials[r, E], partials[r, E + 1] = top, den
        cuda.syncthreads()  # q and merge are free for the next pass
    if used > 1 and last_to_arrive(arrivals, pair, used, merge):
        for i in range(tid, group * E, THREADS):
            gh, e = i // E, i % E
            out[t, kvh * group * E + i] = merged_rows(partials, pair * splits * group + gh, group,
                                                      used, e)
        cuda.syncthreads()
