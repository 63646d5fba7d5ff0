"""Block-wide reductions in shared memory, and the launch geometry every op kernel shares.

A CUDA block of ``THREADS`` threads cooperates on each work item. Reductions (a sum over a row,
the max of some scores) go through a shared-memory tree: each thread writes its value, then
half the threads add the other half's, ``log2(THREADS)`` times, with a barrier between levels.
Warp shuffles would be faster on a GPU, but Numba's simulator does not implement them; a
shared-memory tree runs everywhere, so the same code is tested on a laptop and run on an H200.

``THREADS`` is 128 on a GPU and 32 in the simulator, where every CUDA thread is a Python thread
and fewer threads per block keep tests fast. Code must only assume a power of two >= 32.

In the simulator a barrier costs milliseconds (32 Python threads meet), so there the reductions
take their simulator form: every thread writes its value, one barrier, and every thread adds up
all ``THREADS`` values itself — two barriers instead of ``2 + log2(THREADS)``. Same result (up to
float rounding order), same contract; only the GPU form is worth its extra barriers.
"""

from __future__ import annotations

import math

from numba import float32, int32

from ..backend import get_backend

cuda = get_backend().cuda
SIMULATOR = get_backend().is_simulator
THREADS = 32 if SIMULATOR else 128


def grid_for(n_items: int, max_blocks: int = 1024) -> int:
    """How many blocks to launch for ``n_items`` work items (the device functions loop the rest).
    The simulator runs blocks one after another, so there one block is as fast as many."""
    if get_backend().is_simulator:
        return 1
    return max(1, min(n_items, max_blocks))


@cuda.jit(device=True, inline=True)
def _tree_sum(value, scratch):
    """GPU form: a shared-memory tree, log2(THREADS) levels."""
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
def _tree_max(value, scratch):
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
def _tree_argmax(value, index, values, indices):
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


@cuda.jit(device=True, inline=True)
def _serial_sum(value, scratch):
    """Simulator form: every thread adds all THREADS values (two barriers)."""
    scratch[cuda.threadIdx.x] = value
    cuda.syncthreads()
    total = float32(0)
    for j in range(THREADS):
        total += scratch[j]
    cuda.syncthreads()
    return total


@cuda.jit(device=True, inline=True)
def _serial_max(value, scratch):
    scratch[cuda.threadIdx.x] = value
    cuda.syncthreads()
    best = scratch[0]
    for j in range(1, THREADS):
        best = max(best, scratch[j])
    cuda.syncthreads()
    return best


@cuda.jit(device=True, inline=True)
def _serial_argmax(value, index, values, indices):
    values[cuda.threadIdx.x] = value
    indices[cuda.threadIdx.x] = index
    cuda.syncthreads()
    best, where = values[0], indices[0]
    for j in range(1, THREADS):
        if values[j] > best or (values[j] == best and indices[j] < where):
            best, where = values[j], indices[j]
    cuda.syncthreads()
    return best, where


# block_sum(value, scratch) / block_max(value, scratch): the reduction over the block's threads,
# every thread gets the result; scratch is a shared float32 (THREADS,).
# block_argmax(value, index, values, indices): (max value, its lowest index).
block_sum = _serial_sum if SIMULATOR else _tree_sum
block_max = _serial_max if SIMULATOR else _tree_max
block_argmax = _serial_argmax if SIMULATOR else _tree_argmax


NEG_INF = float32(-math.inf)
ZERO_I32 = int32(0)
