"""Copy engines: moving KV blocks between the GPU pool and the host arena, in batches.

SuperInfer §4 (DuplexKV: layout transformation + batched transfer, full duplex) and docs/design.md §6.
The rotation engine (``rotation.py``) decides *which* blocks move; a transport moves them. All
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
  With ``plan=`` a function of yours cuts each ticket into copies (``Transport`` says how): Lab 4
  plugs its ``plan_batched_copy`` in there.
* ``DeviceTransport`` — the kernel executors' pool is a device array. Each direction is a *lane*:
  its own non-blocking stream, a device staging buffer (>= 8 MiB by default), the gather/scatter
  kernel of ``kernels/kv_layout.py`` and one ``cudaMemcpyAsync`` per host run; an event marks the
  end of each ticket. Copy-outs and copy-ins run on different streams, so they overlap each
  other (full duplex) and the model's kernels. A lane first waits for the compute stream (the
  kernels that wrote a block must finish before it is copied out; a freed block must not be
  refilled while a kernel may still read it), and ``order_compute_after`` makes the compute stream
  wait for a copy-in before any kernel reads its blocks. In the simulator the same calls run
  synchronously: every copy has landed when it returns.
* ``MappedTransport`` — the same lanes and ordering, but no staging and no memcpy: the pinned
  host arena is mapped into the GPU's address space, and ONE kernel per ticket copies pool rows
  to host rows (or back) across PCIe, reading the ticket's block ids from mapped memory. Its
  launch is a CUDA graph captured once per id slot, so a ticket costs the host tens of
  microseconds, not the staged path's milliseconds, whatever the layout of its host blocks:
  what a step that rotates several requests needs (``bench.slo --real``). The engine's default on a GPU; ``DeviceTransport``
  moves large batches at higher bandwidth (``bench.kv_transfer`` measures both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .block_manager import COPY_IN, COPY_OUT
from .host_store import HostKVStore, consecutive_runs, mapped_host_array

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
    """What all transports share: the tickets in flight, in issue order, and their landing.

    The extension point is ``plan``, a constructor argument (``NumpyTransport`` takes it; the GPU
    transports cut their own copies): a function that decides which copies a ticket issues, as
    Lab 4's ``plan_batched_copy`` does. It is called once per ticket, when ``copy_out`` or
    ``copy_in`` issues it, as ``plan(gpu_blocks, host_blocks)``: two (n,) int32 arrays that pair
    GPU block ``gpu_blocks[i]`` with host block ``host_blocks[i]``. It must return the copies,
    ``[(first_host_block, [gpu blocks]), ...]``, where ``(h, [g0, g1, ...])`` is ONE copy between
    GPU blocks g0, g1, ... and host blocks h, h+1, ...; together they name every pair exactly
    once. The ticket then holds the pairs in the plan's order and one ``copy_sizes`` entry per
    copy. Without a plan (``None``) the pairs are sorted by host block and cut into runs of
    consecutive host blocks.
    """

    def __init__(self, row_bytes: int, plan=None):
        self.row_bytes = row_bytes  # bytes per block
        self.plan = plan
        self.in_flight: list[Ticket] = []

    def copy_out(self, gpu_blocks, host_blocks, after=()) -> Ticket:
        return self._issue(COPY_OUT, gpu_blocks, host_blocks, after)

    def copy_in(self, host_blocks, gpu_blocks, after=()) -> Ticket:
        return self._issue(COPY_IN, gpu_blocks, host_blocks, after)

    def _issue(self, direction, gpu_blocks, host_blocks, after) -> Ticket:
        gpu, host, runs = self._pairs_and_runs(gpu_blocks, host_blocks)
        ticket = Ticket(direction, gpu, host, nbytes=len(gpu) * self.row_bytes,
                        copy_sizes=self._copy_sizes(runs), after=[t for t in after if not t.landed])
        self._start(ticket, runs)
        self.in_flight.append(ticket)
        return ticket

    def _pairs_and_runs(self, gpu_blocks, host_blocks):
        """A ticket's (gpu, host) pairs in copy order, (n,) int32 each, and its runs
        ``[(offset into the pairs, count)]``: the plan's, or (no plan) sorted by host block."""
        gpu, host = np.asarray(gpu_blocks, np.int32), np.asarray(host_blocks, np.int32)  # (n,)
        if self.plan is not None:
            planned_gpu, planned_host, runs = pairs_of_plan(self.plan(gpu, host))
            check_plan_names_every_pair(gpu, host, planned_gpu, planned_host)
            return planned_gpu, planned_host, runs
        order = np.argsort(host, kind="stable")
        gpu, host = gpu[order], host[order]
        return gpu, host, consecutive_runs(host)

    def _copy_sizes(self, runs: list[tuple[int, int]]) -> list[int]:
        """Bytes of each copy a ticket issues: one per run of consecutive host blocks."""
        return [count * self.row_bytes for _, count in runs]

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


