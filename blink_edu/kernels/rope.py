"""Rotary position embedding, and writing this step's keys and values into the paged KV pool.

Fused on purpose: right after the q/k/v projection, each token's key must be rotated *and then*
stored in its paged slot, so one kernel does both (and rotates the queries in place for the
attention kernel that follows). Every rotation pair and every value of the batch gets its own
thread of the grid, so even a single decode token is spread over several blocks. Llama's "rotate half" convention pairs element ``i`` with
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
    pairs = (H + K) * half  # per token: this many rotation pairs, then K * E values to copy
    per_token = pairs + K * E
    for e in range(block * THREADS + cuda.threadIdx.x, qkv.shape[0] * per_token,
                   n_blocks * THREADS):
        t, j = e // per_token, e % per_token
        p = positions[t]
        blk = block_tables[seq_rows[t], p // B]
        slot = p % B
        if j < pairs:  # one rotation pair
            head, i = j // half, j % half
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
        else:  # a value: a plain copy
            v = j - pairs
            kv_pool[blk, layer, 1, slot, v // E, v % E] = qkv[t, (H + K) * E + v]


def rope_work_items(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """Blocks that give every rotation pair and every value copy of the batch its own thread."""
    per_token = (num_heads + num_kv_heads) * (head_dim // 2) + num_kv_heads * head_dim
    return -(-num_tokens * per_token // THREADS)


@cuda.jit
def rope_and_write_kv_kernel(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                             num_heads, num_kv_heads):
    rope_and_write_kv(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                      num_heads, num_kv_heads, cuda.blockIdx.x, cuda.gridDim.x)
