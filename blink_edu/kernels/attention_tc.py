"""Prompt attention on tensor cores: a FlashAttention-2 tile over the paged KV pool.

Where it serves: the prefill step (Blink §4's prompt chunks; docs/design.md §2.3). A prompt
chunk of ``n`` tokens asks, per query head, for an ``n x context`` score matrix, a softmax and a
product with the values — matrix products, so tensor cores (``matmul_tc.py`` explains the
``mma.sync`` fragments). ``attention.py`` walks one (token, query head) at a time on FMAs and
reads every key once per query: for a 512-token prompt of the 135M shape that is ~190 µs a
layer on an H200, more than all its linear layers together. This tile reads each key and value
once per *tile* and does the products on tensor cores.

**The tile.** A work item is one KV head and ``QT`` consecutive tokens of one sequence. Its
query rows are the (token, query head) pairs that share the KV head — grouped-query attention
makes the ``G = H / K`` heads of a group one matrix of ``QT * G`` rows: ``ROWS`` = 16 rows a
warp (one m16 tile), so ``QT = ROWS // G`` (21 tokens x 3 heads on a GPU for SmolLM2).
Each warp keeps its 16 rows' queries as A fragments for the whole item, walks the context in
chunks of ``KC`` positions and, per chunk (FlashAttention-2, Dao 2023):

1. the block stages the chunk's keys ``K (KC, E)`` and values, transposed, ``V^T (E, KC)`` in
   shared memory as fp16 pairs (a value word pairs two *positions*, which is what the B fragment
   of ``P @ V`` wants: its k runs along the positions). The next chunk's loads are issued before
   this chunk's math, into registers, so their latency hides behind it. Each thread keeps where
   its positions are — block-table column and slot — and moves them on a chunk by an addition
   and a carry, and reads the pool at flat unsigned offsets: a division and a 6-d index a load
   were half the loop's instructions (sm_90 SASS: 968 -> 669 lines a chunk with the next point);
2. ``S = Q K^T`` (16 x KC a warp) on tensor cores, ``log2(e) / sqrt(E)`` folded into Q (the
   softmax below takes ``exp2``, one ``MUFU.EX2``, where ``exp`` wraps it in a range
   reduction), the causal mask applied to the accumulators of the chunks that cross the warp's
   diagonal (a row's token sees positions up to its own);
3. the online softmax: each row's running max ``m`` and sum ``l``; a new max rescales ``l`` and
   the output accumulators by ``exp2(m_old - m_new)``. A row's values sit in one *quad* of lanes
   (``c0, c1`` of row g in lanes 4g .. 4g + 3), so its max is two shuffles (``reduce.quad_max``);
4. ``O += P V`` on tensor cores, with ``P = exp2(S - m)`` taken straight from the score
   accumulators: the C fragment of two neighbouring 16 x 8 score tiles *is* the A fragment of a
   16 x 16 tile (rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9), so P never leaves the
   registers — the trick that makes FlashAttention-2 fast.

At the end ``out = O / l``. fp16 operands, fp32 accumulation and softmax: the same rounding as
the linear layers on tensor cores.

**Where it does not serve.** A tile must hold consecutive tokens of one sequence — a decode
batch (one token per sequence) has none, and ``attention.py``'s path serves it;
``paged_attention`` there picks per tile. Head size 64 only (``HEAD_DIM``: the fragments'
register arrays are sized at compile time; SmolLM2 and Llama-3.2-1B use 64), and fp16 models
only (``tensor_cores``): a float32 model stays exact.

Simulator: the same code, with ``matmul_tc``'s simulator forms of ``mma_m16n8k16`` and
``pack_half2`` and ``reduce``'s of the quad reductions; there a block is one warp (16 rows).
"""

from __future__ import annotations

import math
import os

from numba import float32, int32, uint32, uint64

from .loads import load4_flat
from .matmul_tc import mma_m16n8k16, pack_half2
from .reduce import NEG_INF, THREADS, WARP, cuda, divmod32, quad_max, quad_sum