def pairs_of_plan(plan) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """A plan's (gpu, host) pairs in its order, (n,) int32 each, and its copies as runs
    ``[(offset into the pairs, count)]``."""
    gpu = np.array([g for _, run in plan for g in run], np.int32)
    host = np.array([h0 + k for h0, run in plan for k in range(len(run))], np.int32)
    offsets = np.cumsum([0] + [len(run) for _, run in plan])
    return gpu, host, [(int(offset), len(run)) for offset, (_, run) in zip(offsets, plan)]


def check_plan_names_every_pair(gpu, host, planned_gpu, planned_host) -> None:
    """A plan must name each (gpu, host) pair of its ticket exactly once: a missing, extra or
    repeated pair would move the wrong bytes, so it is refused before anything moves."""
    asked = sorted(zip(gpu.tolist(), host.tolist()))
    planned = sorted(zip(planned_gpu.tolist(), planned_host.tolist()))
    if planned != asked:
        missing = sorted(set(asked) - set(planned))[:4]
        extra = sorted(set(planned) - set(asked))[:4]
        raise ValueError(f"the transport's plan must name every (gpu, host) block pair of the "
                         f"ticket exactly once: asked {len(asked)} pairs, planned {len(planned)}; "
                         f"missing {missing}, not asked {extra} (first few)")


class NumpyTransport(Transport):
    def __init__(self, pool: np.ndarray, host: HostKVStore, delay: int = 0, plan=None):
        """``pool`` (N, L, 2, B, K, E) NumPy; ``delay``: ticks before a copy lands (0: at once);
        ``plan``: cuts each ticket into copies (see ``Transport``; None: runs of host blocks)."""
        if not (pool.flags.c_contiguous and host.blocks.flags.c_contiguous):
            raise ValueError("the pool and the host arena must be C-contiguous (copies go through views)")
        self.pool_rows = pool.reshape(pool.shape[0], -1)  # (N, W) view
        self.host_rows = host.blocks.reshape(host.num_blocks, -1)  # (H, W) view
        super().__init__(self.pool_rows.shape[1] * self.pool_rows.dtype.itemsize, plan)
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
        if staging_blocks:
            self.staging = cuda.device_array((staging_blocks, row_words), dtype)  # (S, W)
        self.stream = 0
        self.cupy_stream = None

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
        self.row_bytes = row_words * np.dtype(dtype).itemsize
        if staging_blocks:  # the staged transport's; the mapped one needs none
            self._staging = cupy.empty((staging_blocks, row_words), dtype)  # (S, W)
            self.staging = cuda.as_cuda_array(self._staging)  # converted once: cheap launches
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


class _StreamTransport(Transport):
    """What the two GPU transports share: the pool as rows, one lane (stream) per direction,
    ordering against the compute stream, and landing by events."""

    def __init__(self, pool, host: HostKVStore, compute_stream, staging_blocks: int):
        from ..backend import get_backend
        from ..kernels import kv_layout

        self.backend = backend = get_backend()
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
        self.lanes = {d: lane_cls(backend.cuda, staging_blocks, row_words, dtype)
                      for d in (COPY_OUT, COPY_IN)}
        self.compute_stream = compute_stream
        self._compute_event = None  # created at the first copy (GPU only)

    def _order_lane(self, lane, ticket: Ticket) -> None:
        """The lane waits for the tickets ``ticket`` comes after and for the compute stream."""
        for earlier in ticket.after:
            lane.wait_for(earlier.event)
        if self.compute_stream is not None:
            lane.wait_for(self._record_compute())

    def _record_compute(self):
        """An event at the compute stream's current end. One event, recorded again each time: a
        lane's ``wait_event`` waits for the record made just before it, whatever comes later."""
        if self._compute_event is None:
            import cupy

            self._compute_event = cupy.cuda.Event(disable_timing=True)
        self._compute_event.record(self.compute_stream)
        return self._compute_event

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


