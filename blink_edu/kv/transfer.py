"""Copy engines: moving KV blocks between the GPU pool and the host arena, in batches.

SuperInfer §4 (DuplexKV: layout transformation + batched transfer, full duplex) and DESIGN.md §6.
The rotation engine (``rotation.py``) decides *which* blocks move; a transport moves them. Both
transports have one interface::

    copy_out(gpu_blocks, host_blocks, after) -> Ticket    host[host_blocks[i]] = pool[gpu_blocks[i]]
    copy_in(host_blocks, gpu_blocks, after)  -> Ticket    pool[gpu_blocks[i]] = host[host_blocks[i]]
    poll()       the tickets that landed since the last poll, in issue order
    wait(t)      make ``t`` (and what it waits for) land now
    tick()       one engine step has passed
    order_compute_after(t) -> bool   can the model's kernels be ordered after ``t``?

``after`` lists earlier tickets that must land first (a copy-in of a block whose copy-out is
still in flight). A ticket batches all its blocks: they are sorted by host block, and every run
of consecutive host blocks is *one* copy (``copy_sizes`` records them: the chapter's histogram).

* ``NumpyTransport`` — the reference executor's pool is a NumPy array; copies are NumPy
  assignments. With ``delay=k`` a copy lands ``k`` ticks after it was issued, and the bytes move
  *when it lands*: a block reused or read too early then shows up as wrong bytes (or tokens).
  The property tests rely on that to make "nothing is overwritten while in flight" checkable.
* ``DeviceTransport`` — the kernel executors' pool is a device array. Each direction is a *lane*:
  its own non-blocking stream, a device staging buffer (>= 8 MiB by default), the gather/scatter
  kernel of ``kernels/kv_layout.py`` and one ``cudaMemcpyAsync`` per host run; an event marks the
  end of each ticket. Copy-outs and copy-ins run on different streams, so they overlap each
  other (full duplex) and the model's kernels. A lane first waits for the compute stream (the
  kernels that wrote a block must finish before it is copied out; a freed block must not be
  refilled while a kernel may still read it), and ``order_compute_after`` makes the compute stream
  wait for a copy-in before any kernel reads its blocks. In the simulator the same calls run
  synchronously: every copy has landed when it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .block_manager import COPY_IN, COPY_OUT
from .host_store import HostKVStore, consecutive_runs

STAGING_BYTES = 64 << 20  # per direction: 16 blocks of Qwen2.5-32B (4 MiB each)


@dataclass(eq=False)
class Ticket:
    """One batched copy in flight."""

    direction: int  # COPY_OUT (GPU -> host) or COPY_IN (host -> GPU)
    gpu_blocks: np.ndarray  # (n,) int32, sorted by host block
    host_blocks: np.ndarray  # (n,) int32, ascending
    nbytes: int
    copy_sizes: list[int]  # bytes of each copy it issues (one per run of host blocks)
    after: list["Ticket"] = field(default_factory=list)
    countdown: int = 0  # NumpyTransport: ticks until it lands
    event: object = None  # DeviceTransport: recorded after its last copy
    landed: bool = False
    reported: bool = False


class Transport:
    """What both transports share: the tickets in flight, in issue order, and their landing."""

    def __init__(self, row_bytes: int):
        self.row_bytes = row_bytes  # bytes per block
        self.in_flight: list[Ticket] = []

    def copy_out(self, gpu_blocks, host_blocks, after=()) -> Ticket:
        return self._issue(COPY_OUT, gpu_blocks, host_blocks, after)

    def copy_in(self, host_blocks, gpu_blocks, after=()) -> Ticket:
        return self._issue(COPY_IN, gpu_blocks, host_blocks, after)

    def _issue(self, direction, gpu_blocks, host_blocks, after) -> Ticket:
        gpu, host = np.asarray(gpu_blocks, np.int32), np.asarray(host_blocks, np.int32)  # (n,)
        order = np.argsort(host, kind="stable")
        gpu, host = gpu[order], host[order]
        runs = consecutive_runs(host)
        ticket = Ticket(direction, gpu, host, nbytes=len(gpu) * self.row_bytes,
                        copy_sizes=[count * self.row_bytes for _, count in runs],
                        after=[t for t in after if not t.landed])
        self._start(ticket, runs)
        self.in_flight.append(ticket)
        return ticket

    def poll(self) -> list[Ticket]:
        """Tickets that landed since the last poll, in issue order."""
        for ticket in self.in_flight:
            if not ticket.landed:
                ticket.landed = self._try_land(ticket)
        done = [t for t in self.in_flight if t.landed]
        self.in_flight = [t for t in self.in_flight if not t.landed]
        return done

    def tick(self) -> None:
        """One engine step passed."""

    def wait_all(self) -> None:
        for ticket in list(self.in_flight):
            self.wait(ticket)

    # subclasses: _start(ticket, runs), _try_land(ticket) -> bool, wait(ticket),
    # order_compute_after(ticket) -> bool


class NumpyTransport(Transport):
    def __init__(self, pool: np.ndarray, host: HostKVStore, delay: int = 0):
        """``pool`` (N, L, 2, B, K, E) NumPy; ``delay``: ticks before a copy lands (0: at once)."""
        if not (pool.flags.c_contiguous and host.blocks.flags.c_contiguous):
            raise ValueError("the pool and the host arena must be C-contiguous (copies go through views)")
        self.pool_rows = pool.reshape(pool.shape[0], -1)  # (N, W) view
        self.host_rows = host.blocks.reshape(host.num_blocks, -1)  # (H, W) view
        super().__init__(self.pool_rows.shape[1] * self.pool_rows.dtype.itemsize)
        self.delay = delay

    def _start(self, ticket: Ticket, runs) -> None:
        ticket.countdown = self.delay
        if self.delay == 0:
            ticket.landed = self._try_land(ticket)

    def _try_land(self, ticket: Ticket) -> bool:
        if ticket.countdown > 0 or not all(t.landed for t in ticket.after):
            return False
        if ticket.direction == COPY_OUT:  # the bytes move now, at landing
            self.host_rows[ticket.host_blocks] = self.pool_rows[ticket.gpu_blocks]
        else:
            self.pool_rows[ticket.gpu_blocks] = self.host_rows[ticket.host_blocks]
        return True

    def tick(self) -> None:
        for ticket in self.in_flight:
            ticket.countdown -= 1

    def wait(self, ticket: Ticket) -> None:
        for earlier in ticket.after:
            self.wait(earlier)
        if not ticket.landed:
            ticket.countdown = 0
            ticket.landed = self._try_land(ticket)

    def order_compute_after(self, ticket: Ticket) -> bool:
        return ticket.landed  # no streams to order: a kernel may read only what has landed


class _SimulatorLane:
    """One direction in Numba's simulator: synchronous copies through a staging device array."""

    def __init__(self, cuda, staging_blocks: int, row_words: int, dtype):
        self.cuda = cuda
        self.staging = cuda.device_array((staging_blocks, row_words), dtype)  # (S, W)
        self.stream = 0

    def block_ids(self, ids: np.ndarray):
        return self.cuda.to_device(ids)  # (n,) int32

    def to_host(self, host_rows, host_start: int, offset: int, count: int) -> None:
        self.staging[offset:offset + count].copy_to_host(host_rows[host_start:host_start + count])

    def to_device(self, host_rows, host_start: int, offset: int, count: int) -> None:
        self.staging[offset:offset + count].copy_to_device(host_rows[host_start:host_start + count])

    def wait_for(self, event) -> None:
        pass

    def record(self):
        return None


