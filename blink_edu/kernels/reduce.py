"""Block-wide reductions in shared memory, and the launch geometry every op kernel shares.

A CUDA block of ``THREADS`` threads cooperates on each work item. Reductions (a sum over a row,
the max of some scores) go through a shared-memory tree: each thread writes its value, then
half the threads add the other half's, ``log2(THREADS)`` times, with a barrier between levels.
Warp shuffles would be faster on a GPU, but Numba's simulator does not implement them; a
shared-memory tree runs everywhere, so the same code is tested on a laptop and run on an H200.

``THREADS`` is 128 on a GPU and 32 in the simulator, where every CUDA thread is a Python thread
and fewer threads per block keep tests fast. Code must only assume a power of two >= 32.
"""

from __future__ import annotations

import math

from numba import float32, int32

from ..backend import get_backend

cuda = get_backend().cuda
THREADS = 32 if get_backend().is_simulator else 128


def grid_for(n_items: int, max_blocks: int = 1024) -> int:
    """How many blocks to launch for ``n_items`` work items (the device functions loop the rest).
    The simulator runs blocks one after another, so there one block is as fast as many."""
    if get_backend().is_simulator:
        return 1
    return max(1, min(n_items, max_blocks))


@cuda.jit(device=True, inline=True)
def block_sum(value, scratch):
    """Sum of ``value`` over the block's threads; every thread gets the total.
    scratch: shared float32 (THREADS,)."""
    tid = cuda.threadIdx.x
    scratch[tid] = value
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            scratch[tid] += scratch[tid + stride]
        cuda.syncthreads()
        stride //= 2
    total = scratch[0]
    cuda.syncthreads()  # scratch may be reused right after
    return total


@cuda.jit(device=True, inline=True)
def block_max(value, scratch):
    """Max of ``value`` over the block's threads; every thread gets it."""
    tid = cuda.threadIdx.x
    scratch[tid] = value
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            scratch[tid] = max(scratch[tid], scratch[tid + stride])
        cuda.syncthreads()
        stride //= 2
    best = scratch[0]
    cuda.syncthreads()
    return best


@cuda.jit(device=True, inline=True)
def block_argmax(value, index, values, indices):
    """(max value, its lowest index) over the block; shared scratch ``values``/``indices``."""
    tid = cuda.threadIdx.x
    values[tid] = value
    indices[tid] = index
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            v, i = values[tid + stride], indices[tid + stride]
            if v > values[tid] or (v == values[tid] and i < indices[tid]):
                values[tid] = v
                indices[tid] = i
        cuda.syncthreads()
        stride //= 2
    best, where = values[0], indices[0]
    cuda.syncthreads()
    return best, where


NEG_INF = float32(-math.inf)
ZERO_I32 = int32(0)