class DeviceTransport(_StreamTransport):
    """Staged: gather into a device staging buffer, one ``cudaMemcpyAsync`` per host run."""

    def __init__(self, pool, host: HostKVStore, compute_stream=None, staging_bytes: int = STAGING_BYTES):
        """``pool`` (N, L, 2, B, K, E): a Numba device array (GPU or simulator) or a CuPy array;
        ``compute_stream``: the CuPy stream the model's kernels run on (None: legacy ordering)."""
        row_bytes = host.blocks[0].nbytes
        self.staging_blocks = max(1, staging_bytes // row_bytes)
        super().__init__(pool, host, compute_stream, self.staging_blocks)

    def _start(self, ticket: Ticket, runs) -> None:
        lane = self.lanes[ticket.direction]
        self._order_lane(lane, ticket)
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


@dataclass(eq=False)
class _IdSlot:
    """One ticket's block ids in mapped host memory, which the copy kernel reads when it runs:
    ``count`` (1,), ``src`` and ``dst`` (M,) int32 rows -- NumPy on the host, ``*_dev`` the
    kernel's view of the same bytes. ``graph``: the slot's launch, captured once (GPU only)."""

    count: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    count_dev: object
    src_dev: object
    dst_dev: object
    ticket: Ticket | None = None  # the last ticket that used this slot
    graph: object = None


class MappedTransport(_StreamTransport):
    """Zero-copy: the pinned host arena is mapped into the GPU's address space, so ONE kernel
    moves a ticket's blocks straight between pool rows and host rows -- no staging buffer, no
    memcpy, the same cost whatever the host runs. Issuing a ticket is a few NumPy stores of its
    block ids into a slot of mapped memory and one launch of a CUDA graph captured once per slot:
    14 / 24 / 53 us of host time for 1 / 16 / 64 blocks on the H200 machine, where the staged
    transport's block-id upload, kernel launch and one ``cudaMemcpyAsync`` per host run cost
    0.29 / 0.76 / 1.4 ms (``bench.kv_transfer``'s ``ticket_issue``). The price is bandwidth: the
    kernel's loads and stores cross PCIe as small transactions, not as the copy engines' DMA
    bursts -- 35 GB/s out and 45 in against the staged path's 52 (4 MiB blocks, 2 GiB)."""

    SLOTS = 4  # id slots per direction: a slot is reused once its last ticket has landed

    def __init__(self, pool, host: HostKVStore, compute_stream=None):
        super().__init__(pool, host, compute_stream, staging_blocks=0)
        if self.backend.is_simulator:
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

            host_view = FakeCUDAArray(self.host_rows)
        elif host.device_blocks is None:
            raise ValueError("MappedTransport needs a pinned (mapped) host arena: "
                             "HostKVStore(..., pinned=True)")
        else:
            host_view = self.kv_layout.as_rows(host.device_blocks)  # (H, W) the GPU's view
        # (source rows, destination rows) of each direction's kernel
        self.ends = {COPY_OUT: (self.pool_rows, host_view), COPY_IN: (host_view, self.pool_rows)}
        self.max_blocks = self.pool_rows.shape[0]  # a ticket names each GPU block at most once
        self.slots = {d: [self._slot(d) for _ in range(self.SLOTS)] for d in (COPY_OUT, COPY_IN)}
        self.next_slot = {COPY_OUT: 0, COPY_IN: 0}

    def _copy_sizes(self, runs) -> list[int]:
        return [sum(count for _, count in runs) * self.row_bytes] if runs else []

    def _slot(self, direction: int) -> _IdSlot:
        arrays = [mapped_host_array(shape, np.int32) for shape in (1, self.max_blocks, self.max_blocks)]
        slot = _IdSlot(*(a for a, _ in arrays), *(v for _, v in arrays))
        if not self.backend.is_simulator:
            slot.graph = self._capture(direction, slot)
        return slot

    def _kernel(self, direction: int, num_rows: int):
        """The copy kernel, configured for ``num_rows`` rows on the direction's lane."""
        lane = self.lanes[direction]
        grid = self.kv_layout.grid_for_rows(num_rows, self.pool_rows.shape[1])
        return self.kv_layout.move_counted_rows_kernel[grid, self.kv_layout.THREADS, lane.stream]

    def _launch_args(self, direction: int, slot: _IdSlot) -> tuple:
        src, dst = self.ends[direction]
        return src, dst, slot.src_dev, slot.dst_dev, slot.count_dev

    def _capture(self, direction: int, slot: _IdSlot):
        """One graph per slot: the kernel reads the count and ids from the slot when it runs."""
        kernel = self._kernel(direction, self.max_blocks)
        args = self._launch_args(direction, slot)
        stream = self.lanes[direction].cupy_stream
        kernel(*args)  # count is 0: compiles the kernel outside the capture, moves nothing
        stream.synchronize()
        stream.begin_capture()
        kernel(*args)
        return stream.end_capture()

    def _start(self, ticket: Ticket, runs) -> None:
        direction = ticket.direction
        lane = self.lanes[direction]
        slot = self._take_slot(direction)
        self._order_lane(lane, ticket)
        n = len(ticket.gpu_blocks)
        gpu_rows, host_rows = ticket.gpu_blocks, ticket.host_blocks
        slot.src[:n], slot.dst[:n] = ((gpu_rows, host_rows) if direction == COPY_OUT
                                      else (host_rows, gpu_rows))
        slot.count[0] = n
        if slot.graph is not None:
            slot.graph.launch(lane.cupy_stream)
        else:  # the simulator: launch it directly, with as many CUDA blocks as rows
            self._kernel(direction, n)(*self._launch_args(direction, slot))
        ticket.event = lane.record()
        slot.ticket = ticket

    def _take_slot(self, direction: int) -> _IdSlot:
        """The direction's next id slot, once the kernel of the ticket that last used it is done
        reading it (it almost always is: a lane runs SLOTS tickets behind)."""
        k = self.next_slot[direction]
        self.next_slot[direction] = (k + 1) % self.SLOTS
        slot = self.slots[direction][k]
        if slot.ticket is not None and not slot.ticket.landed:
            self.wait(slot.ticket)
        return slot
