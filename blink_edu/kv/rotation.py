"""The rotation engine (DuplexKV): moving requests' KV cache between GPU and host memory.

SuperInfer §4 (DuplexKV: eager block rotation, batched full-duplex transfers) and docs/design.md §6.
Under memory pressure a scheduler *rotates out* a running request -- its KV blocks go to host
memory, its GPU blocks to other requests -- and later *rotates it in* again; it then continues
with exactly the tokens it would have produced. This module is the mechanism; the scheduler (or a
policy in ``sched/``) decides who rotates when.

**Eager rotation.** KV generation is incremental: a block is written token by token while it is
the sequence's tail (DIRTY), and never again once full (SYNCED). So a SYNCED block is copied to
host memory at once, in the background (``on_written`` queues it, ``flush`` issues one batched
copy for all blocks that filled this step). When the request is rotated out later, every full
block is already on the host: only the dirty tail still has to move -- at most one block per
request, whatever its length. A host copy stays valid until its GPU block is written again, which
for a full block is never; so a request rotated out, in, and out again moves only its tail again.

**One batched copy per direction per step.** A scheduler often moves several requests in one
step (a policy rotates three out and two in). Each ``rotate_out`` / ``rotate_in`` alone issues
its own copy, and on a GPU every copy costs the host tens of microseconds (events, a block-id
upload, a gather/scatter launch, the memcpys) whatever its size. Inside ``with engine.batch():``
the moves keep their books at once -- block states, host tables, ``rotated``, GPU blocks freed
into DRAINING -- but only *collect* their copies; leaving the block issues ONE copy-out ticket for
every rotate-out's blocks and ONE copy-in ticket for every rotate-in's, as SuperInfer's code does
on its two streams.

**Invariants** (``check`` asserts them; the tests drive random schedules through them):

* no GPU block is reused while a copy out of it or into it is in flight (the block manager's
  DRAINING state), and no host block either (``HostKVStore`` defers its free);
* a sequence's blocks are not read by a kernel before its copy-in has landed (``ready``: the
  scheduler skips it; on a GPU the compute stream waits for the copy's event instead);
* a copy-in of a host block waits for any copy still writing it (``after``).

Per-sequence books: ``host_tables[s][i]`` is the host block mirroring logical block ``i`` of
sequence ``s`` (-1: none yet); ``mirrored[s]`` the logical blocks whose host copy is current
(issued after the block's last write); ``rotated[s]`` the token count of a rotated-out sequence.

**With the persistent scheduler** (Blink; no host in the step loop) the same books serve a
different caller. Copies cannot be issued from inside a running kernel through the copy engines
we use here, so the kernel *asks*: at the end of a step it appends requests ``(sequence,
rotate-out | rotate-in | eager block list)`` to a queue in mapped host memory and publishes its
tail with ``st.release.sys``; a host *transfer thread* polls the queue (``ld.acquire.sys``),
runs this engine's ``rotate_out`` / ``rotate_in`` / ``flush`` on its own two streams, and on each
``poll`` that lands a ticket writes a per-sequence ready flag back into device memory with a
small ``cudaMemcpyAsync`` on the copy stream itself (ordered after the copy). The kernel never
schedules a sequence whose flag is not set, which is this module's ``ready`` rule, and never
reuses a block the transfer thread has not reported free, which is its DRAINING rule. The slot
of a rotated request stays ``DECODE_PAUSED`` in the ring until its flag comes back.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .block_manager import (COPY_IN, COPY_OUT, DIRTY, DRAINING, NO_TRANSFER, SYNCED,
                            BlockManager, blocks_needed)
from .host_store import HostKVStore, OutOfHostBlocks
from .transfer import DeviceTransport, MappedTransport, NumpyTransport, Ticket, Transport

# The live map's codes (the chapter colours them).
GPU_VIEW = ("free", "dirty", "synced", "synced, on host", "copying out", "copying in", "draining")
G_FREE, G_DIRTY, G_SYNCED, G_MIRRORED, G_OUT, G_IN, G_DRAINING = range(len(GPU_VIEW))
HOST_VIEW = ("free", "mirror of a GPU block", "rotated out", "in flight")
H_FREE, H_MIRROR, H_ROTATED, H_IN_FLIGHT = range(len(HOST_VIEW))


@dataclass(frozen=True)
class TransferRecord:
    """One batched copy, for charts: which step, which way, why, how many blocks, which copies."""

    step: int
    direction: int  # COPY_OUT | COPY_IN
    reason: str  # "eager" | "rotate-out" | "rotate-in"
    num_blocks: int
    copy_sizes: tuple[int, ...]  # bytes of each copy it issued


@dataclass
class CopyBatch:
    """The copies an open ``RotationEngine.batch`` has collected, not issued yet."""

    # (direction, reason) -> (GPU blocks, host blocks), in the order the moves asked for them
    copies: dict[tuple[int, str], tuple[list[int], list[int]]] = field(default_factory=dict)
    loading: set[int] = field(default_factory=set)  # sequences its copy-in brings back


@dataclass(frozen=True)
class RotationStats:
    host_blocks_used: int
    host_blocks_free: int
    blocks_in_flight_out: int
    blocks_in_flight_in: int
    num_rotated: int  # sequences whose KV lives in host memory now
    num_loading: int  # sequences whose copy-in has not landed yet
    blocks_copied_out: int  # since start; eager ones included
    blocks_copied_in: int
    eager_blocks_out: int


class RotationEngine:
    def __init__(self, block_manager: BlockManager, host: HostKVStore, transport: Transport,
                 eager: bool = True):
        self.blocks = block_manager
        self.host = host
        self.transport = transport
        self.eager = eager
        self.block_size = block_manager.block_size
        self.host_tables: dict[int, list[int]] = {}
        self.mirrored: dict[int, set[int]] = {}
        self.pending_out: dict[int, set[int]] = {}  # SYNCED logical blocks awaiting ``flush``
        self.rotated: dict[int, int] = {}  # rotated-out sequence -> its token count
        self.loading: dict[int, Ticket] = {}  # rotated-in sequence -> its copy-in, until it lands
        self.host_users: dict[int, Ticket] = {}  # host block -> last ticket touching it
        self.history: list[TransferRecord] = []
        self.step = 0
        self.blocks_copied = {COPY_OUT: 0, COPY_IN: 0}
        self.eager_blocks_out = 0
        self.open_batch: CopyBatch | None = None  # inside ``batch()``: the copies it collects

    # --- queries ------------------------------------------------------------------------------
    def is_rotated(self, seq_id: int) -> bool:
        return seq_id in self.rotated

    def blocks_to_rotate_out(self, seq_id: int) -> list[int]:
        """Logical blocks of a resident sequence without a current host copy (what rotate-out
        moves: with eager rotation, at most its dirty tail)."""
        have = self.mirrored.get(seq_id, set())
        return [i for i in range(len(self.blocks.block_table(seq_id))) if i not in have]

    def blocks_to_rotate_in(self, seq_id: int) -> int:
        return blocks_needed(self.rotated[seq_id], self.block_size)

    def ready(self, seq_id: int) -> bool:
        """May the model run ``seq_id`` now? False while its copy-in is in flight and the
        model's kernels cannot be ordered after it (on a GPU they can: the compute stream then
        waits for the copy's event). Not inside a batch: its copy-in has no ticket yet."""
        self._refuse_inside_batch("ready")
        ticket = self.loading.get(seq_id)
        return ticket is None or self.transport.order_compute_after(ticket)

    def stats(self) -> RotationStats:
        in_flight = {COPY_OUT: 0, COPY_IN: 0}
        for direction, gpu in self._copies_under_way():
            in_flight[direction] += len(gpu)
        loading = len(self.loading) + (len(self.open_batch.loading) if self.open_batch else 0)
        return RotationStats(self.host.num_used, self.host.num_free, in_flight[COPY_OUT],
                             in_flight[COPY_IN], len(self.rotated), loading,
                             self.blocks_copied[COPY_OUT], self.blocks_copied[COPY_IN],
                             self.eager_blocks_out)

    def _copies_under_way(self) -> list[tuple[int, list[int]]]:
        """(direction, GPU blocks) of every copy in flight, and of every copy an open batch has
        collected (its blocks are already booked as being copied)."""
        copies = [(t.direction, t.gpu_blocks.tolist()) for t in self.transport.in_flight]
        if self.open_batch is not None:
            copies += [(direction, gpu) for (direction, _), (gpu, _)
                       in self.open_batch.copies.items()]
        return copies

    # --- the scheduler's calls ----------------------------------------------------------------
    def on_written(self, seq_id: int, old_tokens: int, new_tokens: int) -> None:
        """Tokens [old_tokens, new_tokens) of ``seq_id`` were written into its blocks (after
        ``BlockManager.mark_written``). Their blocks' host copies are stale now; the blocks that
        just became full are queued for the next eager ``flush``."""
        B = self.block_size
        mirrored = self.mirrored.get(seq_id)
        if mirrored:  # their host copies are stale now
            mirrored.difference_update(range(old_tokens // B, blocks_needed(new_tokens, B)))
        filled = range(old_tokens // B, new_tokens // B)
        if self.eager and filled:
            self.pending_out.setdefault(seq_id, set()).update(filled)

    def flush(self) -> Ticket | None:
        """Issue one batched copy-out of every block queued by ``on_written`` (eager rotation).
        Blocks for which the host has no room stay unmirrored; rotate-out moves them later.
        A block whose copy-in has not landed yet (on a GPU the model may already have filled it:
        its kernels wait for the copy on the device) stays queued for a later flush."""
        wanted = [(s, i) for s, idx in self.pending_out.items() if s in self.blocks.tables
                  for i in sorted(idx) if i not in self.mirrored.get(s, ())]
        self.pending_out.clear()
        busy = [(s, i) for s, i in wanted
                if self.blocks.transfer[self.blocks.tables[s][i]] != NO_TRANSFER]
        for s, i in busy:
            self.pending_out.setdefault(s, set()).add(i)
        wanted = [w for w in wanted if w not in busy]
        placed = [(s, i) for s, i in wanted if self._has_host_block(s, i)]
        unplaced = [(s, i) for s, i in wanted if not self._has_host_block(s, i)]
        fits = placed + unplaced[: self.host.num_free]
        ticket = self._copy_out(fits, "eager")
        self.eager_blocks_out += len(fits)
        return ticket

    def rotate_out(self, seq_id: int) -> int:
        """Move ``seq_id``'s KV to host memory and free its GPU blocks (each joins the free list
        once its copy has landed). Returns how many blocks it copied now. OutOfHostBlocks
        (nothing changed) if the host arena cannot take them."""
        if seq_id in self.rotated or seq_id not in self.blocks.tables:
            raise ValueError(f"sequence {seq_id} has no KV blocks on the GPU to rotate out")
        need = self.blocks_to_rotate_out(seq_id)
        new_host = sum(1 for i in need if not self._has_host_block(seq_id, i))
        if new_host > self.host.num_free:
            raise OutOfHostBlocks(f"sequence {seq_id}: {new_host} host block(s) wanted, "
                                  f"{self.host.num_free} free")
        self.pending_out.pop(seq_id, None)
        self._copy_out([(seq_id, i) for i in need], "rotate-out")
        self.rotated[seq_id] = self.blocks.num_tokens[seq_id]
        self._stop_loading(seq_id)
        self.blocks.free(seq_id)
        return len(need)

    def rotate_in(self, seq_id: int) -> Ticket | None:
        """Give ``seq_id`` GPU blocks again and copy its KV back in (``ready`` says when it may
        run). Returns the copy's ticket (None inside a batch: the batch issues it). OutOfBlocks
        (nothing changed) if the GPU has too few free blocks."""
        num_tokens = self.rotated[seq_id]
        self.blocks.grow(seq_id, num_tokens)
        self.blocks.mark_written(seq_id, num_tokens)
        del self.rotated[seq_id]
        gpu = self.blocks.block_table(seq_id)
        host = self.host_tables[seq_id][: len(gpu)]
        ticket = self._issue(COPY_IN, gpu, host, "rotate-in")
        if ticket is None:
            self.open_batch.loading.add(seq_id)
        else:
            self.loading[seq_id] = ticket
        return ticket

    def forget(self, seq_id: int) -> None:
        """``seq_id`` finished, was aborted or preempted by recompute: drop its host copies
        (the block manager frees its GPU blocks)."""
        host = [h for h in self.host_tables.pop(seq_id, []) if h >= 0]
        self.host.free(host)
        for book in (self.mirrored, self.pending_out, self.rotated):
            book.pop(seq_id, None)
        self._stop_loading(seq_id)

    def _stop_loading(self, seq_id: int) -> None:
        """``seq_id`` left the GPU: no copy-in decides any more when it may run."""
        self.loading.pop(seq_id, None)
        if self.open_batch is not None:
            self.open_batch.loading.discard(seq_id)

    @contextmanager
    def batch(self):
        """``with engine.batch():`` -- the moves inside share their copies (module docstring):
        on leaving, also by an exception (OutOfHostBlocks, OutOfBlocks), one ticket per
        direction carries every block they collected. ``ready``, ``wait_for_draining`` and
        ``wait_all`` refuse to run inside: the tickets they would look at do not exist yet."""
        if self.open_batch is not None:
            raise RuntimeError("a copy batch is already open")
        self.open_batch = CopyBatch()
        try:
            yield
        finally:
            batch, self.open_batch = self.open_batch, None
            self._issue_batch(batch)

    def _issue_batch(self, batch: CopyBatch) -> None:
        """One ticket per (direction, reason) the batch collected: copy-outs first, so that a
        copy-in of a host block that one of them writes is ordered after it (``after``)."""
        tickets = {}
        for direction in (COPY_OUT, COPY_IN):
            for (d, reason), (gpu, host) in batch.copies.items():
                if d == direction:
                    tickets[direction, reason] = self._send(direction, gpu, host, reason)
        for seq_id in batch.loading:
            self.loading[seq_id] = tickets[COPY_IN, "rotate-in"]
        self.poll()  # a synchronous transport has landed them already

    def _refuse_inside_batch(self, what: str) -> None:
        if self.open_batch is not None:
            raise RuntimeError(f"{what} inside a copy batch: its copies are not issued yet "
                               f"(leave the batch first)")

    def tick(self) -> None:
        """Once per engine step, before scheduling: let time pass, land what has landed."""
        self.step += 1
        self.transport.tick()
        self.poll()

    def poll(self) -> None:
        """Close the books of every copy that landed."""
        for ticket in self.transport.poll():
            self.blocks.end_transfer(ticket.gpu_blocks)
            self.host.end_transfer(ticket.host_blocks)
            for h in ticket.host_blocks.tolist():
                if self.host_users.get(h) is ticket:
                    del self.host_users[h]
        self.loading = {s: t for s, t in self.loading.items() if not t.landed}

    def wait_for_draining(self) -> None:
        """Block until every draining GPU block is free (a scheduler that needs the blocks a
        rotate-out is giving back *now* pays this: with eager rotation, one tail block)."""
        self._refuse_inside_batch("wait_for_draining")
        draining = set(np.flatnonzero(self.blocks.state == DRAINING).tolist())
        for ticket in list(self.transport.in_flight):
            if draining & set(ticket.gpu_blocks.tolist()):
                self.transport.wait(ticket)
        self.poll()

    def wait_all(self) -> None:
        self._refuse_inside_batch("wait_all")
        self.transport.wait_all()
        self.poll()

    # --- copies -------------------------------------------------------------------------------
    def _has_host_block(self, seq_id: int, index: int) -> bool:
        table = self.host_tables.get(seq_id, [])
        return index < len(table) and table[index] >= 0

    def _host_block(self, seq_id: int, index: int, fresh: list[int]) -> int:
        table = self.host_tables.setdefault(seq_id, [])
        table.extend([-1] * (index + 1 - len(table)))
        if table[index] < 0:
            table[index] = fresh.pop(0)
        return table[index]

    def _copy_out(self, logical: list[tuple[int, int]], reason: str) -> Ticket | None:
        """Copy logical blocks [(sequence, index)] to their host blocks (allocated now if they
        have none: one consecutive run when possible) in one ticket (inside a batch: the
        batch's)."""
        if not logical:
            return None
        missing = sum(1 for s, i in logical if not self._has_host_block(s, i))
        fresh = self.host.allocate(missing).tolist()
        host = [self._host_block(s, i, fresh) for s, i in logical]
        gpu = [self.blocks.block_table(s)[i] for s, i in logical]
        for s, i in logical:
            self.mirrored.setdefault(s, set()).add(i)
        return self._issue(COPY_OUT, gpu, host, reason)

    def _issue(self, direction: int, gpu: list[int], host: list[int], reason: str) -> Ticket | None:
        """Copy GPU blocks ``gpu`` to or from host blocks ``host``. The books first: neither
        side may be reused until the copy lands. Then the copy: now (its ticket), or when the
        open batch ends (None)."""
        self.blocks.begin_transfer(gpu, direction)
        self.host.begin_transfer(host)
        self.blocks_copied[direction] += len(gpu)
        if self.open_batch is not None:
            collected_gpu, collected_host = self.open_batch.copies.setdefault((direction, reason),
                                                                              ([], []))
            collected_gpu.extend(gpu)
            collected_host.extend(host)
            return None
        ticket = self._send(direction, gpu, host, reason)
        self.poll()  # a synchronous transport has landed it already
        return ticket

    def _send(self, direction: int, gpu: list[int], host: list[int], reason: str) -> Ticket:
        """One transport ticket for blocks already booked by ``_issue``, after every copy still
        touching its host blocks."""
        after = [self.host_users[h] for h in host if h in self.host_users]
        if direction == COPY_OUT:
            ticket = self.transport.copy_out(gpu, host, after)
        else:
            ticket = self.transport.copy_in(host, gpu, after)
        for h in host:
            self.host_users[h] = ticket
        self.history.append(TransferRecord(self.step, direction, reason, len(gpu),
                                           tuple(ticket.copy_sizes)))
        return ticket

    # --- the live map -------------------------------------------------------------------------
    def gpu_view(self) -> np.ndarray:
        """(N,) int8 codes into GPU_VIEW, one per GPU block (draining: ownerless, its copy still
        in flight)."""
        state, transfer = self.blocks.state, self.blocks.transfer
        view = np.select([state == DRAINING, transfer == COPY_OUT, transfer == COPY_IN,
                          state == DIRTY, state == SYNCED],
                         [G_DRAINING, G_OUT, G_IN, G_DIRTY, G_SYNCED], G_FREE).astype(np.int8)
        for seq_id, table in self.blocks.tables.items():
            for i in self.mirrored.get(seq_id, ()):
                if i < len(table) and view[table[i]] == G_SYNCED:
                    view[table[i]] = G_MIRRORED
        return view

    def host_view(self) -> np.ndarray:
        """(H,) int8 codes into HOST_VIEW, one per host block."""
        view = np.full(self.host.num_blocks, H_FREE, np.int8)
        for seq_id, table in self.host_tables.items():
            used = [h for h in table if h >= 0]
            view[used] = H_ROTATED if seq_id in self.rotated else H_MIRROR
        view[self.host.in_flight > 0] = H_IN_FLIGHT
        return view

    def check(self) -> None:
        """The invariants of the module docstring, plus the two allocators' own."""
        self.blocks.check()
        self.host.check()
        flying = {COPY_OUT: set(), COPY_IN: set()}
        for direction, gpu in self._copies_under_way():
            blocks = set(gpu)
            assert not blocks & (flying[COPY_OUT] | flying[COPY_IN]), "two copies on one block"
            flying[direction] |= blocks
        for direction, code in ((COPY_OUT, COPY_OUT), (COPY_IN, COPY_IN)):
            assert set(np.flatnonzero(self.blocks.transfer == code).tolist()) == flying[direction]
        assert not set(self.rotated) & set(self.blocks.tables), "rotated out yet on the GPU"
        owners = [h for table in self.host_tables.values() for h in table if h >= 0]
        assert len(owners) == len(set(owners)), "a host block mirrors two blocks"
        assert not self.host.is_free[owners].any(), "a host copy in a free host block"
        for seq_id in self.rotated:
            have = self.mirrored.get(seq_id, set())
            assert set(range(self.blocks_to_rotate_in(seq_id))) <= have, \
                "a rotated-out sequence lacks a host copy"


def make_rotation_engine(block_manager: BlockManager, kv_pool, num_host_blocks: int,
                         compute_stream=None, eager: bool = True, delay: int = 0,
                         transport: str = "mapped") -> RotationEngine:
    """A rotation engine for an executor's ``kv_pool`` (N, L, 2, B, K, E): NumPy (the reference
    executor; ``delay`` ticks per copy) or a device array (the kernel executors; the host arena
    is pinned and mapped on a GPU; ``transport`` "mapped" or "staged", see ``transfer.py``)."""
    if isinstance(kv_pool, np.ndarray):
        host = HostKVStore(num_host_blocks, tuple(kv_pool.shape[1:]), kv_pool.dtype)
        return RotationEngine(block_manager, host, NumpyTransport(kv_pool, host, delay), eager)
    from ..backend import get_backend

    host = HostKVStore(num_host_blocks, tuple(kv_pool.shape[1:]), kv_pool.dtype,
                       pinned=not get_backend().is_simulator)
    transports = {"mapped": MappedTransport, "staged": DeviceTransport}
    if transport not in transports:
        raise ValueError(f"unknown KV transport {transport!r}; choose from {', '.join(transports)}")
    return RotationEngine(block_manager, host, transports[transport](kv_pool, host, compute_stream),
                          eager)