class _CudaLane:
    """One direction on a GPU: a non-blocking CuPy stream, device staging, async copies."""

    def __init__(self, cuda, staging_blocks: int, row_words: int, dtype):
        import cupy

        self.cupy = cupy
        self.cupy_stream = cupy.cuda.Stream(non_blocking=True)
        self.stream = cuda.external_stream(self.cupy_stream.ptr)  # for numba launches
        self._staging = cupy.empty((staging_blocks, row_words), dtype)  # (S, W)
        self.staging = cuda.as_cuda_array(self._staging)  # converted once: cheap launches
        self.row_bytes = row_words * np.dtype(dtype).itemsize
        self._ids = cupy.empty(staging_blocks, np.int32)  # (S,)
        self._ids_kernel = cuda.as_cuda_array(self._ids)

    def block_ids(self, ids: np.ndarray):
        self._ids[: len(ids)].set(ids, stream=self.cupy_stream)
        return self._ids_kernel[: len(ids)]

    def _copy(self, host_rows, host_start, offset, count, kind) -> None:
        runtime = self.cupy.cuda.runtime
        host_ptr = host_rows[host_start].ctypes.data
        dev_ptr = self._staging.data.ptr + offset * self.row_bytes
        dst, src = (host_ptr, dev_ptr) if kind == runtime.memcpyDeviceToHost else (dev_ptr, host_ptr)
        runtime.memcpyAsync(dst, src, count * self.row_bytes, kind, self.cupy_stream.ptr)

    def to_host(self, host_rows, host_start: int, offset: int, count: int) -> None:
        self._copy(host_rows, host_start, offset, count, self.cupy.cuda.runtime.memcpyDeviceToHost)

    def to_device(self, host_rows, host_start: int, offset: int, count: int) -> None:
        self._copy(host_rows, host_start, offset, count, self.cupy.cuda.runtime.memcpyHostToDevice)

    def wait_for(self, event) -> None:
        if event is not None:
            self.cupy_stream.wait_event(event)

    def record(self):
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(self.cupy_stream)
        return event


