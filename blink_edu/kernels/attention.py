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

**A prompt chunk: a tile of queries shares every key it loads** (FlashAttention's idea, on
CUDA cores). Walking the context once per query, a 512-token prompt reads each key ~256 times
per head, and every read waits ~1 µs for memory. So when the ``QUERY_TILE`` tokens of an aligned
tile all belong to one sequence, at consecutive positions (a prompt chunk; ``tile_of``), the
item of the tile's first token serves all of them (``attend_tile``) and the others' items have
nothing to do: per chunk of ``key_chunk(E)`` positions the block loads the keys into shared
memory once, scores them against every query of the tile, updates each query's online softmax,
loads the values into the same buffer and adds them to each query's accumulators — five
barriers a chunk for 16 queries, where the one-query walk spends six for one. Decode tokens
(one per sequence) keep the one-query walk above, so a decode step keeps its parallelism; a
step of decode tokens only runs ``decode_attention_kernel``, which leaves the tile out
(``attention_kernel_for``), and so its registers.
"""

from __future__ import annotations

import math

from numba import float32

from . import loads
from .loads import VEC, load8_at
from .reduce import NEG_INF, SIMULATOR, THREADS, block_max, block_sum, cuda

UNROLL = 8  # loads each thread has in flight in the inner loops
# Queries one tile serves. In the simulator 4, so that small test prompts cross several tiles.
QUERY_TILE = 4 if SIMULATOR else 16  # at E <= 64; fewer for larger heads (queries_per_tile)
Q_BUFFER = QUERY_TILE * 64  # floats of the tile's queries, E each
KV_BUFFER = 2048  # floats of keys (then values) a tile holds at once: key_chunk(E) positions
SCORES = QUERY_TILE * 64  # (queries, key_chunk(E)) scores; key chunks <= 64
TILE_OUTPUTS = Q_BUFFER // THREADS  # accumulators a thread keeps: 8 on a GPU
KEY_LOADS = 8  # wide loads of one key in flight at once: a whole 64-dim key, half a 128-dim one
PARTS = THREADS * VEC  # (THREADS / (E / 8)) position groups x E partial sums, at most


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
def key_chunk(E):
    """Positions of keys (or values) a tile holds in shared memory at once: 31 at E = 64. Each
    is stored E + 1 floats apart: lanes reading the same dimension of consecutive keys then hit
    different memory banks (E apart, with E a multiple of 32, they would all hit one)."""
    return min(KV_BUFFER // (E + 1), 64)


@cuda.jit(device=True, inline=True)
def queries_per_tile(E):
    """Queries a tile serves: QUERY_TILE up to E = 64, fewer for larger heads (E <= 128), so the
    queries fit Q_BUFFER and each thread's accumulators stay TILE_OUTPUTS registers."""
    return min(QUERY_TILE, Q_BUFFER // E)


@cuda.jit(device=True, inline=True)
def tile_of(t, positions, seq_rows, QT):
    """0 when token ``t`` is walked alone; 1 when it leads an aligned tile of QT tokens of one
    sequence at consecutive positions (a prompt chunk); 2 when such a tile's leader serves it.
    A sequence's tokens are contiguous in the flat batch, so the first and last token of the
    tile sharing a row and spanning QT positions means they all do."""
    t0 = t - t % QT
    last = t0 + QT - 1
    if (last < positions.shape[0] and seq_rows[t0] == seq_rows[last]
            and positions[last] - positions[t0] == QT - 1):
        return 1 if t == t0 else 2
    return 0


@cuda.jit(device=True, inline=True)
def stage_chunk(buf, kv_pool, block_tables, row, layer, kind, kvh, start, n, E):
    """buf[j * (E + 1) + e] = keys (kind 0) or values (kind 1) of positions start + j, j < n, of
    kv head ``kvh`` — the whole block loads them, 8 dimensions a load when it can."""
    tid = cuda.threadIdx.x
    B = kv_pool.shape[3]
    if loads.WIDE_LOADS and E % VEC == 0:
        per_row = E // VEC
        for idx in range(tid, n * per_row, THREADS):
            j, e = idx // per_row, (idx % per_row) * VEC
            c = start + j
            v8 = load8_at(kv_pool, (block_tables[row, c // B], layer, kind, c % B, kvh, e))
            for d in range(VEC):
                buf[j * (E + 1) + e + d] = v8[d]
    else:
        for idx in range(tid, n * E, THREADS):
            j, e = idx // E, idx % E
            c = start + j
            buf[j * (E + 1) + e] = kv_pool[block_tables[row, c // B], layer, kind, c % B, kvh, e]


@cuda.jit(device=True)
def attend_tile(qkv, positions, seq_rows, block_tables, kv_pool, layer, h, kvh, t0, out):
    """out[t0 .. t0 + QT, head h] for a tile of one sequence's consecutive tokens: each
    chunk of keys and values is loaded into shared memory once and serves every query."""
    tid = cuda.threadIdx.x
    E = kv_pool.shape[5]
    CH = key_chunk(E)
    QT = queries_per_tile(E)
    row, p0 = seq_rows[t0], positions[t0]
    q_tile = cuda.shared.array(Q_BUFFER, float32)  # (QT, E) queries / sqrt(E)
    kv = cuda.shared.array(KV_BUFFER, float32)  # (CH, E + 1) this chunk's keys, then values
    scores = cuda.shared.array(SCORES, float32)  # (QT, CH) then exp(score - m)
    m_row = cuda.shared.array(QUERY_TILE, float32)  # running max per query
    l_row = cuda.shared.array(QUERY_TILE, float32)  # running sum of exp per query
    rescale = cuda.shared.array(QUERY_TILE, float32)  # exp(m_old - m_new) of this chunk
    acc = cuda.local.array(TILE_OUTPUTS, float32)  # output o = tid + k THREADS: (q, e) = divmod(o, E)
    scale = float32(1) / math.sqrt(float32(E))
    for i in range(tid, QT * E, THREADS):
        q_tile[i] = qkv[t0 + i // E, h * E + i % E] * scale
    for k in range(TILE_OUTPUTS):  # constant trip counts: ``acc`` stays in registers
        acc[k] = 0
    if tid < QT:
        m_row[tid], l_row[tid] = NEG_INF, float32(0)
    context = p0 + QT  # the last query's: positions 0 .. p0 + QT - 1
    for start in range(0, context, CH):
        n = min(CH, context - start)
        stage_chunk(kv, kv_pool, block_tables, row, layer, 0, kvh, start, n, E)
        cuda.syncthreads()
        for i in range(tid, QT * CH, THREADS):  # every (query, key) score of the chunk
            qi, j = i // CH, i % CH
            s = NEG_INF
            if j < n and start + j <= p0 + qi:  # causal: a query sees positions <= its own
                s = float32(0)
                for e in range(E):
                    s += q_tile[qi * E + e] * kv[j * (E + 1) + e]
            scores[i] = s
        cuda.syncthreads()
        if tid < QT:  # one thread a query: its online softmax over the chunk
            m_new = m_row[tid]
            for j in range(n):
                m_new = max(m_new, scores[tid * CH + j])
            total = float32(0)
            for j in range(CH):
                w = math.exp(scores[tid * CH + j] - m_new) if j < n else float32(0)
                scores[tid * CH + j] = w
                total += w
            rescale[tid] = math.exp(m_row[tid] - m_new)  # 0 on the first chunk
            l_row[tid] = l_row[tid] * rescale[tid] + total
            m_row[tid] = m_new
        stage_chunk(kv, kv_pool, block_tables, row, layer, 1, kvh, start, n, E)
        cuda.syncthreads()
        for k in range(TILE_OUTPUTS):
            o = tid + k * THREADS
            if o < QT * E:
                qi, e = o // E, o % E
                a = acc[k] * rescale[qi]
                for j in range(n):
                    a += scores[qi * CH + j] * kv[j * (E + 1) + e]
                acc[k] = a
        cuda.syncthreads()  # the next chunk overwrites kv and scores
    for k in range(TILE_OUTPUTS):
        o = tid + k * THREADS
        if o < QT * E:
            out[t0 + o // E, h * E + o % E] = acc[k] / l_row[o // E]
    cuda.syncthreads()  # the block's next item resets l_row and q_tile


@cuda.jit(device=True)
def attend_one(qkv, positions, seq_rows, block_tables, kv_pool, layer, h, kvh, t, out):
    """out[t, head h]: token t walks its context alone (the module docstring, steps 1-3)."""
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
    q = cuda.shared.array(THREADS, float32)  # this item's query vector (E <= THREADS)
    weights = cuda.shared.array(THREADS, float32)  # exp(score - m) of the current chunk
    scratch = cuda.shared.array(THREADS, float32)
    parts = cuda.shared.array(PARTS, float32)  # each thread group's (E,) partial sums
    acc8 = cuda.local.array(VEC, float32)
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


@cuda.jit(device=True)
def paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, block, n_blocks):
    """out (T, H * E) = softmax(q k^T / sqrt(E)) v per (token, head), q read from qkv (T, ...);
    a work item is one (token, head): walked alone, or a tile leader serving its tile.
    Requires E <= THREADS."""
    group = num_heads // num_kv_heads
    for item in range(block, qkv.shape[0] * num_heads, n_blocks):
        t, h = item // num_heads, item % num_heads
        kind = tile_of(t, positions, seq_rows, queries_per_tile(kv_pool.shape[5]))  # block-wide
        if kind == 1:
            attend_tile(qkv, positions, seq_rows, block_tables, kv_pool, layer, h, h // group,
                        t, out)
        elif kind == 0:
            attend_one(qkv, positions, seq_rows, block_tables, kv_pool, layer, h, h // group, t,
                       out)


@cuda.jit(device=True)
def decode_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                     num_kv_heads, out, block, n_blocks):
    """``paged_attention`` for a step of one token a sequence, where no tile can form: every
    (token, head) walks alone. A kernel of its own because a kernel's registers are those of
    everything it may run: without the tile path a large decode batch keeps more blocks
    resident (on the H200: 96 registers a thread against 110, five blocks an SM against four)."""
    group = num_heads // num_kv_heads
    for item in range(block, qkv.shape[0] * num_heads, n_blocks):
        t, h = item // num_heads, item % num_heads
        attend_one(qkv, positions, seq_rows, block_tables, kv_pool, layer, h, h // group, t, out)


@cuda.jit
def paged_attention_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                           num_kv_heads, out):
    paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def decode_attention_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                            num_kv_heads, out):
    decode_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                     num_kv_heads, out, cuda.blockIdx.x, cuda.gridDim.x)


def attention_kernel_for(num_tokens: int, num_seqs: int):
    """The kernel a host launches for a step of ``num_tokens`` tokens of ``num_seqs`` sequences:
    with one token a sequence, the decode kernel; otherwise the one with prompt tiles."""
    return decode_attention_kernel if num_tokens <= num_seqs else paged_attention_kernel
