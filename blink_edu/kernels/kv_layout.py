"""Gathering KV blocks into one contiguous staging buffer, and scattering them back.

SuperInfer §4 (DuplexKV's layout transformation + batched transfer) and docs/design.md §6. The link
between GPU and host runs at full speed only for copies of several MiB (docs/design.md §4: 64 KiB
copies reach ~20 GB/s on PCIe, >= 8 MiB copies ~55). The blocks a step wants to move are scattered
over the pool, so DuplexKV first *gathers* them, on the GPU at HBM speed, into one contiguous
staging buffer, and moves that with a single large copy; the way back is a large copy into
staging followed by a *scatter* into the pool.

The pool is block-first, ``(N, L, 2, B, K, E)``: one block is one contiguous row of
``L * 2 * B * K * E`` elements. So both directions are row moves on 2-D views::

    gather:   staging[i, :] = pool[rows[i], :]     for i < n     (pool -> staging)
    scatter:  pool[rows[i], :] = staging[i, :]     for i < n     (staging -> pool)

One device function, ``move_rows``, does every move: ``dst[dst_rows[i]] = src[src_rows[i]]``,
where an empty index array stands for ``i`` itself -- a gather names only the source rows, a
scatter only the destination rows, and a *mapped* copy (``kv/transfer.py``'s ``MappedTransport``:
the host arena mapped into the GPU's address space, so the kernel reads and writes host memory
itself, no staging buffer and no memcpy) names both. Its work item is one chunk of
``ROW_CHUNK`` words of one row; the threads of a CUDA block stride over the chunk's words, the CUDA
blocks over the work items. Callers pass 2-D views of 64-bit words where the row length allows
(``as_rows``): a block is copied 8 bytes per thread per iteration whatever the KV dtype.
"""

from __future__ import annotations

import numpy as np

from .reduce import THREADS, cuda, grid_for

ROW_CHUNK = 4096  # words of one row per work item


@cuda.jit(device=True)
def move_rows(src, dst, src_rows, dst_rows, n, worker, n_workers):
    """dst[dst_rows[i]] = src[src_rows[i]] for i < n. src, dst (rows, W) same dtype; src_rows,
    dst_rows (>= n,) int32, or empty: an empty index array stands for ``i`` itself (gather:
    ``dst_rows`` empty; scatter: ``src_rows`` empty; a mapped copy names both)."""
    W = src.shape[1]
    chunks = (W + ROW_CHUNK - 1) // ROW_CHUNK
    for task in range(worker, n * chunks, n_workers):
        i = task // chunks
        start = (task % chunks) * ROW_CHUNK
        stop = min(start + ROW_CHUNK, W)
        s = src_rows[i] if src_rows.shape[0] > 0 else i
        d = dst_rows[i] if dst_rows.shape[0] > 0 else i
        for w in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            dst[d, w] = src[s, w]


@cuda.jit
def move_rows_kernel(src, dst, src_rows, dst_rows):
    """``move_rows`` over every row the index arrays name."""
    n = max(src_rows.shape[0], dst_rows.shape[0])
    move_rows(src, dst, src_rows, dst_rows, n, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def move_counted_rows_kernel(src, dst, src_rows, dst_rows, count):
    """``move_rows`` over the first ``count[0]`` rows: the count is read from memory when the
    kernel runs, so one captured launch (a CUDA graph) serves every ticket size."""
    move_rows(src, dst, src_rows, dst_rows, count[0], cuda.blockIdx.x, cuda.gridDim.x)


def as_rows(blocks):
    """A (N, ...) C-contiguous array (NumPy, Numba device or CuPy) as (N, W) rows, in 64-bit
    words when a row's bytes divide by 8 (else in its own dtype). No copy."""
    rows = blocks.reshape(blocks.shape[0], -1)  # (N, elements per block)
    if (rows.shape[1] * rows.dtype.itemsize) % 8 == 0 and rows.dtype.itemsize != 8:
        rows = rows.view(np.uint64)  # (N, W) words
    return rows


_NO_ROWS = None  # an empty int32 device array: "row i itself"


def no_rows():
    global _NO_ROWS
    if _NO_ROWS is None:
        _NO_ROWS = cuda.to_device(np.zeros(0, np.int32))
    return _NO_ROWS


def grid_for_rows(n_rows: int, row_words: int) -> int:
    """CUDA blocks for moving ``n_rows`` rows of ``row_words`` words: one per work item."""
    return grid_for(n_rows * -(-row_words // ROW_CHUNK))


def gather_blocks(pool_rows, block_ids, staging_rows, stream=0) -> None:
    """staging_rows[i] = pool_rows[block_ids[i]] for i < len(block_ids). All device arrays:
    pool_rows (N, W), block_ids (n,) int32, staging_rows (>= n, W)."""
    grid = grid_for_rows(block_ids.shape[0], pool_rows.shape[1])
    move_rows_kernel[grid, THREADS, stream](pool_rows, staging_rows, block_ids, no_rows())


def scatter_blocks(staging_rows, block_ids, pool_rows, stream=0) -> None:
    """pool_rows[block_ids[i]] = staging_rows[i] for i < len(block_ids) (the inverse)."""
    grid = grid_for_rows(block_ids.shape[0], pool_rows.shape[1])
    move_rows_kernel[grid, THREADS, stream](staging_rows, pool_rows, no_rows(), block_ids)
