"""Rotary position embedding, and writing this step's keys and values into the paged KV pool.

Fused on purpose: right after the q/k/v projection, each token's key must be rotated *and then*
stored in its paged slot, so one kernel does both (and rotates the queries in place for the
attention kernel that follows). Every pair of the batch gets its own thread of the grid, so even
a single decode token is spread over several blocks. Llama's "rotate half" convention pairs
element ``i`` with ``i + E/2``; ``cos``/``sin`` come from a table precomputed on the host,
indexed by position. Values are moved in the same pairs, unrotated.

At decode this kernel does not run at all: the qkv GEMV computes each pair itself and places it
with the same ``place_pair`` in its epilogue (``linear.py``), which saves a launch and a round
trip of q, k and v through memory every layer.

The paged slot of a token at position ``p`` of the sequence in block-table row ``s``:
``block = block_tables[s, p // B]``, ``slot = p % B``; the pool is block-first,
``kv_pool[block, layer, 0 (K) | 1 (V), slot, kv_head, :]``.
"""

from __future__ import annotations


from .reduce import THREADS, cuda, divmod32


@cuda.jit(device=True, inline=True)
def paged_slot(block_tables, row, p, block_size):
    """(block, slot) of position ``p`` of the sequence in block-table row ``row``:
    ``(block_tables[row, p // B], p % B)``, divided by ``reduce.divmod32`` (the prompt attention
    tile did eight signed 64-bit divisions a chunk before it did)."""
    page, slot = divmod32(p, block_size)
    return block_tables[row, page], slot


@cuda.jit(device=True, inline=True)
def pair_target(positions, seq_rows, block_tables, cos, sin, t, i, block_size):
    """What placing pair ``i`` of token t needs: (cos, sin) of its rotation at the token's
    position p, and its paged slot (block, slot) = (block_tables[s, p // B], p % B) (the module
    docstring). Its own function so that a caller can issue these loads early (``linear.py``
    reads them before its dot products, so that they overlap)."""
    p = positions[t]
    blk, slot = paged_slot(block_tables, seq_rows[t], p, block_size)
    return cos[p, i], sin[p, i], blk, slot


@cuda.jit(device=True, inline=True)
def place_pair(qkv, t, head, i, x1, x2, target, kv_pool, layer, num_heads, num_kv_heads):
    """Where elements i and i + E/2 of head ``head`` of token t's fresh [q | k | v] go: a query
    pair rotated, in place in qkv (T, (H + 2K) E); a key pair rotated and a value pair as it is,
    into the token's paged slot of kv_pool (N, L, 2, B, K, E). ``target``: ``pair_target``'s
    (cos, sin, block, slot). ``rope_and_write_kv`` calls it with the pair read from qkv; the
    qkv GEMV (``linear.py``), at decode, with the pair it has just computed."""
    E = kv_pool.shape[5]
    half = E // 2
    H, K = num_heads, num_kv_heads
    c, s, blk, slot = target
    if head < H + K:  # a query or key pair: rotate by the token's position
        x1, x2 = x1 * c - x2 * s, x2 * c + x1 * s
    if head < H:
        qkv[t, head * E + i] = x1
        qkv[t, head * E + i + half] = x2
    else:
        which = 0 if head < H + K else 1  # 0: keys, 1: values
        kv_head = head - H - which * K
        kv_pool[blk, layer, which, slot, kv_head, i] = x1
        kv_pool[blk, layer, which, slot, kv_head, i + half] = x2


@cuda.jit(device=True)
def rope_and_write_kv(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                      num_heads, num_kv_heads, block, n_blocks):
    """qkv (T, (H + 2K) * E) = [q | k | v] per token: rotates q in place, writes rotated k and v
    to the pool. cos, sin (max_positions, E/2); kv_pool (N, L, 2, B, K, E). One thread a pair
    (i, i + E/2) of one head of one token: (H + 2K) E / 2 pairs a token."""
    E = kv_pool.shape[5]
    half = E // 2
    per_token = (num_heads + 2 * num_kv_heads) * half
    for e in range(block * THREADS + cuda.threadIdx.x, qkv.shape[0] * per_token,
                   n_blocks * THREADS):
        t, j = e // per_token, e % per_token
        head, i = j // half, j % half
        target = pair_target(positions, seq_rows, block_tables, cos, sin, t, i, kv_pool.shape[3])
        place_pair(qkv, t, head, i, qkv[t, head * E + i], qkv[t, head * E + i + half], target,
                   kv_pool, layer, num_heads, num_kv_heads)


def rope_work_items(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """Blocks that give every rotation pair and every value copy of the batch its own thread."""
    per_token = (num_heads + 2 * num_kv_heads) * (head_dim // 2)
    return -(-num_tokens * per_token // THREADS)


@cuda.jit
def rope_and_write_kv_kernel(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                             num_heads, num_kv_heads):
    rope_and_write_kv(qkv, positions, seq_rows, block_tables, cos, sin, kv_pool, layer,
                      num_heads, num_kv_heads, cuda.blockIdx.x, cuda.gridDim.x)