HEAD_DIM = 64  # E: the only head size the tile takes


def chunk_positions(value: str | None) -> int:
    """KV positions a chunk, from ``BLINK_EDU_ATTENTION_CHUNK`` (read once, at import): 32 by
    default — on the H200 one 512-token prompt of the 135M shape took 52 µs a layer at 32 against
    69 at 16 and 63 at 64 (``tools/attention_probe.py``; 64 runs out of registers). Shared memory
    grows with it, ``KC x (E / 2 + 4) + E x (KC / 2 + 4)`` words (5.4 KB at 16, 9.5 KB at 32,
    18 KB at 64): the persistent kernel's ops share 48 KB, and hold 47.8 KB at 32, so 64 is for
    the eager and graph executors only."""
    kc = int(value or 32)
    if kc not in (16, 32, 64):
        raise ValueError(f"BLINK_EDU_ATTENTION_CHUNK must be 16, 32 or 64, got {value!r}")
    return kc


KC = chunk_positions(os.environ.get("BLINK_EDU_ATTENTION_CHUNK"))  # KV positions a chunk
WARPS = THREADS // WARP  # 4 on a GPU, 1 in the simulator
ROWS = 16 * WARPS  # query rows a tile: (token, query head of the group), 16 a warp
K_SLICES = HEAD_DIM // 16  # k slices of S = Q K^T (16 dims each): Q's A fragments
S_TILES = KC // 8  # n tiles of S (8 positions each)
O_TILES = HEAD_DIM // 8  # n tiles of O (8 dims each)
OCTETS = HEAD_DIM // 8  # wide loads (8 numbers) a key or value row
K_STRIDE = HEAD_DIM // 2 + 4  # 32-bit words a key row in shared memory (fp16 pairs) ...
V_STRIDE = KC // 2 + 4  # ... and a row of V^T; +4: lanes (g, t) hit 32 different banks
K_WORDS = KC * K_STRIDE
WORKSPACE_WORDS = K_WORDS + HEAD_DIM * V_STRIDE  # the shared memory a tile needs (uint32)
K_LOADS = -(-KC * OCTETS // THREADS)  # each thread's wide loads of keys a chunk
V_LOADS = -(-(KC // 2) * OCTETS // THREADS)  # and of value pairs (two positions each)
TRACKED = K_LOADS + V_LOADS  # positions a thread keeps the paged slot of: its keys', its pairs'
ZERO = float32(0)
LOG2E = float32(1.4426950408889634)  # log2(e)


def tc_attention_tiles(num_tokens, group, head_dim):
    """Tiles of ``QT = ROWS // group`` tokens over a step of ``num_tokens``; 0 when the tile cannot
    take these heads (another head size, or more query heads a group than rows)."""
    if head_dim != HEAD_DIM or group > ROWS:
        return 0
    tokens_a_tile = ROWS // group
    return (num_tokens + tokens_a_tile - 1) // tokens_a_tile


tc_attention_tiles_device = cuda.jit(device=True)(tc_attention_tiles)


@cuda.jit(device=True, inline=True)
def one_sequence(positions, seq_rows, t0, n):
    """Whether tokens ``t0 .. t0 + n - 1`` are consecutive positions of one sequence (a flat batch
    holds each sequence's tokens together, in order: ``step.pack_step``)."""
    t1 = t0 + n - 1
    return seq_rows[t0] == seq_rows[t1] and positions[t1] - positions[t0] == n - 1


@cuda.jit(device=True, inline=True)
def pool_strides(kv_pool):
    """(block, K -> V, slot) strides of the pool (N, L, 2, B, K, E), in numbers: the first
    unsigned 64-bit, the others 32-bit (one block of every layer is far below 2^32 numbers)."""
    _, L, _, B, K, E = kv_pool.shape
    return uint64(L * 2 * B * K * E), uint32(B * K * E), uint32(K * E)


@cuda.jit(device=True, inline=True)
def pool_offset(strides, block, kv, slot, base):
    """Where ``kv_pool[block, layer, kv, slot, kvh, e]`` starts, counted in numbers from the
    pool's first: ``base`` is the offset of ``[0, layer, 0, 0, kvh, e]`` (``attend_tile``),
    ``strides`` ``pool_strides``'. Unsigned and flat: indexing the 6-d pool with a tuple cost ~30
    instructions of 64-bit multiplies a load (sm_90 SASS), four loads a chunk a thread."""
    return uint64(uint32(block)) * strides[0] + uint64(base + uint32(kv) * strides[1]
                                                       + uint32(slot) * strides[2])


@cuda.jit(device=True, inline=True)
def eight_at(kv_pool, at):
    """kv_pool's numbers at .. at + 7 (flat), two 16-byte loads."""
    a0, a1, a2, a3 = load4_flat(kv_pool, at)
    a4, a5, a6, a7 = load4_flat(kv_pool, at + uint64(4))
    return a0, a1, a2, a3, a4, a5, a6, a7


@cuda.jit(device=True, inline=True)
def first_chunk_slots(block_size, pages, slots):
    """(page, slot) — the block-table column and the slot in its block — of the first chunk's
    positions this thread loads: its K_LOADS keys' (position ``a // OCTETS`` of load ``a``),
    then its V_LOADS value pairs' first (``2 (a // OCTETS)``). ``next_chunk_slots`` moves them
    on a chunk, so that a chunk's loads divide nothing."""
    tid = cuda.threadIdx.x
    for j in range(K_LOADS):
        pages[j], slots[j] = divmod32((tid + j * THREADS) // OCTETS, block_size)
    for j in range(V_LOADS):
        pages[K_LOADS + j], slots[K_LOADS + j] = divmod32(2 * ((tid + j * THREADS) // OCTETS),
                                                          block_size)


@cuda.jit(device=True, inline=True)
def next_chunk_slots(pages, slots, step, block_size):
    """Every tracked position KC further on: ``step`` = divmod(KC, B), a carry into the page."""
    for i in range(TRACKED):
        slot, page = slots[i] + step[1], pages[i] + step[0]
        if slot >= block_size:
            slot, page = slot - block_size, page + 1
        pages[i], slots[i] = page, slot


@cuda.jit(device=True, inline=True)
def load_chunk(kv_pool, strides, table, base, c0, end, pages, slots, kreg, vreg):
    """Global memory -> registers, positions ``c0 .. c0 + KC - 1`` (zeros from ``end`` on), as fp16
    pairs: for keys, thread ``a`` takes 8 dims of position ``a // OCTETS`` (kreg (K_LOADS, 4));
    for values, the same 8 dims of two neighbouring positions, paired along the position
    (vreg (V_LOADS, 8)), as V^T stores them. ``pages``, ``slots``: where those positions are
    (``first_chunk_slots``); ``table``: the sequence's row of the block tables; ``base``: the
    offset of this tile's layer and KV head in the pool (``strides``: ``pool_strides``)."""
    tid = cuda.threadIdx.x
    B = kv_pool.shape[3]
    zero = (ZERO, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO)
    for j in range(K_LOADS):
        a = tid + j * THREADS
        e = uint32(8 * (a % OCTETS))
        if a < KC * OCTETS and c0 + a // OCTETS < end:
            blk = table[uint32(pages[j])]
            k8 = eight_at(kv_pool, pool_offset(strides, blk, 0, slots[j], base + e))
            for u in range(4):
                kreg[j, u] = pack_half2(k8[2 * u], k8[2 * u + 1])
        else:
            for u in range(4):
                kreg[j, u] = 0
    for j in range(V_LOADS):
        a = tid + j * THREADS
        if a < (KC // 2) * OCTETS:
            c, e = c0 + 2 * (a // OCTETS), uint32(8 * (a % OCTETS))
            page, slot = pages[K_LOADS + j], slots[K_LOADS + j]
            v0 = v1 = zero
            if c < end:
                blk = table[uint32(page)]
                v0 = eight_at(kv_pool, pool_offset(strides, blk, 1, slot, base + e))
            if c + 1 < end:  # the next position: the same block unless ``slot`` was its last
                if slot + 1 == B:
                    page, slot = page + 1, -1
                blk = table[uint32(page)]
                v1 = eight_at(kv_pool, pool_offset(strides, blk, 1, slot + 1, base + e))
            for u in range(8):
                vreg[j, u] = pack_half2(v0[u], v1[u])


@cuda.jit(device=True, inline=True)
def store_chunk(kreg, vreg, k_tile, vt_tile):
    """Registers -> shared memory: k_tile (KC x K_STRIDE words) [position, dim pair], vt_tile
    (HEAD_DIM x V_STRIDE words) [dim, position pair], both flat (a reshape would call into Numba's
    runtime, which a kernel cannot link)."""
    tid = cuda.threadIdx.x
    for j in range(K_LOADS):
        a = tid + j * THREADS
        if a < KC * OCTETS:
            at = uint32((a // OCTETS) * K_STRIDE + 4 * (a % OCTETS))  # (unsigned: see ``scores``)
            for u in range(4):
                k_tile[at + uint32(u)] = kreg[j, u]
    for j in range(V_LOADS):
        a = tid + j * THREADS
        if a < (KC // 2) * OCTETS:
            at = uint32(8 * (a % OCTETS) * V_STRIDE + a // OCTETS)
            for u in range(8):
                vt_tile[at + uint32(u * V_STRIDE)] = vreg[j, u]


@cuda.jit(device=True, inline=True)
def load_queries(qkv, ta, ha, tb, hb, scale, qf):
    """This lane's A fragments of the warp's 16 query rows, ``scale`` folded in: rows (ta, ha) (g)
    and (tb, hb) (g + 8), dims 16 ks + 2t, + 1 and + 8, + 9 of each k slice ks. qf (K_SLICES, 4)."""
    t = cuda.threadIdx.x % 4
    for ks in range(K_SLICES):
        e = 16 * ks + 2 * t
        a, b = ha * HEAD_DIM + e, hb * HEAD_DIM + e
        qf[ks, 0] = pack_half2(qkv[ta, a] * scale, qkv[ta, a + 1] * scale)
        qf[ks, 1] = pack_half2(qkv[tb, b] * scale, qkv[tb, b + 1] * scale)
        qf[ks, 2] = pack_half2(qkv[ta, a + 8] * scale, qkv[ta, a + 9] * scale)
        qf[ks, 3] = pack_half2(qkv[tb, b + 8] * scale, qkv[tb, b + 9] * scale)


@cuda.jit(device=True, inline=True)
def scores(qf, k_tile, s):
    """s (S_TILES, 4) = this warp's Q (16 rows) @ K^T of the chunk, as C fragments. Shared words
    are found from one unsigned offset of the lane plus constants: a signed index makes Numba
    check it for a negative value (Python's ``a[-1]``) at every access (see ``matmul_tc``)."""
    g, t = (cuda.threadIdx.x % WARP) // 4, cuda.threadIdx.x % 4
    lane_at = uint32(g * K_STRIDE + t)
    for ni in range(S_TILES):
        s0 = s1 = s2 = s3 = ZERO
        for ks in range(K_SLICES):
            w = lane_at + uint32(ni * 8 * K_STRIDE + ks * 8)  # key ni 8 + g, pairs t and t + 4
            b0, b1 = k_tile[w], k_tile[w + uint32(4)]
            s0, s1, s2, s3 = mma_m16n8k16(qf[ks, 0], qf[ks, 1], qf[ks, 2], qf[ks, 3], b0, b1,
                                          s0, s1, s2, s3)
        s[ni, 0], s[ni, 1], s[ni, 2], s[ni, 3] = s0, s1, s2, s3


@cuda.jit(device=True, inline=True)
def add_values(s, vt_tile, o):
    """o (O_TILES, 4) += P @ V with P = s (already exp(S - m)) reused as A fragments: k slice kk of
    P is score tiles 2kk (its k pairs t) and 2kk + 1 (pairs t + 4)."""
    g, t = (cuda.threadIdx.x % WARP) // 4, cuda.threadIdx.x % 4
    lane_at = uint32(g * V_STRIDE + t)
    for kk in range(KC // 16):
        a0 = pack_half2(s[2 * kk, 0], s[2 * kk, 1])  # row g, positions 2t, 2t + 1
        a1 = pack_half2(s[2 * kk, 2], s[2 * kk, 3])  # row g + 8
        a2 = pack_half2(s[2 * kk + 1, 0], s[2 * kk + 1, 1])  # row g, positions 2t + 8, 2t + 9
        a3 = pack_half2(s[2 * kk + 1, 2], s[2 * kk + 1, 3])  # row g + 8
        for nd in range(O_TILES):
            w = lane_at + uint32(nd * 8 * V_STRIDE + kk * 8)  # dim nd 8 + g, pairs t, t + 4
            b0, b1 = vt_tile[w], vt_tile[w + uint32(4)]
            o[nd, 0], o[nd, 1], o[nd, 2], o[nd, 3] = mma_m16n8k16(
                a0, a1, a2, a3, b0, b1, o[nd, 0], o[nd, 1], o[nd, 2], o[nd, 3])


@cuda.jit(device=True, inline=True)
def causal_mask(s, c0, pos_a, pos_b):
    """Scores of positions past a row's own to -inf: s (S_TILES, 4) of the chunk at c0, this
    lane's rows seeing up to ``pos_a`` (c0, c1) and ``pos_b`` (c2, c3)."""
    t = cuda.threadIdx.x % 4
    for ni in range(S_TILES):
        c = c0 + ni * 8 + 2 * t  # positions c, c + 1 of c0..c3
        if c > pos_a:
            s[ni, 0] = NEG_INF
        if c + 1 > pos_a:
            s[ni, 1] = NEG_INF
        if c > pos_b:
            s[ni, 2] = NEG_INF
        if c + 1 > pos_b:
            s[ni, 3] = NEG_INF


@cuda.jit(device=True, inline=True)
def attend_tile(qkv, positions, seq_rows, block_tables, kv_pool, layer, group, kvh, t0, n, out,
                words):
    """out[t, h * E : (h + 1) * E] for the n (<= ROWS // group) consecutive tokens t0 .. t0 + n - 1
    of one sequence and the query heads h of KV head ``kvh``. ``words``: shared uint32
    (>= WORKSPACE_WORDS). Every thread of the block must call it."""
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    g, t = lane // 4, lane % 4
    k_tile = words[:K_WORDS]  # keys (KC x K_STRIDE words), fp16 pairs
    vt_tile = words[K_WORDS:WORKSPACE_WORDS]  # V^T (HEAD_DIM x V_STRIDE words), position pairs
    qf = cuda.local.array((K_SLICES, 4), uint32)  # this lane's A fragments of Q
    s = cuda.local.array((S_TILES, 4), float32)  # scores, then probabilities, of a chunk
    o = cuda.local.array((O_TILES, 4), float32)  # output accumulators
    kreg = cuda.local.array((K_LOADS, 4), uint32)  # the next chunk, on its way
    vreg = cuda.local.array((V_LOADS, 8), uint32)
    pages = cuda.local.array(TRACKED, int32)  # where this thread's loads are
    slots = cuda.local.array(TRACKED, int32)
    row, p0 = seq_rows[t0], positions[t0]
    end = p0 + n  # the context of the tile's last token
    # This lane's rows: g and g + 8 of the warp's 16, each a (token, query head) pair. Rows past
    # the tile's tokens compute with the last token's position and are never written.
    ra, rb = warp * 16 + g, warp * 16 + g + 8
    ja, jb = ra // group, rb // group  # tokens of the tile (valid below n)
    ta, tb = t0 + min(ja, n - 1), t0 + min(jb, n - 1)
    ha, hb = kvh * group + ra % group, kvh * group + rb % group
    pos_a, pos_b = positions[ta], positions[tb]  # the last position each row sees
    warp_end = p0 + min(n - 1, (warp * 16 + 15) // group) + 1  # no row of the warp sees beyond
    warp_first = p0 + min(n - 1, (warp * 16) // group)  # every row of the warp sees up to here
    # Scores in units of log2: exp(x) = exp2(x log2 e), and exp2 is one MUFU.EX2 where exp is a
    # range reduction around it (sm_90 SASS); the factor rides in with 1 / sqrt(E).
    load_queries(qkv, ta, ha, tb, hb, LOG2E / math.sqrt(float32(HEAD_DIM)), qf)
    for nd in range(O_TILES):
        for q in range(4):
            o[nd, q] = 0
    m_a = m_b = NEG_INF
    l_a = l_b = ZERO  # this lane's share of each row's sum (the quad adds them at the end)
    B, K = kv_pool.shape[3], kv_pool.shape[4]
    base = uint32((layer * 2 * B * K + kvh) * HEAD_DIM)  # kv_pool[0, layer, 0, 0, kvh, 0]
    step = divmod32(KC, B)
    strides, table = pool_strides(kv_pool), block_tables[row]
    first_chunk_slots(B, pages, slots)
    load_chunk(kv_pool, strides, table, base, 0, end, pages, slots, kreg, vreg)
    store_chunk(kreg, vreg, k_tile, vt_tile)
    cuda.syncthreads()
    for c0 in range(0, end, KC):
        more = c0 + KC < end
        if more:  # the next chunk's loads, in flight during this chunk's math
            next_chunk_slots(pages, slots, step, B)
            load_chunk(kv_pool, strides, table, base, c0 + KC, end, pages, slots, kreg, vreg)
        if c0 < warp_end:  # the same for the whole warp
            scores(qf, k_tile, s)
            if c0 + KC - 1 > warp_first:  # the chunk crosses the warp's diagonal (warp-uniform)
                causal_mask(s, c0, pos_a, pos_b)
            max_a = max_b = NEG_INF
            for ni in range(S_TILES):
                max_a = max(max_a, max(s[ni, 0], s[ni, 1]))
                max_b = max(max_b, max(s[ni, 2], s[ni, 3]))
            new_a, new_b = max(m_a, quad_max(max_a)), max(m_b, quad_max(max_b))
            # Finite after the first chunk: position 0 is in every row's context.
            rescale_a, rescale_b = math.exp2(m_a - new_a), math.exp2(m_b - new_b)
            m_a, m_b = new_a, new_b
            l_a, l_b = l_a * rescale_a, l_b * rescale_b
            for ni in range(S_TILES):
                s[ni, 0], s[ni, 1] = math.exp2(s[ni, 0] - m_a), math.exp2(s[ni, 1] - m_a)
                s[ni, 2], s[ni, 3] = math.exp2(s[ni, 2] - m_b), math.exp2(s[ni, 3] - m_b)
                l_a += s[ni, 0] + s[ni, 1]
                l_b += s[ni, 2] + s[ni, 3]
            for nd in range(O_TILES):
                o[nd, 0], o[nd, 1] = o[nd, 0] * rescale_a, o[nd, 1] * rescale_a
                o[nd, 2], o[nd, 3] = o[nd, 2] * rescale_b, o[nd, 3] * rescale_b
            add_values(s, vt_tile, o)
        cuda.syncthreads()  # every warp is done with the chunk in shared memory
        if more:
            store_chunk(kreg, vreg, k_tile, vt_tile)
            cuda.syncthreads()
    l_a, l_b = quad_sum(l_a), quad_sum(l_b)
    for nd in range(O_TILES):
        e = nd * 8 + 2 * t
        if ja < n:
            out[ta, ha * HEAD_DIM + e] = o[nd, 0] / l_a
            out[ta, ha * HEAD_DIM + e + 1] = o[nd, 1] / l_a
        if jb < n:
            out[tb, hb * HEAD_DIM + e] = o[nd, 2] / l_b
            out[tb, hb * HEAD_DIM + e + 1] = o[nd, 3] / l_b