class DeviceTransport(Transport):
    def __init__(self, pool, host: HostKVStore, compute_stream=None, staging_bytes: int = STAGING_BYTES):
        """``pool`` (N, L, 2, B, K, E): a Numba device array (GPU or simulator) or a CuPy array;
        ``compute_stream``: the CuPy stream the model's kernels run on (None: legacy ordering)."""
        from ..backend import get_backend
        from ..kernels import kv_layout

        backend = get_backend()
        self.kv_layout = kv_layout
        if backend.is_simulator:
            self.pool_rows = kv_layout.as_rows(pool)  # (N, W) words
            lane_cls = _SimulatorLane
        else:
            import cupy

            self.pool_rows = backend.cuda.as_cuda_array(kv_layout.as_rows(cupy.asarray(pool)))
            lane_cls = _CudaLane
        self.host_rows = kv_layout.as_rows(host.blocks)  # (H, W) words, pinned on a GPU
        row_words, dtype = self.host_rows.shape[1], self.host_rows.dtype
        super().__init__(row_words * dtype.itemsize)
        self.staging_blocks = max(1, staging_bytes // self.row_bytes)
        self.lanes = {d: lane_cls(backend.cuda, self.staging_blocks, row_words, dtype)
                      for d in (COPY_OUT, COPY_IN)}
        self.compute_stream = compute_stream

    def _start(self, ticket: Ticket, runs) -> None:
        lane = self.lanes[ticket.direction]
        for earlier in ticket.after:
            lane.wait_for(earlier.event)
        if self.compute_stream is not None:
            lane.wait_for(self._record_compute())
        for first in range(0, len(ticket.gpu_blocks), self.staging_blocks):  # staging-sized chunks
            last = min(first + self.staging_blocks, len(ticket.gpu_blocks))
            self._move_chunk(lane, ticket, first, last)
        ticket.event = lane.record()

    def _move_chunk(self, lane, ticket: Ticket, first: int, last: int) -> None:
        """Blocks [first, last) of the ticket through the lane's staging buffer."""
        ids = lane.block_ids(ticket.gpu_blocks[first:last])
        host_runs = [(first + offset, count) for offset, count in
                     consecutive_runs(ticket.host_blocks[first:last])]
        if ticket.direction == COPY_OUT:
            self.kv_layout.gather_blocks(self.pool_rows, ids, lane.staging, lane.stream)
            for start, count in host_runs:
                lane.to_host(self.host_rows, int(ticket.host_blocks[start]), start - first, count)
        else:
            for start, count in host_runs:
                lane.to_device(self.host_rows, int(ticket.host_blocks[start]), start - first, count)
            self.kv_layout.scatter_blocks(lane.staging, ids, self.pool_rows, lane.stream)

    def _record_compute(self):
        import cupy

        event = cupy.cuda.Event(disable_timing=True)
        event.record(self.compute_stream)
        return event

    def _try_land(self, ticket: Ticket) -> bool:
        return ticket.event is None or ticket.event.done

    def wait(self, ticket: Ticket) -> None:
        if ticket.event is not None:
            ticket.event.synchronize()

    def order_compute_after(self, ticket: Ticket) -> bool:
        if ticket.event is None or self.compute_stream is None:
            self.wait(ticket)  # nothing to order against: wait on the host
        else:
            self.compute_stream.wait_event(ticket.event)
        return True
