"""Gathering KV blocks into one contiguous staging buffer, and scattering them back.

SuperInfer §4 (DuplexKV's layout transformation + batched transfer) and DESIGN.md §6. The link
between GPU and host runs at full speed only for copies of several MiB (DESIGN.md §4: 64 KiB
copies reach ~20 GB/s on PCIe, >= 8 MiB copies ~55). The blocks a step wants to move are scattered
over the pool, so DuplexKV first *gathers* them, on the GPU at HBM speed, into one contiguous
staging buffer, and moves that with a single large copy; the way back is a large copy into
staging followed by a *scatter* into the pool.

The pool is block-first, ``(N, L, 2, B, K, E)``: one block is one contiguous row of
``L * 2 * B * K * E`` elements. So both directions are row moves on 2-D views::

    gather:   staging[i, :] = pool[rows[i], :]     for i < n     (pool -> staging)
    scatter:  pool[rows[i], :] = staging[i, :]     for i < n     (staging -> pool)

One device function does both (``gather`` picks the direction). Its work item is one chunk of
``ROW_CHUNK`` words of one row; the threads of a CUDA block stride over the chunk's words, the CUDA
blocks over the work items. Callers pass 2-D views of 64-bit words where the row length allows
(``as_rows``): a block is copied 8 bytes per thread per iteration whatever the KV dtype.
"""

from __future__ import annotations

import numpy as np

from .reduce import THREADS, cuda, grid_for

ROW_CHUNK = 4096  # words of one row per work item


@cuda.jit(device=True)
def move_rows(src, dst, rows, gather, worker, n_workers):
    """gather: dst[i] = src[rows[i]]; else dst[rows[i]] = src[i]. src, dst (rows, W) same dtype;
    rows (n,) int32."""
    W = src.shape[1]
    chunks = (W + ROW_CHUNK - 1) // ROW_CHUNK
    for task in range(worker, rows.shape[0] * chunks, n_workers):
        i = task // chunks
        start = (task % chunks) * ROW_CHUNK
        stop = min(start + ROW_CHUNK, W)
        r = rows[i]
        for w in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            if gather:
                dst[i, w] = src[r, w]
            else:
                dst[r, w] = src[i, w]


@cuda.jit
def move_rows_kernel(src, dst, rows, gather):
    move_rows(src, dst, rows, gather, cuda.blockIdx.x, cuda.gridDim.x)


def as_rows(blocks):
    """A (N, ...) C-contiguous array (NumPy, Numba device or CuPy) as (N, W) rows, in 64-bit
    words when a row's bytes divide by 8 (else in its own dtype). No copy."""
    rows = blocks.reshape(blocks.shape[0], -1)  # (N, elements per block)
    if (rows.shape[1] * rows.dtype.itemsize) % 8 == 0 and rows.dtype.itemsize != 8:
        rows = rows.view(np.uint64)  # (N, W) words
    return rows


def _launch(src, dst, rows, gather: bool, stream) -> None:
    n_items = rows.shape[0] * -(-src.shape[1] // ROW_CHUNK)
    move_rows_kernel[grid_for(n_items), THREADS, stream](src, dst, rows, gather)


def gather_blocks(pool_rows, block_ids, staging_rows, stream=0) -> None:
    """staging_rows[i] = pool_rows[block_ids[i]] for i < len(block_ids). All device arrays:
    pool_rows (N, W), block_ids (n,) int32, staging_rows (>= n, W)."""
    _launch(pool_rows, staging_rows, block_ids, True, stream)


def scatter_blocks(staging_rows, block_ids, pool_rows, stream=0) -> None:
    """pool_rows[block_ids[i]] = staging_rows[i] for i < len(block_ids) (the inverse)."""
    _launch(staging_rows, pool_rows, block_ids, False, stream)
