"""The rotation engine (DuplexKV) on its own: byte-exact round trips, and random schedules of
writes, rotate-outs, rotate-ins, finishes and clock ticks that never lose or corrupt a byte.

Copies go through ``NumpyTransport`` with a delay: the bytes move when a copy *lands*, so a block
reused (or read) while a copy from (or into) it is in flight shows up as wrong bytes here. One
test breaks the engine on purpose to show that it does. ``DeviceTransport`` runs in the simulator.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu.backend import get_backend
from blink_edu.kv.block_manager import COPY_OUT, BlockManager, OutOfBlocks
from blink_edu.kv.host_store import HostKVStore, OutOfHostBlocks
from blink_edu.kv.rotation import RotationEngine, make_rotation_engine
from blink_edu.kv.transfer import NumpyTransport

B = 4  # tokens per block
TOKEN_SHAPE = (2, 2, 1, 3)  # one token's K/V: (L, 2, K, E)


class World:
    """A pool, a block manager, a rotation engine, and the truth: every sequence's K/V."""

    def __init__(self, rng, num_blocks=8, host_blocks=16, delay=0, eager=True, device=None):
        """``device``: None (a NumPy pool), or the kernel executors' transport over a device
        pool: "staged" or "mapped"."""
        self.rng = rng
        L, _, K, E = TOKEN_SHAPE
        pool = np.zeros((num_blocks, L, 2, B, K, E))  # (N, L, 2, B, K, E) float64
        self.blocks = BlockManager(num_blocks, B)
        if device:
            self.pool = get_backend().cuda.to_device(pool)
            self.engine = make_rotation_engine(self.blocks, self.pool, host_blocks, eager=eager,
                                               transport=device)
        else:
            self.pool = pool
            host = HostKVStore(host_blocks, pool.shape[1:], pool.dtype)
            self.engine = RotationEngine(self.blocks, host, NumpyTransport(pool, host, delay), eager)
        self.truth: dict[int, list[np.ndarray]] = {}  # sequence -> one (L, 2, K, E) per token
        self.next_id = 0

    def pool_now(self) -> np.ndarray:
        if isinstance(self.pool, np.ndarray):
            return self.pool
        self.engine.wait_all()  # on a GPU, copies run on their own streams
        return self.pool.copy_to_host()

    def write(self, seq: int, n: int) -> None:
        """What a kernel does: ``n`` new tokens of ``seq`` into its blocks."""
        start = len(self.truth[seq])
        self.blocks.grow(seq, start + n)
        table = self.blocks.block_table(seq)
        written = table[start // B: -(-(start + n) // B)]
        assert (self.blocks.transfer[written] != COPY_OUT).all(), "writing a block being copied out"
        values = self.rng.standard_normal((n, *TOKEN_SHAPE))
        pool = self.pool_now()
        for p, value in enumerate(values, start):
            pool[table[p // B], :, :, p % B] = value
        if not isinstance(self.pool, np.ndarray):
            self.pool.copy_to_device(pool)
        self.truth[seq] += list(values)
        self.blocks.mark_written(seq, start + n)
        self.engine.on_written(seq, start, start + n)
        self.engine.flush()

    def new(self, n: int) -> int:
        seq, self.next_id = self.next_id, self.next_id + 1
        self.truth[seq] = []
        try:
            self.write(seq, n)
        except OutOfBlocks:
            del self.truth[seq]
        return seq

    def finish(self, seq: int) -> None:
        self.engine.forget(seq)
        self.blocks.free(seq)
        del self.truth[seq]

    def resident(self) -> list[int]:
        return [s for s in self.truth if s in self.blocks.tables]

    def ready(self) -> list[int]:
        return [s for s in self.resident() if self.engine.ready(s)]

    def assert_contents(self) -> None:
        """Every sequence the model could run now has exactly its bytes in the pool."""
        pool = self.pool_now()
        for seq in self.ready():
            table = self.blocks.block_table(seq)
            for p, value in enumerate(self.truth[seq]):
                np.testing.assert_array_equal(pool[table[p // B], :, :, p % B], value,
                                              err_msg=f"sequence {seq}, token {p}")


@pytest.mark.parametrize("delay", [0, 2])
def test_round_trip_is_byte_exact(rng, delay):
    world = World(rng, delay=delay)
    a = world.new(9)  # 2 full blocks + a dirty tail of 1
    b = world.new(6)
    before = world.pool_now()[world.blocks.block_table(a)].copy()
    world.engine.rotate_out(a)
    c = world.new(7)  # takes whatever is free; a's drained blocks only after their copies land
    for _ in range(delay + 1):
        world.engine.tick()
    world.write(c, 1)
    world.engine.rotate_in(a)
    for _ in range(delay + 1):
        world.engine.tick()
    assert world.engine.ready(a)
    np.testing.assert_array_equal(world.pool_now()[world.blocks.block_table(a)], before)
    world.assert_contents()
    world.engine.check()
    assert b in world.resident()


@pytest.mark.parametrize("transport", ["staged", "mapped"])
def test_round_trip_through_the_device_transports(rng, transport):
    """DeviceTransport (gather kernel + staging + copies) and MappedTransport (one kernel over
    mapped host memory): Numba's simulator here, streams and pinned memory on a GPU."""
    world = World(rng, device=transport)
    a = world.new(10)
    before = world.pool_now()[world.blocks.block_table(a)].copy()
    world.engine.rotate_out(a)
    world.new(12)  # reuses a's blocks at once: the simulator's copies have landed
    world.engine.rotate_in(a)
    np.testing.assert_array_equal(world.pool_now()[world.blocks.block_table(a)], before)
    world.assert_contents()
    world.engine.check()


def test_eager_rotation_leaves_only_the_dirty_tail(rng):
    world = World(rng, num_blocks=16, host_blocks=32)
    seq = world.new(3)
    for _ in range(19):
        world.write(seq, 1)  # 22 tokens: 5 full blocks (copied as they filled), a tail of 2
    assert world.engine.eager_blocks_out == 5
    assert world.engine.rotate_out(seq) == 1

    def back_in_and_write_one() -> int:
        world.engine.rotate_in(seq)
        world.write(seq, 1)
        return world.engine.rotate_out(seq)

    assert back_in_and_write_one() == 1  # 23: the tail was written again, its host copy stale
    assert back_in_and_write_one() == 0  # 24: the tail filled up and was copied eagerly
    assert back_in_and_write_one() == 1  # 25: a new tail
    world.engine.rotate_in(seq)
    world.assert_contents()


def test_without_eager_rotation_everything_moves_at_rotate_out(rng):
    world = World(rng, num_blocks=16, host_blocks=32, eager=False)
    seq = world.new(23)
    assert world.engine.rotate_out(seq) == 6


def test_a_full_host_refuses_a_rotate_out_without_changing_anything(rng):
    world = World(rng, host_blocks=2, eager=False)
    seq = world.new(9)
    with pytest.raises(OutOfHostBlocks):
        world.engine.rotate_out(seq)
    assert seq in world.resident()
    world.engine.check()
    world.assert_contents()


def test_reusing_a_block_in_flight_would_be_caught(rng):
    """The harness can fail: free a rotated-out sequence's blocks as if its copies had landed,
    let another sequence write them, and the late copy carries the wrong bytes home."""
    world = World(rng, num_blocks=4, delay=1)
    a = world.new(6)
    world.engine.rotate_out(a)
    world.blocks.end_transfer(np.flatnonzero(world.blocks.transfer != 0))  # the bug: too early
    world.blocks.transfer[:] = 0
    world.new(16)  # all four blocks, a's among them, written before a's copy lands
    world.engine.tick()
    world.finish(1)
    world.engine.rotate_in(a)
    world.engine.tick()
    with pytest.raises(AssertionError):
        world.assert_contents()


@pytest.mark.parametrize("delay", [0, 2])
def test_a_batch_moves_k_sequences_with_one_ticket_per_direction(rng, delay):
    world = World(rng, num_blocks=16, host_blocks=32, delay=delay, eager=False)
    engine, transport = world.engine, world.engine.transport
    seqs = [world.new(int(n)) for n in rng.integers(1, 10, size=3)]
    before = [world.pool_now()[world.blocks.block_table(s)].copy() for s in seqs]
    issued = len(engine.history)
    with engine.batch():
        moved = [engine.rotate_out(s) for s in seqs]
        engine.check()  # the collected copies count as in flight
        assert len(engine.history) == issued  # collected, not issued
    [record] = engine.history[issued:]
    assert record.reason == "rotate-out" and record.num_blocks == sum(moved)
    engine.wait_all()
    world.finish(world.new(16 * B))  # every GPU block overwritten by someone else
    with engine.batch():
        assert all(engine.rotate_in(s) is None for s in seqs)  # the ticket comes at the end
    [record] = engine.history[issued + 1:]
    assert record.reason == "rotate-in" and record.num_blocks == sum(moved)
    if delay:
        [ticket] = transport.in_flight
        assert all(engine.loading[s] is ticket for s in seqs)
    engine.wait_all()
    for seq, blocks in zip(seqs, before):
        np.testing.assert_array_equal(world.pool_now()[world.blocks.block_table(seq)], blocks)
    engine.check()


def test_a_copy_in_waits_for_a_copy_out_of_its_host_blocks_in_the_same_batch(rng):
    world = World(rng, delay=2)
    seq = world.new(6)  # a full block (mirrored eagerly) and a dirty tail
    engine = world.engine
    with engine.batch():
        assert engine.rotate_out(seq) == 1
        engine.rotate_in(seq)
    copy_out, copy_in = engine.transport.in_flight[-2:]
    assert copy_out in copy_in.after  # the tail's host block is written by the first
    engine.wait_all()
    world.assert_contents()
    engine.check()


def test_a_refused_move_inside_a_batch_still_issues_what_was_collected(rng):
    world = World(rng, num_blocks=8, host_blocks=3, delay=1, eager=False)
    a, b = world.new(7), world.new(9)  # 2 and 3 blocks: the host holds only the first
    engine = world.engine
    with pytest.raises(OutOfHostBlocks):
        with engine.batch():
            engine.rotate_out(a)
            engine.rotate_out(b)
    assert [r.reason for r in engine.history] == ["rotate-out"]
    assert engine.is_rotated(a) and b in world.resident()
    engine.check()
    engine.wait_all()
    world.assert_contents()


def test_waiting_or_asking_ready_inside_a_batch_is_refused(rng):
    world = World(rng, delay=1)
    seq = world.new(5)
    with world.engine.batch():
        world.engine.rotate_out(seq)
        for call in (lambda: world.engine.ready(seq), world.engine.wait_for_draining,
                     world.engine.wait_all):
            with pytest.raises(RuntimeError, match="inside a copy batch"):
                call()
    world.engine.wait_for_draining()  # outside: the tail's copy exists, it lands
    assert world.blocks.num_draining == 0


OPS = st.lists(st.tuples(st.sampled_from(["new", "decode", "decode", "decode", "out", "in",
                                          "finish", "tick", "tick"]),
                         st.integers(0, 1000), st.integers(1, 9)), min_size=15, max_size=45)


@settings(max_examples=100, deadline=None)
@given(ops=OPS, delay=st.integers(0, 3), eager=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_schedules_never_lose_a_byte(ops, delay, eager, seed):
    world = World(np.random.default_rng(seed), delay=delay, eager=eager)
    engine = world.engine
    for op, pick, n in ops:
        ready, rotated = world.ready(), sorted(engine.rotated)
        if op == "new":
            world.new(n)
        elif op == "decode" and ready:
            try:
                world.write(ready[pick % len(ready)], 1)
            except OutOfBlocks:
                pass
        elif op == "out" and world.resident():
            seq = world.resident()[pick % len(world.resident())]
            try:
                moved = engine.rotate_out(seq)
                assert not eager or delay > 0 or moved <= 1  # eager: only the dirty tail
            except OutOfHostBlocks:
                pass
        elif op == "in" and rotated:
            try:
                engine.rotate_in(rotated[pick % len(rotated)])
            except OutOfBlocks:
                pass
        elif op == "finish" and world.truth:
            world.finish(sorted(world.truth)[pick % len(world.truth)])
        elif op == "tick":
            engine.tick()
        engine.check()
        world.assert_contents()
    # everything lands, everything rotated comes home intact
    engine.wait_all()
    for seq in sorted(engine.rotated):
        for s in world.resident():
            world.finish(s)
        engine.rotate_in(seq)
        engine.wait_all()
        world.assert_contents()
    engine.check()


def test_a_plan_decides_the_copies_of_a_numpy_transport(rng):
    """``plan=`` is called once per ticket with its pairs; the ticket holds the pairs in the
    plan's order and one copy per planned run, and the bytes land as the pairs say."""
    pool = rng.standard_normal((6, 1, 2, 2, 1, 3))  # (N, L, 2, B, K, E)
    host = HostKVStore(8, pool.shape[1:], pool.dtype)
    calls = []

    def one_copy_per_block(gpu_blocks, host_blocks):  # never merges: a plan may cut finer
        calls.append((gpu_blocks.tolist(), host_blocks.tolist()))
        return [(int(h), [int(g)]) for g, h in sorted(zip(gpu_blocks, host_blocks), reverse=True)]

    transport = NumpyTransport(pool, host, delay=1, plan=one_copy_per_block)
    ticket = transport.copy_out([4, 0, 2], [5, 3, 4])
    assert calls == [([4, 0, 2], [5, 3, 4])]
    assert ticket.gpu_blocks.tolist() == [4, 2, 0] and ticket.host_blocks.tolist() == [5, 4, 3]
    assert ticket.copy_sizes == [pool[0].nbytes] * 3
    assert not host.blocks.any()  # nothing moves before it lands
    transport.tick()
    assert transport.poll() == [ticket]
    np.testing.assert_array_equal(host.blocks[[5, 3, 4]], pool[[4, 0, 2]])


@pytest.mark.parametrize("wrong", ["drops a pair", "repeats a pair", "pairs other blocks"])
def test_a_plan_that_does_not_name_every_pair_once_is_refused(rng, wrong):
    pool = rng.standard_normal((6, 1, 2, 2, 1, 3))  # (N, L, 2, B, K, E)
    host = HostKVStore(8, pool.shape[1:], pool.dtype)

    def bad_plan(gpu_blocks, host_blocks):
        copies = [(int(h), [int(g)]) for g, h in zip(gpu_blocks, host_blocks)]
        if wrong == "drops a pair":
            return copies[1:]
        if wrong == "repeats a pair":
            return copies + copies[:1]
        return [(h + 1, run) for h, run in copies]

    transport = NumpyTransport(pool, host, plan=bad_plan)
    with pytest.raises(ValueError, match="exactly once"):
        transport.copy_out([4, 0, 2], [5, 3, 4])
    assert transport.in_flight == [] and not host.blocks.any()  # nothing issued, nothing moved


def test_device_transport_splits_a_ticket_over_its_staging_buffer(rng):
    """More blocks than the staging buffer holds, scattered on the GPU, partly consecutive on the
    host: several gather + copy rounds, one copy per host run; byte-exact both ways."""
    from blink_edu.kv.transfer import DeviceTransport

    pool = rng.standard_normal((9, 1, 2, 2, 1, 4)).astype(np.float32)  # (N, L, 2, B, K, E)
    device_pool = get_backend().cuda.to_device(pool)
    host = HostKVStore(12, pool.shape[1:], pool.dtype)
    transport = DeviceTransport(device_pool, host, staging_bytes=2 * pool[0].nbytes)
    gpu = np.array([7, 1, 4, 0, 5], np.int32)
    host_ids = np.array([3, 4, 5, 9, 10], np.int32)  # two runs
    ticket = transport.copy_out(gpu, host_ids)
    transport.wait(ticket)  # lands at once in the simulator; on a GPU it runs on its stream
    assert ticket.copy_sizes == [3 * pool[0].nbytes, 2 * pool[0].nbytes]
    np.testing.assert_array_equal(host.blocks[host_ids], pool[gpu])
    back = np.array([8, 2, 6, 3, 1], np.int32)
    transport.wait(transport.copy_in(host_ids, back))
    np.testing.assert_array_equal(device_pool.copy_to_host()[back], pool[gpu])
    assert [t.landed for t in transport.poll()] == [True, True]


def test_mapped_transport_moves_scattered_blocks_through_every_id_slot(rng):
    """More tickets than id slots (each slot reused), scattered blocks on both sides: byte-exact
    both ways, one copy per ticket whatever the host runs."""
    from blink_edu.kv.transfer import MappedTransport

    pool = rng.standard_normal((9, 1, 2, 2, 1, 4)).astype(np.float32)  # (N, L, 2, B, K, E)
    device_pool = get_backend().cuda.to_device(pool)
    host = HostKVStore(12, pool.shape[1:], pool.dtype, pinned=not get_backend().is_simulator)
    transport = MappedTransport(device_pool, host)
    for _ in range(MappedTransport.SLOTS + 2):
        n = int(rng.integers(1, 6))
        gpu = rng.permutation(9)[:n].astype(np.int32)
        host_ids = np.sort(rng.permutation(12)[:n]).astype(np.int32)
        ticket = transport.copy_out(gpu, host_ids)
        assert ticket.copy_sizes == [n * pool[0].nbytes]
        transport.wait(ticket)
        np.testing.assert_array_equal(host.blocks[host_ids], pool[gpu])
        back = rng.permutation(9)[:n].astype(np.int32)
        transport.wait(transport.copy_in(host_ids, back))
        pool[back] = pool[gpu]  # what the pool must now hold
        np.testing.assert_array_equal(device_pool.copy_to_host(), pool)
    assert all(t.landed for t in transport.poll())


def test_a_block_filled_while_its_copy_in_is_in_flight_is_copied_out_after_it_lands(rng):
    """On a GPU the model's kernels are ordered after a copy-in on the device (no wait on the
    host), so a rotated-in request can fill a block before the host has seen that block's copy-in
    land. Eager rotation must queue that block for a later flush, not copy it out of a block that
    still has a copy in flight (found on the H200 by bench.slo --real)."""
    world = World(rng, num_blocks=16, host_blocks=32, delay=2)
    seq = world.new(3)
    world.engine.rotate_out(seq)
    world.engine.wait_all()
    ticket = world.engine.rotate_in(seq)  # lands 2 ticks from now
    transport = world.engine.transport
    for _ in range(2):
        transport.tick()
    # The bytes land on the "device", as an event completes on a GPU; the engine has not
    # polled the transport yet, so the block still counts as having a copy in flight.
    ticket.landed = transport._try_land(ticket)
    assert ticket.landed and world.blocks.transfer[world.blocks.block_table(seq)[0]] != 0
    world.write(seq, 1)  # as the GPU would: the block fills before the host saw the copy land
    assert world.engine.pending_out  # queued, not copied
    world.engine.wait_all()
    world.engine.flush()
    world.engine.wait_all()
    assert not world.engine.pending_out
    assert world.engine.rotate_out(seq) == 0  # the full block was mirrored eagerly after all
    world.engine.rotate_in(seq)
    world.engine.wait_all()
    world.assert_contents()
