"""The KV pool: every layer's keys and values, cut into fixed-size blocks, block-first.

docs/design.md §6, SuperInfer §4 (DuplexKV's block-first layout). The pool is one array

    kv[block, layer, k_or_v, slot_in_block, kv_head, head_dim]   (N, L, 2, B, K, E)

so everything one block holds — all layers' K and V for ``B`` consecutive tokens of one
sequence — is one contiguous run of memory. Moving a block between GPU and host is then a
single large copy instead of ``2 * L`` small ones (the layer-first layout
``(L, 2, N, B, K, E)`` scatters a block over ``2 * L`` places): the difference between ~10 and
~55 GB/s on PCIe in SuperInfer's Table 1.

A token at position ``p`` of a sequence lives in block ``block_table[p // B]`` at slot ``p % B``.
"""

from __future__ import annotations

import numpy as np

from ..config import ModelConfig


def kv_pool_shape(config: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """(N, L, 2, B, K, E)"""
    return (num_blocks, config.num_layers, 2, block_size, config.num_kv_heads, config.head_dim)


def allocate_kv_pool(config: ModelConfig, num_blocks: int, block_size: int = 16,
                     dtype=np.float32, xp=np) -> "np.ndarray":
    """A zeroed block-first pool of ``num_blocks`` blocks. ``xp`` is numpy or cupy."""
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
    return xp.zeros(kv_pool_shape(config, num_blocks, block_size), dtype=dtype)


def block_nbytes(config: ModelConfig, block_size: int, itemsize: int = 2) -> int:
    """Bytes in one block: all layers, K and V. (Qwen2.5-32B, B=16, fp16: 4 MiB.)"""
    return config.num_layers * 2 * block_size * config.num_kv_heads * config.head_dim * itemsize
