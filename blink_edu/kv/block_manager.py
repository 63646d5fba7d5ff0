"""The block manager: which KV blocks each sequence owns, and the state of every block.

docs/design.md §2 and §6; vLLM's PagedAttention block tables; SuperInfer §4 (Dirty/Synced).
Plain Python and NumPy — no GPU — so it can be tested and reasoned about anywhere.

A sequence of ``n`` tokens owns ``ceil(n / B)`` blocks, listed in order in its *block table*.
Blocks come from one free list and go back to it when the sequence finishes or is preempted.
Every block is in one of three states:

* ``FREE``   — on the free list.
* ``DIRTY``  — the sequence's tail block, still being written (it has room left). Its contents
  change every decode step, so a copy of it elsewhere would go stale.
* ``SYNCED`` — full: nothing will ever write it again. DuplexKV copies such a block to host memory
  eagerly, in the background, so that rotating the sequence out later only moves its dirty tail.
* ``DRAINING`` — given back by its owner while a copy *from* or *into* it is still in flight
  (``kv/rotation.py``). It joins the free list only when that copy lands, so no block is reused
  before its copy-out has read it, or while a late copy-in could still write it.

Separately from its state, ``transfer[b]`` says whether a copy is in flight for block ``b``
(``NO_TRANSFER``, ``COPY_OUT`` to host, ``COPY_IN`` from host): the rotation engine sets it when it
issues a copy and clears it when the copy lands. The chapter's live map draws both.
"""

from __future__ import annotations

import numpy as np

FREE, DIRTY, SYNCED, DRAINING = 0, 1, 2, 3
STATE_NAMES = {FREE: "free", DIRTY: "dirty", SYNCED: "synced", DRAINING: "draining"}
NO_TRANSFER, COPY_OUT, COPY_IN = 0, 1, 2
TRANSFER_NAMES = {NO_TRANSFER: "none", COPY_OUT: "copy-out", COPY_IN: "copy-in"}


