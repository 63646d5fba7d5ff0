"""DuplexKV's block books on the device (SuperInfer §4): ``device_blocks`` keeps them as the host.

The host's ``BlockManager`` and ``RotationEngine`` (over a ``NumpyTransport`` whose copies land a
tick or two after they are issued) are the oracle: random schedules of writes, eager copy-outs,
rotate-outs, rotate-ins, finishes and clock ticks go to both, and after every operation the
block states, the copies in flight, the per-sequence books and the decisions (what a rotate-out
moves, what the eager copy-out picks, who is ready) must be equal. The device claims other block
ids than the host's free list hands out, so blocks are compared through the pairing of the
two block tables (``twin``). The property test counts the transitions its schedules took and
fails if one never happened. A second test races many threads for blocks.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from blink_edu.kv.block_manager import (COPY_IN, COPY_OUT, DIRTY, DRAINING, FREE, NO_TRANSFER,
                                        SYNCED, BlockManager, OutOfBlocks)
from blink_edu.kv.device_blocks import FREE_WORD, BlockBooks, claim_at_once
from blink_edu.kv.host_store import HostKVStore
from blink_edu.kv.rotation import RotationEngine
from blink_edu.kv.transfer import NumpyTransport

N, B, S = 6, 2, 4  # GPU blocks, tokens per block, sequence slots
H = 64  # host blocks: more than S sequences of N blocks, so the host never runs short
NAMES = {FREE: "free", DIRTY: "dirty", SYNCED: "synced", DRAINING: "draining"}
COPIES = {NO_TRANSFER: "idle", COPY_OUT: "copy-out", COPY_IN: "copy-in"}


class Twins:
    """The host engine and the device books, driven by the same operations."""

    def __init__(self, delay: int):
        pool = np.zeros((N, 1, 2, B, 1, 1))  # (N, L, 2, B, K, E): the bytes are not the point
        self.blocks = BlockManager(N, B)
        self.host = HostKVStore(H, pool.shape[1:], pool.dtype)
        self.transport = NumpyTransport(pool, self.host, delay)
        self.engine = RotationEngine(self.blocks, self.host, self.transport)
        self.device = BlockBooks.empty(N, S, N, B)
        self.twin: dict[int, int] = {}  # host GPU block -> the device block in its place
        self.seen: Counter = Counter()

    # --- operations ------------------------------------------------------------------------
    def write(self, s: int, count: int) -> None:
        old = self.blocks.num_tokens.get(s, 0)
        try:
            self.blocks.grow(s, old + count)
            host_ok = True
        except OutOfBlocks:
            host_ok = False
        assert self.device.write(s, count) == host_ok
        if host_ok:
            self.blocks.mark_written(s, old + count)
            self.engine.on_written(s, old, old + count)
        self.pair_tables()
        self.flush()

    def flush(self) -> None:
        before = {s: set(m) for s, m in self.engine.mirrored.items()}
        host_free = self.host.num_free
        self.engine.flush()
        picked = {(s, i) for s, m in self.engine.mirrored.items() for i in m - before.get(s, set())}
        assert set(self.device.flush(host_free)) == picked
        self.seen["eager copy-out"] += bool(picked)
        self.seen["a copy-in keeps a block queued"] += bool(self.engine.pending_out)

    def rotate_out(self, s: int) -> None:
        need = self.engine.blocks_to_rotate_out(s)
        self.seen["rotate-out moves only the tail"] += 0 < len(need) < len(
            self.blocks.block_table(s))
        self.engine.rotate_out(s)
        assert self.device.rotate_out(s) == need

    def rotate_in(self, s: int) -> None:
        try:
            self.engine.rotate_in(s)
            host_ok = True
        except OutOfBlocks:
            host_ok = False
        assert self.device.rotate_in(s) == host_ok
        self.pair_tables()

    def finish(self, s: int) -> None:
        self.engine.forget(s)
        self.blocks.free(s)
        self.device.finish(s)

    def tick(self) -> None:
        flying = list(self.transport.in_flight)
        self.engine.tick()
        landed = [b for t in flying if t.landed for b in t.gpu_blocks.tolist()]
        self.device.land([self.twin[b] for b in landed])

    def pair_tables(self) -> None:
        for s, table in self.blocks.tables.items():
            for i, b in enumerate(table):
                self.twin[b] = int(self.device.table[s, i])

    # --- the comparison --------------------------------------------------------------------
    def assert_equal(self) -> None:
        dev = self.device
        state, transfer = dev.states(), dev.transfers()
        used = np.flatnonzero(self.blocks.state != FREE).tolist()
        for b in used:
            assert state[self.twin[b]] == self.blocks.state[b], f"host block {b}"
            assert transfer[self.twin[b]] == self.blocks.transfer[b], f"host block {b}"
        assert (state == FREE).sum() == N - len(used)
        assert ((state == FREE) == (dev.words == FREE_WORD)).all()  # free: nothing in flight
        for s in range(S):
            table = self.blocks.tables.get(s, [])
            assert dev.table[s].tolist() == [self.twin[b] for b in table] + [-1] * (N - len(table))
            assert dev.num_tokens[s] == self.blocks.num_tokens.get(s, 0)
            assert dev.rotated[s] == self.engine.rotated.get(s, -1)
            for device_book, host_book in ((dev.mirrored, self.engine.mirrored),
                                           (dev.pending, self.engine.pending_out)):
                assert set(np.flatnonzero(device_book[s]).tolist()) == host_book.get(s, set())
            assert np.flatnonzero(dev.on_host[s]).tolist() == [
                i for i, h in enumerate(self.engine.host_tables.get(s, [])) if h >= 0]
            if table:
                assert dev.ready(s) == self.engine.ready(s)

    def count_transitions(self, words_before: np.ndarray) -> None:
        for old, new in zip(words_before.tolist(), self.device.words.tolist()):
            if old & 3 != new & 3:
                self.seen[NAMES[old & 3], NAMES[new & 3]] += 1
            if old >> 2 != new >> 2:
                self.seen[COPIES[old >> 2], COPIES[new >> 2]] += 1


operations = st.lists(st.tuples(st.sampled_from(["write", "write", "rotate", "rotate", "finish",
                                                  "tick", "tick"]),
                                st.integers(0, S - 1), st.integers(1, 5)), min_size=5, max_size=30)
# out and back in, then written while its copy-in is in flight (random schedules find it rarely)
BACK_IN_AND_WRITTEN = [("write", 0, 3), ("tick", 0, 1), ("tick", 0, 1), ("rotate", 0, 1),
                       ("tick", 0, 1), ("tick", 0, 1), ("rotate", 0, 1), ("write", 0, 1),
                       ("tick", 0, 1), ("tick", 0, 1), ("write", 0, 1), ("finish", 0, 1)]

EVERY_TRANSITION = [("free", "dirty"), ("dirty", "synced"), ("dirty", "free"), ("synced", "free"),
                    ("dirty", "draining"), ("synced", "draining"), ("draining", "free"),
                    ("idle", "copy-out"), ("copy-out", "idle"), ("idle", "copy-in"),
                    ("copy-in", "idle"), "eager copy-out", "rotate-out moves only the tail",
                    "a copy-in keeps a block queued"]


def test_the_device_keeps_the_books_as_the_host():
    seen = Counter()

    @settings(max_examples=50, deadline=None)
    @given(ops=operations, delay=st.integers(1, 2))
    @example(ops=BACK_IN_AND_WRITTEN, delay=2)
    def run(ops, delay):
        twins = Twins(delay)
        for op, s, count in ops:
            words_before = twins.device.words.copy()
            if op == "tick":
                twins.tick()
            elif s in twins.engine.rotated:
                if op == "rotate":
                    twins.rotate_in(s)
                elif op == "finish":
                    twins.finish(s)
            elif s in twins.blocks.tables:
                if op == "write":  # ready or not: on a GPU the kernel waits for the copy-in
                    twins.write(s, count)
                elif op == "rotate":
                    twins.rotate_out(s)
                elif op == "finish":
                    twins.finish(s)
            elif op == "write":
                twins.write(s, count)
            twins.count_transitions(words_before)
            twins.engine.check()
            twins.assert_equal()
        seen.update(twins.seen)

    run()
    missing = [t for t in EVERY_TRANSITION if not seen[t]]
    assert missing == [], f"never exercised: {missing}; seen {dict(seen)}"


def test_threads_claiming_at_once_never_share_a_block():
    words = np.full(12, FREE_WORD, np.int32)  # (N,) every block free
    words[[2, 5]] = DIRTY  # two already taken
    claimed = claim_at_once(words, 8)
    assert len(set(claimed.tolist())) == 8 and (claimed >= 0).all()
    assert not {2, 5} & set(claimed.tolist())
    assert (words == FREE_WORD).sum() == 10 - 8
    assert (words[claimed] == DIRTY).all()

    left = set(np.flatnonzero(words == FREE_WORD).tolist())
    more = claim_at_once(words, 4)  # two blocks left for four threads
    assert (more == -1).sum() == 2 and set(more[more >= 0].tolist()) == left
    assert (words == FREE_WORD).sum() == 0
    assert claim_at_once(words, 3).tolist() == [-1, -1, -1]  # an empty pool
