"""Lab 4 — DuplexKV: Dirty/Synced books, eager rotation, and batched transfers.

Read first: ``notebooks/labs/lab4_duplexkv.ipynb``, the docstrings of
``blink_edu/kv/block_manager.py`` (block states) and ``blink_edu/kv/rotation.py`` (eager
rotation). Check your work with::

    python -m blink_edu.labs check 4

Under memory pressure SuperInfer *rotates* a running request out — its KV blocks to host memory,
its GPU blocks to others — and later back in. DuplexKV makes that cheap:

* a block is DIRTY while it is its sequence's tail (still being written) and SYNCED once full
  (never written again);
* a SYNCED block is copied to the host *eagerly*, in the background, as soon as it fills — so a
  rotate-out only has to move what has no current host copy: the dirty tail, at most one block;
* the blocks of one step move in ONE batched transfer, and every run of consecutive host blocks
  is ONE copy (a few large copies keep the link busy; many small ones do not).

Your functions run inside the engine (``blink_edu.labs.plug.lab4``): ``mark_written`` is the block
manager's, ``on_written`` and ``blocks_to_rotate_out`` are the rotation engine's, and
``plan_batched_copy`` decides what every transfer copies — the bytes really move as you plan them.
The tests preempt requests by rotation under memory pressure and check that the engine still
produces exactly the NumPy reference's tokens.

Words: a sequence's *logical* block ``i`` holds its tokens ``i*B .. i*B + B - 1`` (``B`` the block
size); its block table maps logical block ``i`` to a *physical* GPU block ``table[i]``.
"""

from __future__ import annotations

from ..kv.block_manager import DIRTY, SYNCED  # noqa: F401 - the block states you write


# --- Lab 4.1 ------------------------------------------------------------------------------------
def mark_written(states, table: list[int], old_tokens: int, new_tokens: int,
                 block_size: int) -> list[int]:
    """The first ``new_tokens`` tokens of a sequence are now in its blocks (``old_tokens`` were
    before this step). Every block that *became full* in this step goes DIRTY -> SYNCED:
    ``states[physical_block] = SYNCED``. Return those physical blocks, in table order.

    ``states`` (N,) int8, one per GPU block; ``table`` the sequence's block table (physical ids);
    a block is full when all ``block_size`` of its tokens are written. A block that was already
    full before (``old_tokens``) is not returned again; a partly filled one stays DIRTY.
    """
    # TODO: Lab 4.1
    raise NotImplementedError("Lab 4.1: mark_written")


# --- Lab 4.2 ------------------------------------------------------------------------------------
def on_written(mirrored: set, pending_out: set, old_tokens: int, new_tokens: int,
               block_size: int) -> None:
    """Keep the rotation books of one sequence after tokens ``[old_tokens, new_tokens)`` were
    written (update the two sets in place; both hold *logical* block indices):

    * ``mirrored``: blocks whose host copy is current. Every block these tokens touched was
      written, so its host copy (if any) is stale now: remove those blocks.
    * ``pending_out``: blocks queued for the next eager copy-out. Add the blocks that became full
      in this step (they will never change again: copy them now, in the background).
    """
    # TODO: Lab 4.2
    raise NotImplementedError("Lab 4.2: on_written")


# --- Lab 4.3 ------------------------------------------------------------------------------------
def blocks_to_rotate_out(num_blocks: int, mirrored: set) -> list[int]:
    """What a rotate-out of a sequence owning ``num_blocks`` GPU blocks must still copy: every
    logical block (in order) without a current host copy. With eager rotation that is at most
    its dirty tail."""
    # TODO: Lab 4.3
    raise NotImplementedError("Lab 4.3: blocks_to_rotate_out")


# --- Lab 4.4 ------------------------------------------------------------------------------------
def plan_batched_copy(gpu_blocks: list[int], host_blocks: list[int]) -> list[tuple[int, list[int]]]:
    """Plan one batched transfer: GPU block ``gpu_blocks[i]`` pairs with host block
    ``host_blocks[i]`` (copied out to it, or in from it).

    Sort the pairs by host block, then cut them into *runs* of consecutive host blocks
    (``h, h+1, h+2, ...``). Each run is ONE copy: return ``[(first_host_block, [gpu blocks of the
    run, in host order]), ...]`` in host order. Example: gpu [7, 3, 9], host [11, 10, 20] ->
    ``[(10, [3, 7]), (20, [9])]``: two copies, not three.
    """
    # TODO: Lab 4.4
    raise NotImplementedError("Lab 4.4: plan_batched_copy")
