"""The host side of the KV cache: a pinned arena of KV blocks in CPU memory (DuplexKV's backing store).

SuperInfer §4 (DuplexKV) and DESIGN.md §6. Blocks rotated out of the GPU, and the eager copies of
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


class OutOfHostBlocks(RuntimeError):
    """The host arena has too few free blocks for this rotation."""


def allocate_pinned(shape: tuple[int, ...], dtype, pinned: bool) -> np.ndarray:
    """A zeroed host array; page-locked (CuPy's pinned allocator) when ``pinned``."""
    if not pinned:
        return np.zeros(shape, dtype)
    import cupyx

    array = cupyx.empty_pinned(shape, dtype)
    array[...] = 0  # touch every page once, now, not in the middle of a timed copy
    return array


def consecutive_runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """Split ``ids`` (n,) into runs of consecutive values: [(offset into ids, run length)]."""
    if len(ids) == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1  # (r - 1,) where a new run starts
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [len(ids)])))
    return list(zip(starts.tolist(), lengths.tolist()))


class HostKVStore:
    def __init__(self, num_blocks: int, block_shape: tuple[int, ...], dtype, pinned: bool = False):
        """``block_shape`` is one block's (L, 2, B, K, E)."""
        if num_blocks < 1:
            raise ValueError(f"need num_blocks >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.pinned = pinned
        self.blocks = allocate_pinned((num_blocks, *block_shape), dtype, pinned)  # (H, L, 2, B, K, E)
        self.is_free = np.ones(num_blocks, dtype=bool)  # (H,)
        self.in_flight = np.zeros(num_blocks, dtype=np.int32)  # (H,) copies in flight per block
        self._release_on_landing: set[int] = set()  # freed while in flight

    @property
    def num_free(self) -> int:
        return int(self.is_free.sum())

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
        seen = np.concatenate(([0], np.cumsum(self.is_free)))  # (H + 1,) free blocks before i
        window = seen[n:] - seen[:-n]  # (H - n + 1,) free blocks in [i, i + n)
        starts = np.flatnonzero(window == n)
        ids = (np.arange(starts[0], starts[0] + n) if len(starts)
               else np.flatnonzero(self.is_free)[:n]).astype(np.int32)
        self.is_free[ids] = False
        return ids

    def free(self, ids) -> None:
        """Give host blocks back; one with a copy in flight waits for it to land."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and self.is_free[ids].any():
            raise RuntimeError(f"host blocks {ids[self.is_free[ids]].tolist()} are already free")
        busy = ids[self.in_flight[ids] > 0]
        self._release_on_landing.update(busy.tolist())
        self.is_free[ids[self.in_flight[ids] == 0]] = True

    def begin_transfer(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and self.is_free[ids].any():
            raise RuntimeError("a copy to or from a free host block")
        np.add.at(self.in_flight, ids, 1)

    def end_transfer(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        np.add.at(self.in_flight, ids, -1)
        landed = [h for h in ids.tolist() if h in self._release_on_landing and self.in_flight[h] == 0]
        self._release_on_landing.difference_update(landed)
        self.is_free[landed] = True

    def check(self) -> None:
        assert (self.in_flight >= 0).all(), "a host block landed more copies than were issued"
        assert not self.is_free[self.in_flight > 0].any(), "a free host block has a copy in flight"
        assert all(not self.is_free[h] for h in self._release_on_landing)
