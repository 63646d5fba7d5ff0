"""Block-wide reductions in shared memory, and the launch geometry every op kernel shares.

A CUDA block of ``THREADS`` threads cooperates on each work item. Reductions (a sum over a row,
the max of some scores) take two levels on a GPU:

1. **within a warp** — the 32 threads that execute in lock step exchange registers with
   ``shfl_xor``: after 5 butterfly exchanges (offsets 16, 8, 4, 2, 1) every lane holds the sum of
   all 32, with no shared memory and no barrier;
2. **across the block's warps** — one value per warp goes to shared memory, one barrier, and every
   thread adds up the ``THREADS / 32`` values.

Two barriers per reduction, whatever ``THREADS`` is (a shared-memory tree needs ``2 + log2(THREADS)``).

``THREADS`` is 128 on a GPU and 32 in the simulator, where every CUDA thread is a Python thread
and fewer threads per block keep tests fast. Code must only assume a power of two >= 32.

Numba's simulator has no warp shuffles, so there the reductions take their simulator form: every
thread writes its value to shared memory, one barrier, and every thread adds up all ``THREADS``
values itself. Same two barriers, same result (up to float rounding order), same contract.
"""

from __future__ import annotations

import math

from numba import float32, int32, uint32

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


def kernel_for_blocks_per_sm(blocks: int):
    """``cuda.jit`` for a kernel of THREADS-thread blocks that must fit ``blocks`` blocks on an
    SM: launch bounds make the compiler keep to 65536 / (blocks x THREADS) registers a thread.
    Registers go by eights: at 128 threads a block, 96 registers fit five blocks on an SM, 100
    only four — and a grid of 576 blocks (a batch-64 decode step's attention) then runs in two
    waves instead of one. (The simulator has no registers: plain ``cuda.jit``.)"""
    return cuda.jit if SIMULATOR else cuda.jit(launch_bounds=(THREADS, blocks))


WARP = 32
FULL_MASK = 0xFFFFFFFF
ZERO_I32 = int32(0)


