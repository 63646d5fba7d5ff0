"""Rotary position embedding, and writing this step's keys and values into the paged KV pool.

Fused on purpose: right after the q/k/v projection, each token's key must be rotated *and then*
stored in its paged slot, so one kernel does both (and rotates the queries in place for the
attention kernel that follows). Llama's "rotate half" convention pairs element ``i`` with
``i + E/2``; ``cos``/``sin`` come from a table precomputed on the host, indexed by position.

The paged slot of a token at position ``p`` of the sequence in block-table row ``s``:
``block = block_tables[s, p // B]``, ``slot = p % B``; the pool is block-first,
``kv_pool[block, layer, 0 (K) | 1 (V), slot, kv_head, :]``.
"""

from __future__ import annotations

from .reduce import THREADS, cuda


@cuda.jit(device=True)
def rope_and_write_kv(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                      num_heads, num_kv_heads, block, n_blocks):
    """qkv (T, (H + 2K) * E) = [q | k | v] per token: rotates q in place, writes rotated k and v
    to the pool. cos, sin (max_positions, E/2); kv_pool (N, L, 2, B, K, E)."""
    B = kv_pool.shape[3]
    E = kv_pool.shape[5]
    half = E // 2
    H, K = num_heads, num_kv_heads
    for t in range(block, qkv.shape[0], n_blocks):
        p = positions[t]
        blk = block_tables[seq_rows[t], p // B]
        slot = p % B
        for e in range(cuda.threadIdx.x, (H + K) * half, THREADS):  # one rotation pair each
            head, i = e // half, e % half
            base = head * E  # q heads first, then k heads: the same offsets as in qkv
            x1, x2 = qkv[t, base + i], qkv[t, base + i + half]
            c, s = cos[p, i], sin[p, i]
            r1, r2 = x1 * c - x2 * s, x2 * c + x1 * s
            if head < H:
                qkv[t, base + i] = r1
                qkv[t, base + i + half] = r2
            else:
                kv_pool[blk, layer, 0, slot, head - H, i] = r1
                kv_pool[blk, layer, 0, slot, head - H, i + half] = r2
        for e in range(cuda.threadIdx.x, K * E, THREADS):  # values: a plain copy
            kv_pool[blk, layer, 1, slot, e // E, e % E] = qkv[t, (H + K) * E + e]


@cuda.jit
def rope_and_write_kv_kernel(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                             num_heads, num_kv_heads):
    rope_and_write_kv(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                      num_heads, num_kv_heads, cuda.blockIdx.x, cuda.gridDim.x)
