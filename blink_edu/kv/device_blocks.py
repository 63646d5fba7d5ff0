"""DuplexKV's block books on the device: the block states of ``block_manager.py`` and the
per-sequence books of ``rotation.py`` as Numba CUDA device functions over flat arrays.

SuperInfer §4 (DuplexKV: Dirty/Synced blocks, eager rotation: a full block is copied to host
memory at once, so a rotate-out moves only the dirty tail) and docs/design.md §6.

Why on the device
-----------------
Blink §3 takes the host off the per-token loop: a persistent kernel batches, runs the model and
writes the tokens back by itself. That kernel must then also take a KV block when a token needs
one, free a finished sequence's blocks, and decide what a rotate-out or an eager copy-out has to
move -- the books the host's ``BlockManager`` and ``RotationEngine`` keep today. This module is
those books, rule for rule (each function names its host twin); the copies themselves stay with
the host's transfer thread (``rotation.py``'s docstring), which reports back when one landed.

One word per block
------------------
The host keeps a block's state (FREE, DIRTY, SYNCED, DRAINING) and its copy in flight
(NO_TRANSFER, COPY_OUT, COPY_IN) in two arrays, with the same meanings here. On the device two
threads may change one block at once -- the model's thread filling it while the transfer thread
reports its copy landed, or a sequence freeing it while its copy lands -- and "freed while a copy
is in flight: DRAINING" is a decision over *both* fields. So both live in one int32 word,
``state | transfer << STATE_BITS``, changed only by ``cuda.atomic.cas`` (one compare-and-swap
loop, ``_apply``): no update is lost and no decision reads a half-changed block. Claiming a free
block is one CAS from the FREE word to the DIRTY word: of many threads racing for a block, exactly
one wins it; the others move on to the next.

The arrays (S sequence slots, at most M blocks each; the caller owns them all)::

    words       (N,)   int32  per GPU block: state | transfer << STATE_BITS
    table       (S, M) int32  GPU block of each logical block, -1: none (BlockManager.tables)
    num_tokens  (S,)   int32  tokens written (BlockManager.num_tokens)
    mirrored    (S, M) int32  1: the host copy is current (RotationEngine.mirrored)
    on_host     (S, M) int32  1: has a host block (RotationEngine.host_tables[s][i] >= 0)
    pending     (S, M) int32  1: queued for the next eager copy-out (RotationEngine.pending_out)
    rotated     (S,)   int32  tokens of a rotated-out sequence, -1: not rotated (.rotated)

Which host block a logical block uses is the host arena's business (``host_store.py``); the
device needs only whether it has one: the eager copy-out gives blocks that have one a copy first.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..backend import get_backend
from .block_manager import COPY_IN, COPY_OUT, DIRTY, DRAINING, FREE, NO_TRANSFER, SYNCED

cuda = get_backend().cuda

STATE_BITS = 2  # FREE..DRAINING fit in two bits; the transfer sits above them
STATE_MASK = (1 << STATE_BITS) - 1
FREE_WORD = FREE | NO_TRANSFER << STATE_BITS
CLAIMED_WORD = DIRTY | NO_TRANSFER << STATE_BITS  # a fresh block: the tail, nothing in flight

# What happens to a block (``next_word`` says what it does to the word).
FILLED, COPY_OUT_ISSUED, COPY_IN_ISSUED, LANDED, RELEASED = range(5)


# --- one block ----------------------------------------------------------------------------------


@cuda.jit(device=True)
def next_word(word, event):
    """The word after ``event``: the block manager's transitions in one place.
    FILLED: full, never written again (``mark_written``); COPY_*_ISSUED: a copy is in flight
    (``begin_transfer``); LANDED: it is not, and a draining block is free (``end_transfer``);
    RELEASED: its owner gave it back, free unless a copy is in flight (``free``)."""
    state = word & STATE_MASK
    transfer = word >> STATE_BITS
    if event == FILLED:
        state = SYNCED
    elif event == COPY_OUT_ISSUED:
        transfer = COPY_OUT
    elif event == COPY_IN_ISSUED:
        transfer = COPY_IN
    elif event == LANDED:
        transfer = NO_TRANSFER
        if state == DRAINING:
            state = FREE
    elif event == RELEASED:
        state = DRAINING if transfer != NO_TRANSFER else FREE
    return state | transfer << STATE_BITS


@cuda.jit(device=True)
def _apply(words, b, event):
    """Block ``b`` goes through ``event``, atomically: retry the compare-and-swap until no
    other thread changed the word between our read and our write."""
    old = words[b]
    while True:
        seen = cuda.atomic.cas(words, b, old, next_word(old, event))
        if seen == old:
            return
        old = seen


@cuda.jit(device=True)
def claim_block(words):
    """A FREE block, now DIRTY and ours (the free list's ``pop``); -1 when none is free.
    Safe when many threads claim at once: only one CAS can turn a FREE word into DIRTY."""
    for b in range(words.shape[0]):
        if cuda.atomic.cas(words, b, FREE_WORD, CLAIMED_WORD) == FREE_WORD:
            return b
    return -1


# --- one sequence (one thread per sequence slot) ------------------------------------------------


@cuda.jit(device=True)
def blocks_held(table, s):
    """How many blocks sequence ``s`` owns (its table row is filled from the left)."""
    count = 0
    while count < table.shape[1] and table[s, count] >= 0:
        count += 1
    return count


@cuda.jit(device=True)
def grow(words, table, s, num_tokens, block_size):
    """Claim blocks until ``s`` can hold ``num_tokens`` tokens (``BlockManager.grow``). All or
    nothing: if the pool runs dry, the blocks claimed here go back and the answer is False."""
    have = blocks_held(table, s)
    need = (num_tokens + block_size - 1) // block_size
    if need > table.shape[1]:
        return False
    for i in range(have, need):
        b = claim_block(words)
        if b < 0:
            for j in range(have, i):
                _apply(words, table[s, j], RELEASED)
                table[s, j] = -1
            return False
        table[s, i] = b
    return True


@cuda.jit(device=True)
def _mark_written(words, table, num_tokens, s, new_tokens, block_size):
    """The first ``new_tokens`` tokens of ``s`` are in its blocks: those that just became full
    are SYNCED (``BlockManager.mark_written``)."""
    for i in range(num_tokens[s] // block_size, new_tokens // block_size):
        _apply(words, table[s, i], FILLED)
    num_tokens[s] = new_tokens


@cuda.jit(device=True)
def _note_written(mirrored, pending, s, old_tokens, new_tokens, block_size):
    """Tokens [old, new) were written: their blocks' host copies are stale, and the blocks that
    just became full are queued for the eager copy-out (``RotationEngine.on_written``)."""
    for i in range(old_tokens // block_size, (new_tokens + block_size - 1) // block_size):
        mirrored[s, i] = 0
    for i in range(old_tokens // block_size, new_tokens // block_size):
        pending[s, i] = 1


@cuda.jit(device=True)
def write_tokens(words, table, num_tokens, mirrored, pending, s, count, block_size):
    """``count`` new tokens of ``s``: the blocks they need (False, nothing changed, if the pool
    has too few), then the books of their writing (the host's ``grow``, ``mark_written``,
    ``on_written``)."""
    old = num_tokens[s]
    if not grow(words, table, s, old + count, block_size):
        return False
    _mark_written(words, table, num_tokens, s, old + count, block_size)
    _note_written(mirrored, pending, s, old, old + count, block_size)
    return True


@cuda.jit(device=True)
def is_ready(words, table, s):
    """May the model read ``s``'s blocks? Not while a copy into one of them is in flight
    (``RotationEngine.ready``: one ticket brings all of them in)."""
    for i in range(blocks_held(table, s)):
        if words[table[s, i]] >> STATE_BITS == COPY_IN:
            return False
    return True


@cuda.jit(device=True)
def blocks_to_rotate_out(table, mirrored, s, out):
    """``out[:k]`` = the logical blocks of resident ``s`` without a current host copy -- what a
    rotate-out must still move; with eager rotation at most the dirty tail. Returns k
    (``RotationEngine.blocks_to_rotate_out``)."""
    k = 0
    for i in range(blocks_held(table, s)):
        if mirrored[s, i] == 0:
            out[k] = i
            k += 1
    return k


@cuda.jit(device=True)
def _copy_out(words, table, mirrored, on_host, s, i):
    """Logical block ``i`` of ``s`` is being copied to its host block (``_copy_out``)."""
    _apply(words, table[s, i], COPY_OUT_ISSUED)
    mirrored[s, i] = 1
    on_host[s, i] = 1


@cuda.jit(device=True)
def free_sequence(words, table, num_tokens, s):
    """Give all of ``s``'s blocks back; one with a copy in flight drains (``BlockManager.free``)."""
    for i in range(blocks_held(table, s)):
        _apply(words, table[s, i], RELEASED)
        table[s, i] = -1
    num_tokens[s] = 0


@cuda.jit(device=True)
def rotate_out(words, table, num_tokens, mirrored, on_host, pending, rotated, s, out):
    """Copy out what ``s`` lacks on the host (``out[:k]``, returns k) and free its GPU blocks
    (``RotationEngine.rotate_out``; the host arena's room is the caller's to check)."""
    k = blocks_to_rotate_out(table, mirrored, s, out)
    for j in range(k):
        _copy_out(words, table, mirrored, on_host, s, out[j])
    for i in range(table.shape[1]):
        pending[s, i] = 0
    rotated[s] = num_tokens[s]
    free_sequence(words, table, num_tokens, s)
    return k


@cuda.jit(device=True)
def rotate_in(words, table, num_tokens, rotated, s, block_size):
    """Blocks for rotated-out ``s`` again, all being copied in (``RotationEngine.rotate_in``);
    False, nothing changed, if the pool has too few."""
    if not grow(words, table, s, rotated[s], block_size):
        return False
    _mark_written(words, table, num_tokens, s, rotated[s], block_size)
    rotated[s] = -1
    for i in range(blocks_held(table, s)):
        _apply(words, table[s, i], COPY_IN_ISSUED)
    return True


@cuda.jit(device=True)
def forget(mirrored, on_host, pending, rotated, s):
    """``s`` finished: drop its host books (``RotationEngine.forget``)."""
    for i in range(mirrored.shape[1]):
        mirrored[s, i] = 0
        on_host[s, i] = 0
        pending[s, i] = 0
    rotated[s] = -1


@cuda.jit(device=True)
def _pick_eager(words, table, mirrored, on_host, pending, with_host_block, budget,
                out_seq, out_index, k):
    """Append to ``out_*[k:]`` the queued blocks, idle and not mirrored, that have (or, with
    ``with_host_block`` False, lack) a host block, at most ``budget`` of them; returns the new k.
    A block being copied in stays queued (its copy-in must land first)."""
    for s in range(table.shape[0]):
        for i in range(table.shape[1]):
            b = table[s, i]
            if (budget > 0 and pending[s, i] == 1 and b >= 0 and mirrored[s, i] == 0
                    and words[b] >> STATE_BITS == NO_TRANSFER
                    and (on_host[s, i] == 1) == with_host_block):
                out_seq[k] = s
                out_index[k] = i
                k += 1
                budget -= 1
    return k


@cuda.jit(device=True)
def choose_eager(words, table, mirrored, on_host, pending, host_free, out_seq, out_index):
    """The eager copy-out's choice (``RotationEngine.flush``): ``out_*[:k]`` = every queued full
    block not yet mirrored and with no copy in flight -- those that have a host block, then as
    many without one as the host has free blocks. Returns k."""
    k = _pick_eager(words, table, mirrored, on_host, pending, True, table.size, out_seq,
                    out_index, 0)
    return _pick_eager(words, table, mirrored, on_host, pending, False, host_free, out_seq,
                       out_index, k)


@cuda.jit(device=True)
def eager_copy_out(words, table, mirrored, on_host, pending, host_free, out_seq, out_index):
    """Issue the eager copy-out ``choose_eager`` picks (returns k) and empty the queue but for
    blocks whose copy-in is still in flight (``RotationEngine.flush``)."""
    k = choose_eager(words, table, mirrored, on_host, pending, host_free, out_seq, out_index)
    for j in range(k):
        _copy_out(words, table, mirrored, on_host, out_seq[j], out_index[j])
    for s in range(table.shape[0]):
        for i in range(table.shape[1]):
            b = table[s, i]
            if b < 0 or words[b] >> STATE_BITS == NO_TRANSFER or mirrored[s, i] == 1:
                pending[s, i] = 0
    return k


# --- kernels and the host wrapper ---------------------------------------------------------------

WRITE, FLUSH, ROTATE_OUT, ROTATE_IN, FINISH, LAND, READY = range(7)


@cuda.jit
def books_kernel(op, s, arg, words, table, num_tokens, mirrored, on_host, pending, rotated,
                 block_size, out, out2, result):
    """Thread 0 does ``op`` to sequence ``s`` (``arg``: tokens to write, the host's free blocks
    for FLUSH, or how many blocks ``out`` lists for LAND); result (1,) int32 = its answer."""
    if cuda.grid(1) != 0:
        return
    if op == WRITE:
        result[0] = write_tokens(words, table, num_tokens, mirrored, pending, s, arg, block_size)
    elif op == FLUSH:
        result[0] = eager_copy_out(words, table, mirrored, on_host, pending, arg, out, out2)
    elif op == ROTATE_OUT:
        result[0] = rotate_out(words, table, num_tokens, mirrored, on_host, pending, rotated, s,
                               out)
    elif op == ROTATE_IN:
        result[0] = rotate_in(words, table, num_tokens, rotated, s, block_size)
    elif op == FINISH:
        forget(mirrored, on_host, pending, rotated, s)
        free_sequence(words, table, num_tokens, s)
    elif op == LAND:
        for j in range(arg):
            _apply(words, out[j], LANDED)
    elif op == READY:
        result[0] = is_ready(words, table, s)


@cuda.jit
def claim_kernel(words, claimed):
    """Every thread claims one block at once: claimed (T,) int32 = its block, or -1."""
    t = cuda.grid(1)
    if t < claimed.shape[0]:
        claimed[t] = claim_block(words)


def claim_at_once(words: np.ndarray, num_threads: int) -> np.ndarray:
    """(num_threads,) int32: the blocks ``num_threads`` threads of one block claimed together
    from ``words`` (N,) int32 (changed in place)."""
    claimed = np.full(num_threads, -2, dtype=np.int32)  # (T,) out
    claim_kernel[1, num_threads](words, claimed)
    return claimed


class BlockBooks(NamedTuple):
    """The device books of N blocks and S sequence slots as host arrays (module docstring);
    each method launches ``books_kernel`` on one thread and returns plain Python values."""

    words: np.ndarray  # (N,) int32
    table: np.ndarray  # (S, M) int32
    num_tokens: np.ndarray  # (S,) int32
    mirrored: np.ndarray  # (S, M) int32
    on_host: np.ndarray  # (S, M) int32
    pending: np.ndarray  # (S, M) int32
    rotated: np.ndarray  # (S,) int32
    block_size: int

    @classmethod
    def empty(cls, num_blocks: int, num_seqs: int, max_blocks: int, block_size: int):
        mirrored, on_host, pending = np.zeros((3, num_seqs, max_blocks), np.int32)  # (S, M) each
        return cls(np.full(num_blocks, FREE_WORD, np.int32),
                   np.full((num_seqs, max_blocks), -1, np.int32), np.zeros(num_seqs, np.int32),
                   mirrored, on_host, pending, np.full(num_seqs, -1, np.int32), block_size)

    def _run(self, op: int, s: int = 0, arg: int = 0, out=None):
        """Launch ``op``; returns (its answer, out, out2) -- out, out2 (S * M,) int32."""
        size = self.table.size
        out = np.zeros(size, np.int32) if out is None else out  # (S * M,)
        out2 = np.zeros(size, np.int32)  # (S * M,)
        result = np.zeros(1, np.int32)  # (1,)
        books_kernel[1, 1](op, s, arg, *self[:-1], self.block_size, out, out2, result)  # the arrays
        return int(result[0]), out, out2

    def write(self, s: int, count: int) -> bool:
        return bool(self._run(WRITE, s, count)[0])

    def flush(self, host_free: int) -> list[tuple[int, int]]:
        """The eager copy-out issued: [(sequence, logical block)]."""
        k, seqs, index = self._run(FLUSH, arg=host_free)
        return list(zip(seqs[:k].tolist(), index[:k].tolist()))

    def rotate_out(self, s: int) -> list[int]:
        """The logical blocks the rotate-out copied."""
        k, out, _ = self._run(ROTATE_OUT, s)
        return out[:k].tolist()

    def rotate_in(self, s: int) -> bool:
        return bool(self._run(ROTATE_IN, s)[0])

    def finish(self, s: int) -> None:
        self._run(FINISH, s)

    def land(self, blocks: list[int]) -> None:
        """The copies of GPU blocks ``blocks`` landed."""
        ids = np.zeros(self.table.size, np.int32)  # (S * M,)
        ids[: len(blocks)] = blocks
        self._run(LAND, arg=len(blocks), out=ids)

    def ready(self, s: int) -> bool:
        return bool(self._run(READY, s)[0])

    def states(self) -> np.ndarray:
        """(N,) int32 block states (FREE, DIRTY, SYNCED, DRAINING)."""
        return self.words & STATE_MASK

    def transfers(self) -> np.ndarray:
        """(N,) int32 copies in flight (NO_TRANSFER, COPY_OUT, COPY_IN)."""
        return self.words >> STATE_BITS
