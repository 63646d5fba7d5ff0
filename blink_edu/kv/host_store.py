"""The host side of the KV cache: a pinned arena of KV blocks in CPU memory (DuplexKV's backing store).

SuperInfer §4 (DuplexKV) and docs/design.md §6. Blocks rotated out of the GPU, and the eager copies of
full (SYNCED) blocks, land here. The arena has the pool's block shape, host-block-first::

    host[h, layer, k_or_v, slot_in_block, kv_head, head_dim]     (H, L, 2, B, K, E)

**Why one arena allocated up front, with its own allocator.** Copies between GPU and host run
asynchronously, at full speed, only from *pinned* (page-locked) host memory, and pinning is slow
(the OS must lock every page: milliseconds per call, far more for GiBs). So, as SuperInfer's
public code does, all host KV memory is pinned once at start. The public code gives every GPU
block a permanent host twin (host block ``i`` mirrors GPU block ``i``). We keep the idea -- a
full block, once copied, keeps its host copy for the rest of its request's life, so a request
that is rotated out, back in and out again moves only its dirty tail every time -- but give the
host its own free list instead of a fixed twin: a GPU block is reused by other requests as soon as
its owner rotates out, while the owner's host copies must stay. A fixed twin would be overwritten
by the next owner's eager copy; a host allocator lets host copies outlive GPU ownership, and lets
the host hold more blocks than the GPU (rotated requests plus mirrors of resident ones).

**Contiguous runs.** ``allocate(n)`` prefers ``n`` consecutive host blocks: a batch of blocks
gathered into one staging buffer on the GPU then lands with *one* copy. When the arena is too
fragmented it falls back to the lowest free blocks (the transfer engine then issues one copy per
consecutive run).

**Copies in flight.** A host block with a copy in flight is not reused: ``free`` of such a block
defers it until ``end_transfer`` (the same rule as the GPU block manager's DRAINING state).
On a CPU-only machine (and in the simulator) the arena is a plain NumPy array.
"""

from __future__ import annotations

import numpy as np

from .block_manager import set_each


class OutOfHostBlocks(RuntimeError):
    """The host arena has too few free blocks for this rotation."""


def allocate_pinned(shape: tuple[int, ...], dtype, pinned: bool):
    """(array, device view): a zeroed host array and, when ``pinned``, the GPU's view of the very
    same bytes -- the array is page-locked and *mapped* into the GPU's address space (registered
    with the driver, as the ring's mapped words are), so copy engines move it at full speed and a
    kernel may read and write it directly (``kv/transfer.py``'s ``MappedTransport``). Not pinned:
    (a NumPy array, None)."""
    array = np.zeros(shape, dtype)
    if not pinned:
        return array, None
    from numba.cuda.cudadrv import devicearray

    from ..backend import get_backend

    array[...] = 0  # touch every page once, now, not in the middle of a timed copy
    ctx = get_backend().cuda.current_context()
    mapping = ctx.mempin(array, array.ctypes.data, array.nbytes, mapped=True)
    return array, devicearray.from_array_like(array, gpu_data=mapping)


def mapped_host_array(shape, dtype):
    """(host array, device view) of one small buffer that the host writes and a kernel reads:
    mapped pinned memory on a GPU; in Numba's simulator a NumPy array and a simulated device
    view of it."""
    from ..backend import get_backend

    if get_backend().is_simulator:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        array = np.zeros(shape, dtype)
        return array, FakeCUDAArray(array)
    return allocate_pinned(shape, dtype, pinned=True)


def consecutive_runs(ids) -> list[tuple[int, int]]:
    """Split ``ids`` (n,) into runs of consecutive values: [(offset into ids, run length)].
    (A plain loop: a ticket names a few dozen blocks, where NumPy's per-call cost dominates.)"""
    runs: list[tuple[int, int]] = []
    start, prev = 0, None
    for i, h in enumerate(ids.tolist() if isinstance(ids, np.ndarray) else ids):
        if prev is not None and h != prev + 1:
            runs.append((start, i - start))
            start = i
        prev = h
    if prev is not None:
        runs.append((start, len(ids) - start))
    return runs


class HostKVStore:
    def __init__(self, num_blocks: int, block_shape: tuple[int, ...], dtype, pinned: bool = False):
        """``block_shape`` is one block's (L, 2, B, K, E)."""
        if num_blocks < 1:
            raise ValueError(f"need num_blocks >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.pinned = pinned
        # (H, L, 2, B, K, E) on the host; pinned: the GPU's view of it too (else None)
        self.blocks, self.device_blocks = allocate_pinned((num_blocks, *block_shape), dtype, pinned)
        self.is_free = np.ones(num_blocks, dtype=bool)  # (H,)
        self.in_flight = np.zeros(num_blocks, dtype=np.int32)  # (H,) copies in flight per block
        self._release_on_landing: set[int] = set()  # freed while in flight
        self._num_free = num_blocks  # == is_free.sum(), kept as blocks come and go

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def block_nbytes(self) -> int:
        return self.blocks[0].nbytes

    def allocate(self, n: int) -> np.ndarray:
        """``n`` free host blocks, (n,) int32 ascending: one consecutive run when there is one
        (the lowest), else the lowest free ones. OutOfHostBlocks if fewer than ``n`` are free."""
        if n > self.num_free:
            raise OutOfHostBlocks(f"{n} host block(s) wanted, {self.num_free} free")
        if n == 0:
            return np.zeros(0, np.int32)
        low = int(np.argmax(self.is_free))  # the lowest free block
        if self.is_free[low:low + n].all() and low + n <= self.num_blocks:
            ids = np.arange(low, low + n, dtype=np.int32)  # the lowest run starts there
        else:
            seen = np.concatenate(([0], np.cumsum(self.is_free)))  # (H + 1,) free before i
            window = seen[n:] - seen[:-n]  # (H - n + 1,) free blocks in [i, i + n)
            starts = np.flatnonzero(window == n)
            ids = (np.arange(starts[0], starts[0] + n) if len(starts)
                   else np.flatnonzero(self.is_free)[:n]).astype(np.int32)
        set_each(self.is_free, ids, False)
        self._num_free -= n
        return ids

    def free(self, ids) -> None:
        """Give host blocks back; one with a copy in flight waits for it to land."""
        ids = np.asarray(ids).tolist()
        already = [h for h in ids if self.is_free[h]]
        if already:
            raise RuntimeError(f"host blocks {already} are already free")
        self._release_on_landing.update(h for h in ids if self.in_flight[h] > 0)
        self._mark_free([h for h in ids if self.in_flight[h] == 0])

    def begin_transfer(self, ids) -> None:
        ids = np.asarray(ids).tolist()
        if any(self.is_free[h] for h in ids):
            raise RuntimeError("a copy to or from a free host block")
        for h in ids:  # a block may be named twice: no fancy-index increment
            self.in_flight[h] += 1

    def end_transfer(self, ids) -> None:
        landed = []
        for h in np.asarray(ids).tolist():
            self.in_flight[h] -= 1
            if self.in_flight[h] == 0 and h in self._release_on_landing:
                landed.append(h)
        self._release_on_landing.difference_update(landed)
        self._mark_free(landed)

    def _mark_free(self, ids) -> None:
        set_each(self.is_free, ids, True)
        self._num_free += len(ids)

    def check(self) -> None:
        assert self._num_free == int(self.is_free.sum()), "the free count drifted"
        assert (self.in_flight >= 0).all(), "a host block landed more copies than were issued"
        assert not self.is_free[self.in_flight > 0].any(), "a free host block has a copy in flight"
        assert all(not self.is_free[h] for h in self._release_on_landing)
