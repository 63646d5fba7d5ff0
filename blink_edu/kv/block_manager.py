"""The block manager: which KV blocks each sequence owns, and the state of every block.

DESIGN.md §2 and §6; vLLM's PagedAttention block tables; SuperInfer §4 (Dirty/Synced).
Plain Python and NumPy — no GPU — so it can be tested and reasoned about anywhere.

A sequence of ``n`` tokens owns ``ceil(n / B)`` blocks, listed in order in its *block table*.
Blocks come from one free list and go back to it when the sequence finishes or is preempted.
Every block is in one of three states:

* ``FREE``   — on the free list.
* ``DIRTY``  — the sequence's tail block, still being written (it has room left). Its contents
  change every decode step, so a copy of it elsewhere would go stale.
* ``SYNCED`` — full: nothing will ever write it again. DuplexKV copies such a block to host memory
  eagerly, in the background, so that rotating the sequence out later only moves its dirty tail.
"""

from __future__ import annotations

import numpy as np

FREE, DIRTY, SYNCED = 0, 1, 2
STATE_NAMES = {FREE: "free", DIRTY: "dirty", SYNCED: "synced"}


class OutOfBlocks(RuntimeError):
    """Not enough free blocks; the caller should wait, preempt or rotate someone out."""


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.state = np.full(num_blocks, FREE, dtype=np.int8)  # (N,)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
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
        self.state[new] = DIRTY
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
        self.state[filled] = SYNCED
        return filled

    def free(self, seq_id: int) -> None:
        """Give all of ``seq_id``'s blocks back (finished, cancelled or preempted)."""
        blocks = self.tables.pop(seq_id, [])
        self.num_tokens.pop(seq_id, None)
        self.state[blocks] = FREE
        self._free.extend(reversed(blocks))

    def check(self) -> None:
        """Invariants (used by tests): every block is free xor owned by exactly one sequence."""
        owned = [b for t in self.tables.values() for b in t]
        assert len(owned) == len(set(owned)), "a block is owned twice"
        assert not set(owned) & set(self._free), "a block is both owned and free"
        assert len(owned) + len(self._free) == self.num_blocks, "a block went missing"
        assert (self.state[self._free] == FREE).all()
        assert (self.state[owned] != FREE).all() if owned else True