class OutOfBlocks(RuntimeError):
    """Not enough free blocks; the caller should wait, preempt or rotate someone out."""


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def set_each(array: np.ndarray, indices, value) -> None:
    """``array[indices] = value`` for the handful of blocks one sequence or one copy touches.
    A Python loop: NumPy's fancy indexing costs tens of microseconds of overhead a call, and
    these books are kept for every sequence on every step."""
    for i in indices:
        array[i] = value


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.state = np.full(num_blocks, FREE, dtype=np.int8)  # (N,)
        self.transfer = np.full(num_blocks, NO_TRANSFER, dtype=np.int8)  # (N,) copy in flight?
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._draining: set[int] = set()  # freed while a copy was in flight: free once it lands
        self.tables: dict[int, list[int]] = {}  # sequence id -> its block ids, in order
        self.num_tokens: dict[int, int] = {}  # sequence id -> tokens written so far

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_to_grow(self, seq_id: int, num_tokens: int) -> int:
        """How many more blocks ``seq_id`` needs to hold ``num_tokens`` tokens."""
        have = len(self.tables.get(seq_id, ()))
        return max(0, blocks_needed(num_tokens, self.block_size) - have)

    def can_grow(self, seq_id: int, num_tokens: int) -> bool:
        return self.blocks_to_grow(seq_id, num_tokens) <= self.num_free

    def block_table(self, seq_id: int) -> list[int]:
        return self.tables[seq_id]

    def block_table_array(self, seq_ids: list[int], width: int | None = None) -> np.ndarray:
        """Block tables of several sequences as one (S, width) int32 array, padded with -1."""
        width = width or max((len(self.tables[s]) for s in seq_ids), default=1) or 1
        table = np.full((len(seq_ids), width), -1, dtype=np.int32)
        for row, s in enumerate(seq_ids):
            blocks = self.tables[s]
            table[row, : len(blocks)] = blocks
        return table

    # --- changes -----------------------------------------------------------------------------
    def grow(self, seq_id: int, num_tokens: int) -> list[int]:
        """Make ``seq_id`` own enough blocks for ``num_tokens`` tokens; returns the new blocks.
        All or nothing: raises OutOfBlocks without taking any block if there are too few."""
        need = self.blocks_to_grow(seq_id, num_tokens)
        if need > self.num_free:
            raise OutOfBlocks(f"sequence {seq_id} needs {need} more block(s), {self.num_free} free")
        new = [self._free.pop() for _ in range(need)]
        set_each(self.state, new, DIRTY)
        self.tables.setdefault(seq_id, []).extend(new)
        self.num_tokens.setdefault(seq_id, 0)
        return new

    def mark_written(self, seq_id: int, num_tokens: int) -> list[int]:
        """Record that the first ``num_tokens`` tokens of ``seq_id`` are in its blocks.
        Returns the blocks that just became full (SYNCED): DuplexKV queues those for copy-out."""
        table = self.tables[seq_id]
        if num_tokens > len(table) * self.block_size:
            raise ValueError(f"sequence {seq_id}: {num_tokens} tokens exceed its "
                             f"{len(table)} block(s) of {self.block_size}")
        before = self.num_tokens[seq_id] // self.block_size
        after = num_tokens // self.block_size
        self.num_tokens[seq_id] = num_tokens
        filled = table[before:after]
        set_each(self.state, filled, SYNCED)
        return filled

    def free(self, seq_id: int) -> None:
        """Give all of ``seq_id``'s blocks back (finished, cancelled, preempted or rotated out).
        A block with a copy in flight drains first (see ``end_transfer``)."""
        blocks = self.tables.pop(seq_id, [])
        self.num_tokens.pop(seq_id, None)
        busy = [b for b in blocks if self.transfer[b] != NO_TRANSFER]
        idle = [b for b in blocks if self.transfer[b] == NO_TRANSFER]
        set_each(self.state, busy, DRAINING)
        self._draining.update(busy)
        set_each(self.state, idle, FREE)
        self._free.extend(reversed(idle))

    # --- copies in flight (kv/rotation.py) ---------------------------------------------------
    @property
    def num_draining(self) -> int:
        return len(self._draining)

    def begin_transfer(self, blocks, direction: int) -> None:
        """A copy out of (``COPY_OUT``) or into (``COPY_IN``) ``blocks`` was issued."""
        blocks = list(blocks)
        if any(self.transfer[b] != NO_TRANSFER for b in blocks):
            raise RuntimeError(f"blocks {blocks} already have a copy in flight")
        set_each(self.transfer, blocks, direction)

    def end_transfer(self, blocks) -> None:
        """The copy for ``blocks`` landed: drained blocks join the free list now."""
        blocks = list(blocks)
        set_each(self.transfer, blocks, NO_TRANSFER)
        landed = [b for b in blocks if b in self._draining]
        self._draining.difference_update(landed)
        set_each(self.state, landed, FREE)
        self._free.extend(landed)

    def check(self) -> None:
        """Invariants (used by tests): every block is free xor draining xor owned by exactly one
        sequence; a free block has no copy in flight, a draining one has."""
        owned = [b for t in self.tables.values() for b in t]
        draining = list(self._draining)
        assert len(owned) == len(set(owned)), "a block is owned twice"
        assert not set(owned) & set(self._free), "a block is both owned and free"
        assert not set(draining) & (set(owned) | set(self._free)), "a draining block is in use"
        assert len(owned) + len(self._free) + len(draining) == self.num_blocks, "a block went missing"
        assert (self.state[self._free] == FREE).all()
        assert (self.transfer[self._free] == NO_TRANSFER).all(), "a free block has a copy in flight"
        assert (self.state[draining] == DRAINING).all() and (self.transfer[draining] != NO_TRANSFER).all()
        assert (self.state[owned] != FREE).all() if owned else True