@cuda.jit(device=True, inline=True)
def divmod32(a, b):
    """(a // b, a % b) for 0 <= a and 0 < b below 2^31, divided as unsigned 32-bit numbers.
    Python's ``//`` on Numba's default integers is a signed 64-bit division, which a GPU runs as
    a call into a ~40-instruction routine (and a sign fix-up) when ``b`` is not a constant: on a
    kernel's path from its work item to its first load, each one is a few hundred cycles. The
    results are int32: Numba widens unsigned arithmetic to uint64, and uint64 with int64 makes
    a float64, which cannot index an array."""
    au, bu = uint32(a), uint32(b)
    return int32(au // bu), int32(au % bu)


@cuda.jit(device=True, inline=True)
def warp_sum(value):
    """The sum over the 32 lanes of a warp, in every lane (butterfly shuffles; GPU only)."""
    offset = WARP // 2
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def warp_max(value):
    offset = WARP // 2
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def _shuffle_sum(value, scratch):
    """GPU form: shuffles inside each warp, then the warps' sums through shared memory."""
    value = warp_sum(value)
    if cuda.threadIdx.x % WARP == 0:
        scratch[cuda.threadIdx.x // WARP] = value
    cuda.syncthreads()
    total = float32(0)
    for j in range(THREADS // WARP):
        total += scratch[j]
    cuda.syncthreads()  # scratch may be reused right after
    return total


@cuda.jit(device=True, inline=True)
def _shuffle_max(value, scratch):
    value = warp_max(value)
    if cuda.threadIdx.x % WARP == 0:
        scratch[cuda.threadIdx.x // WARP] = value
    cuda.syncthreads()
    best = scratch[0]
    for j in range(1, THREADS // WARP):
        best = max(best, scratch[j])
    cuda.syncthreads()
    return best


@cuda.jit(device=True, inline=True)
def _shuffle_argmax(value, index, values, indices):
    offset = WARP // 2
    while offset > 0:
        v = cuda.shfl_xor_sync(FULL_MASK, value, offset)
        i = cuda.shfl_xor_sync(FULL_MASK, index, offset)
        if v > value or (v == value and i < index):
            value, index = v, i
        offset //= 2
    if cuda.threadIdx.x % WARP == 0:
        values[cuda.threadIdx.x // WARP] = value
        indices[cuda.threadIdx.x // WARP] = index
    cuda.syncthreads()
    best, where = values[0], indices[0]
    for j in range(1, THREADS // WARP):
        if values[j] > best or (values[j] == best and indices[j] < where):
            best, where = values[j], indices[j]
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


@cuda.jit(device=True, inline=True)
def _shuffle_exclusive_sum(value, scratch):
    """GPU form: an inclusive scan inside each warp by ``shfl_up`` (log2 32 = 5 steps), the warps'
    totals through shared memory, then each thread adds the totals of the warps before its own."""
    lane, warp = cuda.threadIdx.x % WARP, cuda.threadIdx.x // WARP
    inclusive = value
    offset = 1
    while offset < WARP:
        below = cuda.shfl_up_sync(FULL_MASK, inclusive, offset)
        if lane >= offset:
            inclusive += below
        offset *= 2
    if lane == WARP - 1:
        scratch[warp] = inclusive
    cuda.syncthreads()
    before, total = ZERO_I32, ZERO_I32
    for j in range(THREADS // WARP):
        if j < warp:
            before += scratch[j]
        total += scratch[j]
    cuda.syncthreads()
    return before + inclusive - value, total


@cuda.jit(device=True, inline=True)
def _serial_exclusive_sum(value, scratch):
    """Simulator form: every thread adds up the values of the threads before it."""
    scratch[cuda.threadIdx.x] = value
    cuda.syncthreads()
    before, total = ZERO_I32, ZERO_I32
    for j in range(THREADS):
        if j < cuda.threadIdx.x:
            before += scratch[j]
        total += scratch[j]
    cuda.syncthreads()
    return before, total


@cuda.jit(device=True, inline=True)
def _shuffle_quad_max(value):
    """GPU form: two butterfly exchanges inside the quad (lanes 4g .. 4g + 3)."""
    value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, 1))
    return max(value, cuda.shfl_xor_sync(FULL_MASK, value, 2))


@cuda.jit(device=True, inline=True)
def _shuffle_quad_sum(value):
    value += cuda.shfl_xor_sync(FULL_MASK, value, 1)
    return value + cuda.shfl_xor_sync(FULL_MASK, value, 2)


@cuda.jit(device=True, inline=True)
def _serial_quad_values(value):
    """Simulator form: the four values of this thread's quad, through shared memory (two barriers:
    every thread of the block must call it)."""
    scratch = cuda.shared.array(THREADS, float32)
    tid = cuda.threadIdx.x
    scratch[tid] = value
    cuda.syncthreads()
    first = tid - tid % 4
    v0, v1, v2, v3 = scratch[first], scratch[first + 1], scratch[first + 2], scratch[first + 3]
    cuda.syncthreads()
    return v0, v1, v2, v3


@cuda.jit(device=True, inline=True)
def _serial_quad_max(value):
    v0, v1, v2, v3 = _serial_quad_values(value)
    return max(max(v0, v1), max(v2, v3))


@cuda.jit(device=True, inline=True)
def _serial_quad_sum(value):
    v0, v1, v2, v3 = _serial_quad_values(value)
    return (v0 + v1) + (v2 + v3)


# block_sum(value, scratch) / block_max(value, scratch): the reduction over the block's threads,
# every thread gets the result; scratch is a shared float32 (THREADS,).
# block_argmax(value, index, values, indices): (max value, its lowest index).
block_sum = _serial_sum if SIMULATOR else _shuffle_sum
block_max = _serial_max if SIMULATOR else _shuffle_max
block_argmax = _serial_argmax if SIMULATOR else _shuffle_argmax
# block_exclusive_sum(value, scratch): (the sum of ``value`` over the threads before this one, the
# sum over all); int32 values, scratch a shared int32 (THREADS,). Where each thread's items go in
# a list that every thread appends to, in thread order.
block_exclusive_sum = _serial_exclusive_sum if SIMULATOR else _shuffle_exclusive_sum
# quad_sum(value) / quad_max(value): over the 4 lanes of a quad (lanes 4g .. 4g + 3 of a warp),
# the lanes that hold one row of an mma fragment (``matmul_tc.py``); every lane gets the result.
quad_sum = _serial_quad_sum if SIMULATOR else _shuffle_quad_sum
quad_max = _serial_quad_max if SIMULATOR else _shuffle_quad_max


@cuda.jit(device=True, inline=True)
def last_block_to_arrive(arrivals, index, count, flag):
    """Count this block's part of work item ``index`` done (``arrivals[index]``), once its writes
    are visible to the whole GPU; True, in every thread, for the block that arrives ``count``-th:
    it may now read every part (the "last block" pattern of CUDA's threadFenceReduction sample:
    no second kernel, no barrier), and it resets the count for the next layer. ``flag``: shared
    memory, one word (flag[0]). Every thread of the block must call it."""
    cuda.threadfence()  # this block's writes reach L2 before its arrival is counted
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        last = cuda.atomic.add(arrivals, index, 1) == count - 1
        if last:
            arrivals[index] = 0  # read again only after a kernel or grid barrier
        flag[0] = 1 if last else 0
    cuda.syncthreads()
    return flag[0] == 1


NEG_INF = float32(-math.inf)
