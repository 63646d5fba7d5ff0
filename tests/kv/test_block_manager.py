"""Block manager: random workloads never lose, double-own or mis-state a block."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu.kv.block_manager import DIRTY, FREE, SYNCED, BlockManager, OutOfBlocks


def test_tail_is_dirty_full_blocks_are_synced():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.grow(7, 6)  # 6 tokens -> 2 blocks
    assert bm.mark_written(7, 6) == [bm.block_table(7)[0]]  # the first block just filled
    first, tail = bm.block_table(7)
    assert (bm.state[first], bm.state[tail]) == (SYNCED, DIRTY)
    bm.grow(7, 8)
    assert bm.mark_written(7, 8) == [tail]
    bm.free(7)
    assert (bm.state == FREE).all() and bm.num_free == 8


def test_grow_is_all_or_nothing():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.grow(1, 4)
    with pytest.raises(OutOfBlocks, match="needs 2 more block"):
        bm.grow(2, 3)
    assert bm.num_free == 1 and 2 not in bm.tables
    bm.check()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 5), st.integers(1, 40)),
                max_size=60))
def test_random_grow_and_free_keep_the_invariants(ops):
    bm = BlockManager(num_blocks=16, block_size=4)
    length: dict[int, int] = {}
    for op, seq, n in ops:
        if op == "grow":
            target = length.get(seq, 0) + n
            if bm.can_grow(seq, target):
                bm.grow(seq, target)
                bm.mark_written(seq, target)
                length[seq] = target
            else:
                with pytest.raises(OutOfBlocks):
                    bm.grow(seq, target)
        else:
            bm.free(seq)
            length.pop(seq, None)
        bm.check()
        for s, tokens in length.items():
            table = bm.block_table(s)
            assert len(table) == -(-tokens // 4)
            full = tokens // 4
            assert all(bm.state[b] == SYNCED for b in table[:full])
            assert all(bm.state[b] == DIRTY for b in table[full:])
