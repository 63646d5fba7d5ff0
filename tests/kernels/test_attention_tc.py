"""The tensor-core attention tile (``attention_tc.py``) against the NumPy reference: prompt chunks
and decode tokens in one ragged batch, every group size of grouped-query attention."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.kernels.attention import (attention_kernel, attention_scratch, attention_splits,
                                         attention_work_items,
                                         paged_attention_kernel, uses_attention_tiles)
from blink_edu.kernels.attention_tc import HEAD_DIM, ROWS
from blink_edu.kernels.reduce import THREADS, cuda, grid_for

from test_ops import attention_inputs, rel_err


def chunk_batch(rng, chunks, block_size, num_blocks):
    """A flat batch of (first position, tokens) chunks, one sequence each, over scattered blocks:
    positions (T,), seq_rows (T,), block_tables (S, W)."""
    ends = [start + n for start, n in chunks]
    width = -(-max(ends) // block_size)
    blocks = rng.permutation(num_blocks)
    assert len(chunks) * width <= num_blocks
    tables = blocks[:len(chunks) * width].reshape(len(chunks), width).astype(np.int32)
    positions = np.concatenate([np.arange(s, s + n) for s, n in chunks]).astype(np.int32)
    seq_rows = np.concatenate([[r] * n for r, (_, n) in enumerate(chunks)]).astype(np.int32)
    return positions, seq_rows, tables


def attention(qkv, positions, seq_rows, tables, pool, layer, H, K, tensor_cores):
    T, E = len(positions), pool.shape[-1]
    out = cuda.to_device(np.full((T, H * E), np.nan, np.float32))
    grid = grid_for(attention_work_items(T, H, K, E, tensor_cores))
    attention_kernel(uses_attention_tiles(tensor_cores, True, H // K, E))[grid, THREADS](
        cuda.to_device(qkv), cuda.to_device(positions), cuda.to_device(seq_rows),
        cuda.to_device(tables), cuda.to_device(pool), layer, H, K, out, *attention_scratch(E))
    return out.copy_to_host()


def tile_tokens(positions, seq_rows, group):
    """Which tokens sit in a tile of consecutive positions of one sequence (the tile's work)."""
    per_tile, T = ROWS // group, len(positions)
    mask = np.zeros(T, bool)
    for t0 in range(0, T, per_tile):
        t1 = min(T, t0 + per_tile) - 1
        if seq_rows[t0] == seq_rows[t1] and positions[t1] - positions[t0] == t1 - t0:
            mask[t0:t1 + 1] = True
    return mask


def random_case(rng, H, K, chunks, B=4, N=48):
    positions, seq_rows, tables = chunk_batch(rng, chunks, B, N)
    (qkv, pool, layer), expected = attention_inputs(rng, positions, seq_rows, tables, H, K,
                                                    HEAD_DIM, B, N)
    return (qkv, positions, seq_rows, tables, pool, layer), expected


# 3 and 4 query heads a KV head (2: the ragged batch below; 1: the GPU test); KV blocks of 4
# positions, and of 5 — a chunk of KC positions is then no whole number of blocks (the tile moves
# its paged slots on a chunk with a carry) and a value pair can straddle two blocks
@pytest.mark.parametrize("heads,kv_heads,block_size", [(6, 2, 4), (4, 1, 4), (6, 2, 5)])
def test_prompt_tiles_match_the_reference(rng, heads, kv_heads, block_size):
    """Chunks that fill whole tiles (the simulator's block is one warp, 32 threads: the per-token
    path there cannot take a 64-dim head, so every token here is a tile's): a chunk of two tiles
    after cached positions and a last lone token, over scattered blocks."""
    from blink_edu.kernels.attention_tc import KC
    H, K = heads, kv_heads
    per_tile = ROWS // (H // K)
    # contexts over several chunks of KC positions (the simulator's KC is the GPU's, 32)
    chunks = [(int(rng.integers(35, 60)), 2 * per_tile), (int(rng.integers(64, 100)), 1)]
    args, expected = random_case(rng, H, K, chunks, B=block_size, N=64)
    assert args[1].max() >= 2 * KC  # the walk crosses several chunks
    assert tile_tokens(args[1], args[2], H // K).all()
    tiled = attention(*args, H, K, tensor_cores=1)
    # fp16 operands (q, k, v and the probabilities), fp32 sums: within fp16 rounding
    assert rel_err(tiled, expected) < 1e-2
    assert rel_err(tiled, expected) > 1e-6, "the tile rounds to fp16"
    for t in range(len(expected)):  # every token, not only on average
        assert rel_err(tiled[t], expected[t]) < 2e-2, t


def check_ragged_batch(rng, H, K, chunks, B, N):
    """Prompt chunks beside decode tokens: tiles inside the chunks take the tensor cores, tiles
    across a seam or over decode tokens the float32 path, bit for bit what it computes alone."""
    per_tile = ROWS // (H // K)
    args, expected = random_case(rng, H, K, chunks, B=B, N=N)
    tiled = attention(*args, H, K, tensor_cores=1)
    plain = attention(*args, H, K, tensor_cores=0)
    in_tile = tile_tokens(args[1], args[2], H // K)
    assert in_tile.sum() >= per_tile and not in_tile.all(), "the batch should take both paths"
    assert 1e-6 < rel_err(tiled[in_tile], expected[in_tile]) < 1e-2
    np.testing.assert_array_equal(tiled[~in_tile], plain[~in_tile])
    assert rel_err(plain, expected) < 1e-5


def test_a_ragged_batch_takes_the_tile_for_prompt_chunks_only(rng):
    """A chunk of a tile and two tokens, a decode token, a chunk whose last three tokens fill a
    tile of their own."""
    per_tile = ROWS // 2
    check_ragged_batch(rng, 4, 2, [(int(rng.integers(3, 9)), per_tile + 2), (29, 1), (0, per_tile)],
                       B=4, N=48)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 1), (8, 8)])
def test_ragged_batches_take_the_tile_for_prompt_chunks_only(rng, heads, kv_heads):
    per_tile = ROWS // (heads // kv_heads)
    check_ragged_batch(rng, heads, kv_heads,
                       [(int(rng.integers(3, 90)), 3 * per_tile + int(rng.integers(2, per_tile))),
                        (29, 1), (40, 1), (0, per_tile + 3), (200, 1)], B=16, N=120)


def test_the_tile_declines_other_head_sizes():
    from blink_edu.kernels.attention_tc import tc_attention_tiles
    assert tc_attention_tiles(100, 3, HEAD_DIM) == -(-100 // (ROWS // 3))
    assert tc_attention_tiles(100, 3, 128) == 0
    assert tc_attention_tiles(100, ROWS + 1, HEAD_DIM) == 0
    assert attention_work_items(10, 4, 2, 32, True) == 10 * 4 * attention_splits(10 * 4)
    # a host launches the kernel without the tile unless the step can use it
    assert attention_kernel(uses_attention_tiles(True, True, 2, 32)) is paged_attention_kernel
    assert attention_kernel(uses_attention_tiles(True, False, 3, HEAD_DIM)) is paged_attention_kernel
    assert attention_kernel(uses_attention_tiles(False, True, 3, HEAD_DIM)) is paged_attention_kernel
    assert attention_kernel(uses_attention_tiles(True, True, 3, HEAD_DIM)) is not paged_attention_kernel
