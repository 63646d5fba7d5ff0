"""Paged attention over a ragged flat batch: every token attends to its own sequence's past.

A work item is one (token, query head). The block walks the token's context — positions
``0..p`` of its sequence, found through the block table — in chunks of ``THREADS`` positions:

1. each thread scores one position: ``s = q . k / sqrt(E)`` (the key read from its paged slot);
2. an *online softmax* (Milakov & Gimelshein; FlashAttention) keeps a running max ``m`` and
   running sum ``l``: a new chunk with a larger max rescales what was accumulated by
   ``exp(m_old - m_new)``, so the scores never need to be stored beyond one chunk;
3. thread ``e`` accumulates output dimension ``e``: ``acc_e += sum_j exp(s_j - m) * v_j[e]``.

At the end ``out = acc / l``. Grouped-query attention: query head ``h`` reads kv head
``h // (H / K)``. Causality needs no mask: a token only walks positions ``<= p``, and this
step's keys were written (``rope.py``) before this kernel runs.
"""

from __future__ import annotations

import math

from numba import float32

from .reduce import NEG_INF, THREADS, block_max, block_sum, cuda


@cuda.jit(device=True)
def paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, block, n_blocks):
    """out (T, H * E) = softmax(q k^T / sqrt(E)) v per (token, head), q read from qkv (T, ...).
    Requires E <= THREADS."""
    tid = cuda.threadIdx.x
    B = kv_pool.shape[3]
    E = kv_pool.shape[5]
    group = num_heads // num_kv_heads
    scale = float32(1) / math.sqrt(float32(E))
    q = cuda.shared.array(THREADS, float32)  # this item's query vector (E <= THREADS)
    weights = cuda.shared.array(THREADS, float32)  # exp(score - m) of the current chunk
    scratch = cuda.shared.array(THREADS, float32)
    for item in range(block, qkv.shape[0] * num_heads, n_blocks):
        t, h = item // num_heads, item % num_heads
        kvh = h // group
        row = seq_rows[t]
        context = positions[t] + 1
        if tid < E:
            q[tid] = qkv[t, h * E + tid]
        cuda.syncthreads()
        m = NEG_INF
        total = float32(0)
        acc = float32(0)
        for start in range(0, context, THREADS):
            c = start + tid
            score = NEG_INF
            if c < context:
                blk = block_tables[row, c // B]
                score = float32(0)
                for e in range(E):
                    score += q[e] * kv_pool[blk, layer, 0, c % B, kvh, e]
                score *= scale
            m_new = max(m, block_max(score, scratch))
            w = math.exp(score - m_new) if c < context else float32(0)
            weights[tid] = w
            rescale = math.exp(m - m_new)  # 0 on the first chunk (m = -inf)
            total = total * rescale + block_sum(w, scratch)
            if tid < E:
                acc *= rescale
                for j in range(min(THREADS, context - start)):
                    c2 = start + j
                    acc += weights[j] * kv_pool[block_tables[row, c2 // B], layer, 1, c2 % B, kvh, tid]
            m = m_new
            cuda.syncthreads()
        if tid < E:
            out[t, h * E + tid] = acc / total
        cuda.syncthreads()


@cuda.jit
def paged_attention_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                           num_kv_heads, out):
    paged_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                    num_kv_heads, out, cuda.blockIdx.x, cuda.gridDim.x)
