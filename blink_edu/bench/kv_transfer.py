"""``python -m blink_edu.bench.kv_transfer``: SuperInfer's Table 1 ladder on this machine's link.

SuperInfer §4 (DuplexKV) and docs/design.md §4/§6. KV blocks of Qwen2.5-32B's geometry (64
layers, 8 KV heads, head_dim 128, 16-token blocks, fp16: 32 KiB per (layer, K/V) segment, 64 KiB
per layer, 4 MiB per block) move between GPU memory and pinned host memory, several GiB each way:

1. ``naive``        one ``cudaMemcpyAsync`` per (layer, K/V, block) segment (32 KiB) of a
                    layer-first pool ``(L, 2, N, B, K, E)`` -- how a paged cache is swapped when
                    each layer has its own tensor (vLLM);
   ``naive_layer``  one copy per (layer, block) segment (64 KiB, K and V together: the paper's
                    segment) of a layer-first pool ``(L, N, 2, B, K, E)``;
2. ``merged``       block-first pool ``(N, L, 2, B, K, E)``: one 4 MiB copy per block;
   ``memcpy_batch`` the same per-block copies in one ``cudaMemcpyBatchAsync`` call (cuda-bindings;
                    skipped where the runtime lacks it);
3. ``batched``      DuplexKV's transport (``kv/transfer.py``): blocks gathered by a Numba kernel
                    into a 64 MiB staging buffer, one copy per staging load;
4. ``duplex``       the same transport, copy-out and copy-in at once on their two streams;
5. ``mapped``       the engine's default transport on a GPU (``MappedTransport``): no staging and
                    no memcpy -- one Numba kernel reads and writes the mapped host arena across
                    PCIe; ``mapped_duplex`` both ways at once.

Besides bandwidth, what the *host* pays to issue one ticket (``ticket_issue``: median
microseconds of the ``copy_out`` call alone, staged against mapped, for 1, 16 and 64 blocks whose
host blocks are scattered, one run each): in a server that rotates a dozen requests a step, that
host time, not the link, is what the step feels.

Each is timed end to end on the host (issue to completion, so Python's per-copy cost counts, as
it does in a server), after a warm-up, median of several runs, one way in each direction; GB/s is
``1e9`` bytes per second. The link peak is the best one-way figure of the size sweep (single
copies of 4 KiB to 256 MiB, timed with CUDA events). Finally the rotate-out latency of a long
request (8200 tokens: 512 full blocks and a dirty tail, ~2 GiB) through the rotation engine, with eager rotation (its
full blocks were copied in the background while it decoded: only the dirty tail moves) and
without (everything moves at preemption).

Writes ``kv_transfer.json`` in the results folder (``--out``). On a machine without a GPU it says so and exits 2;
``--tiny`` runs the same code on a tiny geometry (on the CPU: NumPy copies, for the tests).
Memory: a 4 GiB device pool, a 4 GiB pinned host arena, 2 x 64 MiB staging, a 256 MiB sweep
buffer. Runtime on the H200: well under a minute; every section is bounded by ``--budget-s``.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..backend import get_backend  # first: installs the NumPy 2.5 shim before numba loads
from ..kv.block_manager import COPY_IN, COPY_OUT, BlockManager
from ..kv.host_store import HostKVStore
from ..kv.rotation import RotationEngine
from ..kv.transfer import DeviceTransport, MappedTransport, NumpyTransport
from .cli import bench_parser
from .results import print_table, write_results

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# SuperInfer's Table 1 (GH200, NVLink-C2C) and the figures derived from it.
PAPER = {"link": "GH200 NVLink-C2C (paper)", "naive_gbps": 10.0, "merged_gbps": [80.0, 134.0],
         "batched_gbps": [239.0, 270.0], "duplex_gbps": [181.0, 179.0],
         "duplex_ideal_gbps": [192.0, 192.0], "duplex_total_gbps": 360.0,
         "naive_over_duplex_time": 36.0}  # 2 x bytes / 10 GB/s against 2 x bytes / 360 GB/s


@dataclass(frozen=True)
class Geometry:
    layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    itemsize: int = 2  # fp16

    @property
    def segment_bytes(self) -> int:  # one layer's K (or V) of one block
        return self.block_size * self.kv_heads * self.head_dim * self.itemsize

    @property
    def block_bytes(self) -> int:
        return 2 * self.layers * self.segment_bytes

    @property
    def block_shape(self) -> tuple[int, ...]:  # (L, 2, B, K, E)
        return (self.layers, 2, self.block_size, self.kv_heads, self.head_dim)


QWEN25_32B = Geometry(layers=64, kv_heads=8, head_dim=128, block_size=16)
TINY = Geometry(layers=4, kv_heads=2, head_dim=8, block_size=4)


class CupyLink:
    """The GPU: CuPy device arrays, pinned host arrays, raw async copies, non-blocking streams."""

    name = "gpu"

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.runtime = cupy.cuda.runtime

    def device_pool(self, num_blocks: int, g: Geometry):
        return self.cupy.zeros((num_blocks, *g.block_shape), np.float16)  # (N, L, 2, B, K, E)

    def stream(self):
        return self.cupy.cuda.Stream(non_blocking=True)

    @staticmethod
    def pointer(a) -> int:
        return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr

    def plan(self, dst, src, copies: list[tuple[int, int, int]], stream):
        """A function issuing ``copies`` [(dst offset, src offset, bytes)] from ``src`` to ``dst``
        (one host, one device array) on ``stream``: pointers precomputed, so the loop costs
        about what a C++ loop of ``cudaMemcpyAsync`` would."""
        kind = (self.runtime.memcpyDeviceToHost if isinstance(dst, np.ndarray)
                else self.runtime.memcpyHostToDevice)
        dst_ptr, src_ptr, stream_ptr = self.pointer(dst), self.pointer(src), stream.ptr
        calls = [(dst_ptr + d, src_ptr + s, n) for d, s, n in copies]
        memcpy_async = self.runtime.memcpyAsync

        def issue():
            for d, s, n in calls:
                memcpy_async(d, s, n, kind, stream_ptr)

        return issue

    def synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def event_seconds(self, issue, stream) -> float:
        """GPU time of the work ``issue()`` puts on ``stream``, by CUDA events."""
        start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        start.record(stream)
        issue()
        end.record(stream)
        end.synchronize()
        return self.cupy.cuda.get_elapsed_time(start, end) / 1e3

    def transport(self, pool, host):
        return DeviceTransport(pool, host)

    def mapped_transport(self, pool, host):
        return MappedTransport(pool, host)


class NumpyLink:
    """The CPU stand-in for ``--tiny`` without a GPU: NumPy 'device' arrays, synchronous copies."""

    name = "cpu"

    class _Stream:
        def synchronize(self) -> None:
            pass

    def device_pool(self, num_blocks: int, g: Geometry):
        return np.zeros((num_blocks, *g.block_shape), np.float16)

    def stream(self):
        return self._Stream()

    def plan(self, dst, src, copies: list[tuple[int, int, int]], stream):
        dst_bytes, src_bytes = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)

        def issue():
            for d, s, n in copies:
                dst_bytes[d:d + n] = src_bytes[s:s + n]

        return issue

    def synchronize(self) -> None:
        pass

    def event_seconds(self, issue, stream) -> float:
        start = time.perf_counter()
        issue()
        return time.perf_counter() - start

    def transport(self, pool, host):
        return NumpyTransport(pool, host)

    def mapped_transport(self, pool, host):
        return None  # a kernel over mapped host memory needs a GPU


class Bench:
    def __init__(self, link, g: Geometry, num_blocks: int, move_blocks: int, repeats: int,
                 budget_s: float, seed: int = 0):
        self.link, self.g, self.repeats = link, g, repeats
        self.deadline = time.monotonic() + budget_s
        self.pool = link.device_pool(num_blocks, g)  # (N, L, 2, B, K, E) fp16
        self.host = HostKVStore(num_blocks, g.block_shape, np.float16,
                                pinned=link.name == "gpu")  # (H, L, 2, B, K, E)
        self.transport = link.transport(self.pool, self.host)
        self.mapped = link.mapped_transport(self.pool, self.host)
        self.stream = link.stream()
        rng = np.random.default_rng(seed)
        # Scattered GPU blocks (as a paged pool's are) to one contiguous host range, and back.
        self.out_gpu = rng.permutation(num_blocks // 2)[:move_blocks].astype(np.int32)  # (n,)
        self.in_gpu = (num_blocks // 2 + rng.permutation(num_blocks // 2)[:move_blocks]).astype(np.int32)
        self.out_host = np.arange(move_blocks, dtype=np.int32)
        self.in_host = np.arange(num_blocks // 2, num_blocks // 2 + move_blocks, dtype=np.int32)
        self.move_bytes = move_blocks * g.block_bytes

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def wall_seconds(self, issue, streams=()) -> float:
        """Median end-to-end seconds of ``issue()`` until every stream is idle (1 warm-up)."""
        times = []
        for i in range(self.repeats + 1):
            self.link.synchronize()
            start = time.perf_counter()
            issue()
            for s in streams:
                s.synchronize()
            self.link.synchronize()
            if i:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    # --- the ladder ---------------------------------------------------------------------------
    def per_copy(self, copies: list[tuple[int, int, int]], to_host: bool) -> float:
        """Median seconds for ``copies`` [(device offset, host offset, bytes)] on one stream."""
        pool, host = self.pool, self.host.blocks
        if to_host:
            issue = self.link.plan(host, pool, [(h, d, n) for d, h, n in copies], self.stream)
        else:
            issue = self.link.plan(pool, host, copies, self.stream)
        return self.wall_seconds(issue, [self.stream])

    def layer_first_copies(self, gpu, host, split_kv: bool) -> list[tuple[int, int, int]]:
        """The segments of ``gpu`` blocks in a layer-first pool: (L, 2, N, ...) per (layer, K/V)
        when ``split_kv`` (32 KiB each), else (L, N, 2, ...) per layer (64 KiB)."""
        g, N = self.g, self.pool.shape[0]
        parts = 2 * g.layers if split_kv else g.layers
        size = g.block_bytes // parts
        return [((p * N + int(d)) * size, (p * N + int(h)) * size, size)
                for d, h in zip(gpu, host) for p in range(parts)]

    def block_first_copies(self, gpu, host) -> list[tuple[int, int, int]]:
        b = self.g.block_bytes
        return [(int(d) * b, int(h) * b, b) for d, h in zip(gpu, host)]

    def memcpy_batch(self, to_host: bool) -> float:
        """The per-block copies as one cudaMemcpyBatchAsync call (CUDA >= 12.8 runtime)."""
        if self.link.name != "gpu":
            raise RuntimeError("cudaMemcpyBatchAsync needs a GPU")
        from cuda.bindings import runtime as rt

        attr = rt.cudaMemcpyAttributes()
        attr.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        dev, host = self.link.pointer(self.pool), self.link.pointer(self.host.blocks)
        copies = self.block_first_copies(self.out_gpu, self.out_host)
        dsts = [(host + h) if to_host else (dev + d) for d, h, _ in copies]
        srcs = [(dev + d) if to_host else (host + h) for d, h, _ in copies]
        sizes = [n for _, _, n in copies]

        def issue():
            err = rt.cudaMemcpyBatchAsync(dsts, srcs, sizes, len(sizes), [attr], [0], 1,
                                          self.stream.ptr)[0]
            if err != rt.cudaError_t.cudaSuccess:
                raise RuntimeError(f"cudaMemcpyBatchAsync: {err}")

        return self.wall_seconds(issue, [self.stream])

    def transport_seconds(self, directions: tuple[int, ...], t) -> float:
        """A transport (``self.transport``: DuplexKV's staged one, or ``self.mapped``): one
        batched ticket per direction, issued together."""
        if t is None:
            raise RuntimeError("MappedTransport needs a GPU")

        def issue():
            tickets = [t.copy_out(self.out_gpu, self.out_host) if d == COPY_OUT
                       else t.copy_in(self.in_host, self.in_gpu) for d in directions]
            for ticket in tickets:
                t.wait(ticket)
            t.poll()

        return self.wall_seconds(issue)

    def ticket_issue(self, counts=(1, 16, 64)) -> list[dict]:
        """Host microseconds of one ``copy_out`` call (issue only, median), staged and mapped,
        for ``counts`` blocks whose host blocks are every other one (a run each)."""
        rows = []
        for name, t in (("staged", self.transport), ("mapped", self.mapped)):
            for n in counts:
                n = min(n, len(self.out_gpu))
                row = {"transport": name, "blocks": n}
                if t is None or self.time_left() <= 0:
                    row["error"] = "needs a GPU" if t is None else "skipped: time budget spent"
                    rows.append(row)
                    continue
                gpu, host = self.out_gpu[:n], np.arange(0, 2 * n, 2, dtype=np.int32)
                times = []
                for i in range(2 * self.repeats + 1):
                    self.link.synchronize()
                    start = time.perf_counter()
                    ticket = t.copy_out(gpu, host)
                    if i:
                        times.append(time.perf_counter() - start)
                    t.wait(ticket)
                    t.poll()
                row["issue_us"] = statistics.median(times) * 1e6
                print(f"  {name:>7} ticket of {n:3d} blocks: {row['issue_us']:8.1f} us of host time",
                      flush=True)
                rows.append(row)
        return rows

    def ladder(self) -> list[dict]:
        rows = []
        variants = [
            ("naive", lambda d: self.per_copy(self.layer_first_copies(*self._ids(d), True), d == COPY_OUT),
             lambda: 2 * self.g.layers),
            ("naive_layer", lambda d: self.per_copy(self.layer_first_copies(*self._ids(d), False),
                                                    d == COPY_OUT), lambda: self.g.layers),
            ("merged", lambda d: self.per_copy(self.block_first_copies(*self._ids(d)), d == COPY_OUT),
             lambda: 1),
            ("memcpy_batch", lambda d: self.memcpy_batch(d == COPY_OUT), lambda: 1),
            ("batched", lambda d: self.transport_seconds((d,), self.transport), lambda: 1),
        ]
        for name, seconds, copies_per_block in variants:
            for direction, label in ((COPY_OUT, "out (D2H)"), (COPY_IN, "in (H2D)")):
                rows.append(self._row(name, label, lambda: seconds(direction), self.move_bytes,
                                      copies_per_block()))
        rows.append(self._row("duplex", "both at once",
                              lambda: self.transport_seconds((COPY_OUT, COPY_IN), self.transport),
                              2 * self.move_bytes, 1))
        for direction, label in ((COPY_OUT, "out (D2H)"), (COPY_IN, "in (H2D)")):
            rows.append(self._row("mapped", label,
                                  lambda: self.transport_seconds((direction,), self.mapped),
                                  self.move_bytes, 1))
        rows.append(self._row("mapped_duplex", "both at once",
                              lambda: self.transport_seconds((COPY_OUT, COPY_IN), self.mapped),
                              2 * self.move_bytes, 1))
        return rows

    def _ids(self, direction: int):
        return (self.out_gpu, self.out_host) if direction == COPY_OUT else (self.in_gpu, self.in_host)

    def _row(self, variant: str, direction: str, measure, nbytes: int, copies_per_block: int) -> dict:
        row = {"variant": variant, "direction": direction, "bytes": nbytes,
               "copy_bytes": self.g.block_bytes // copies_per_block}
        if self.time_left() <= 0:
            row["error"] = "skipped: time budget spent"
            return row
        try:
            seconds = measure()
            row.update(seconds=seconds, gbps=nbytes / seconds / 1e9)
        except Exception as err:  # noqa: BLE001 - one variant failing must not hide the others
            row["error"] = f"{type(err).__name__}: {err}"
        print(f"  {variant:>12} {direction:>12}: "
              + (f"{row['gbps']:7.2f} GB/s  {row['seconds'] * 1e3:8.2f} ms" if "gbps" in row
                 else row["error"]), flush=True)
        return row

    # --- the link itself: one way and both ways, over 1..k streams per direction --------------
    def raw_link(self, directions: tuple[int, ...], streams_per_direction: int,
                 chunk: int = 64 * MiB) -> float:
        """Wall seconds to move ``move_bytes`` each way in ``directions`` as plain contiguous
        copies of ``chunk`` bytes, dealt round-robin over ``streams_per_direction`` streams per
        direction: the link's own ceiling, with no layout kernel and no scattered blocks."""
        half = self.pool.nbytes // 2
        dev = self.pool.reshape(-1).view(np.uint8)
        host = self.host.blocks.reshape(-1).view(np.uint8)
        issues, streams = [], []
        for direction in directions:
            base = 0 if direction == COPY_OUT else half  # the two ways never touch the same bytes
            lanes = [self.link.stream() for _ in range(streams_per_direction)]
            plans = [[] for _ in lanes]
            for i, start in enumerate(range(0, self.move_bytes, chunk)):
                n = min(chunk, self.move_bytes - start)
                plans[i % len(lanes)].append((base + start, base + start, n))
            for lane, copies in zip(lanes, plans):
                issues.append(self.link.plan(host, dev, copies, lane) if direction == COPY_OUT
                              else self.link.plan(dev, host, copies, lane))
            streams += lanes

        def issue():  # interleaved: every stream gets its first copy before any gets a second
            for f in issues:
                f()

        return self.wall_seconds(issue, streams)

    def link_rows(self, stream_counts=(1, 2, 4)) -> list[dict]:
        rows = []
        for k in stream_counts:
            for directions, label in (((COPY_OUT,), "out (D2H)"), ((COPY_IN,), "in (H2D)"),
                                      ((COPY_OUT, COPY_IN), "both at once")):
                row = self._row(f"raw_x{k}", label, lambda: self.raw_link(directions, k),
                                len(directions) * self.move_bytes, 1)
                row["streams_per_direction"] = k
                rows.append(row)
        return rows

    # --- bandwidth against copy size ----------------------------------------------------------
    def size_sweep(self, sizes: list[int]) -> list[dict]:
        """One copy of each size, repeated back to back (enough to time), each way."""
        rows = []
        sizes = [s for s in sizes if s <= self.pool.nbytes]
        buffer_bytes = max(sizes)
        dev = self.pool.reshape(-1).view(np.uint8)[:buffer_bytes]
        host = self.host.blocks.reshape(-1).view(np.uint8)[:buffer_bytes]
        for size in sizes:
            reps = int(min(256, max(4, (64 * MiB) // size)))
            for to_host, label in ((True, "out (D2H)"), (False, "in (H2D)")):
                if self.time_left() <= 0:
                    rows.append({"size": size, "direction": label, "error": "skipped: time budget spent"})
                    continue
                try:
                    dst, src = (host, dev) if to_host else (dev, host)
                    issue = self.link.plan(dst, src, [(0, 0, size)] * reps, self.stream)
                    times = [self.link.event_seconds(issue, self.stream) / reps
                             for _ in range(self.repeats + 1)][1:]
                    seconds = statistics.median(times)
                    rows.append({"size": size, "direction": label, "seconds": seconds,
                                 "gbps": size / seconds / 1e9})
                except Exception as err:  # noqa: BLE001
                    rows.append({"size": size, "direction": label, "error": f"{type(err).__name__}: {err}"})
        return rows

    # --- rotate-out latency of a long request --------------------------------------------------
    def rotate_out(self, num_tokens: int, eager: bool) -> dict:
        """Decode a ``num_tokens`` request block by block through the rotation engine (eager:
        its full blocks are copied out in the background meanwhile), then time its rotate-out
        until the copy has landed."""
        row = {"eager": eager, "num_tokens": num_tokens}
        if self.time_left() <= 0:
            row["error"] = "skipped: time budget spent"
            return row
        try:
            blocks = BlockManager(self.pool.shape[0], self.g.block_size)
            engine = RotationEngine(blocks, self.host, self.transport, eager=eager)
            B, seq = self.g.block_size, 0
            for upto in list(range(B, num_tokens, B)) + [num_tokens]:  # the request grows
                written = blocks.num_tokens.get(seq, 0)
                blocks.grow(seq, upto)
                blocks.mark_written(seq, upto)
                engine.on_written(seq, written, upto)
                engine.flush()
            engine.wait_all()  # its background copies had a whole decode to finish
            self.link.synchronize()
            start = time.perf_counter()
            moved = engine.rotate_out(seq)
            engine.wait_all()
            row.update(seconds=time.perf_counter() - start, blocks_moved=moved,
                       blocks_total=-(-num_tokens // B), bytes_moved=moved * self.g.block_bytes)
            engine.forget(seq)
            engine.check()
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {err}"
        print(f"  rotate-out, eager={eager!s:5}: " + (
            f"{row['seconds'] * 1e3:8.3f} ms, {row['blocks_moved']} of {row['blocks_total']} blocks "
            f"moved" if "seconds" in row else row["error"]), flush=True)
        return row


def _best(rows: list[dict], direction: str, **match) -> float | None:
    found = [r["gbps"] for r in rows if r.get("direction") == direction and "gbps" in r
             and all(r.get(k) == v for k, v in match.items())]
    return max(found) if found else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def summarize(ladder: list[dict], sweep: list[dict], rotations: list[dict],
              link_rows: list[dict] = ()) -> dict:
    out, into = "out (D2H)", "in (H2D)"
    raw_both = max((r["gbps"] for r in link_rows if r["direction"] == "both at once" and "gbps" in r),
                   default=None)
    peak_out, peak_in = _best(sweep, out), _best(sweep, into)
    gbps = {(r["variant"], r["direction"]): r.get("gbps") for r in ladder}
    seconds = {(r["variant"], r["direction"]): r.get("seconds") for r in ladder}
    naive_both = (None if None in (seconds.get(("naive", out)), seconds.get(("naive", into)))
                  else seconds[("naive", out)] + seconds[("naive", into)])
    by_eager = {r["eager"]: r for r in rotations}
    summary = {
        "naive_gbps": gbps.get(("naive", out)), "naive_layer_gbps": gbps.get(("naive_layer", out)),
        "merged_gbps": gbps.get(("merged", out)), "memcpy_batch_gbps": gbps.get(("memcpy_batch", out)),
        "batched_gbps": gbps.get(("batched", out)), "batched_in_gbps": gbps.get(("batched", into)),
        "duplex_total_gbps": gbps.get(("duplex", "both at once")),
        "mapped_gbps": gbps.get(("mapped", out)), "mapped_in_gbps": gbps.get(("mapped", into)),
        "mapped_duplex_total_gbps": gbps.get(("mapped_duplex", "both at once")),
        "link_peak_gbps": peak_out, "link_peak_in_gbps": peak_in,
        # the most both directions at once ever moved here, as plain copies (the duplex ceiling)
        "link_duplex_peak_gbps": raw_both, "link_duplex_over_one_way_peak": _ratio(raw_both, peak_out),
        "batched_fraction_of_peak": _ratio(gbps.get(("batched", out)), peak_out),
        "duplex_over_batched": _ratio(gbps.get(("duplex", "both at once")), gbps.get(("batched", out))),
        "naive_over_duplex_time": _ratio(naive_both, seconds.get(("duplex", "both at once"))),
        "rotate_out_ms_eager": _ms(by_eager.get(True)), "rotate_out_ms_no_eager": _ms(by_eager.get(False)),
        "rotate_out_blocks_eager": by_eager.get(True, {}).get("blocks_moved"),
        "rotate_out_blocks_no_eager": by_eager.get(False, {}).get("blocks_moved"),
        "paper": PAPER,
    }
    summary["acceptance"] = {
        "batched_at_least_90pct_of_peak": _at_least(summary["batched_fraction_of_peak"], 0.9),
        "duplex_at_least_1.6x_batched": _at_least(summary["duplex_over_batched"], 1.6),
        "eager_rotate_out_moves_at_most_one_block": (None if summary["rotate_out_blocks_eager"] is None
                                                     else summary["rotate_out_blocks_eager"] <= 1),
    }
    return summary


def _ms(row):
    return None if not row or "seconds" not in row else row["seconds"] * 1e3


def _at_least(value, bound):
    return None if value is None else bool(value >= bound)


def main(argv=None) -> int:
    parser = bench_parser("kv_transfer", __doc__)
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny geometry (runs on a CPU too: the tests' smoke mode)")
    parser.add_argument("--gib", type=float, default=2.0, help="GiB moved each way")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each copy")
    parser.add_argument("--budget-s", type=float, default=150.0, help="stop measuring after this")
    parser.add_argument("--rotate-tokens", type=int, default=8200,
                        help="the long request: 8200 tokens = 512 full blocks + a dirty tail")
    args = parser.parse_args(argv)

    backend = get_backend()
    if backend.is_simulator and not args.tiny:
        print("blink_edu.bench.kv_transfer measures the GPU <-> host link and needs a CUDA GPU; "
              "this machine has none (Numba's simulator would time Python, not PCIe). "
              "Run it on the GPU machine, or pass --tiny for a CPU smoke run.", file=sys.stderr)
        return 2
    link = NumpyLink() if backend.is_simulator else CupyLink()
    g = TINY if args.tiny else QWEN25_32B
    move_blocks = 16 if args.tiny else max(1, int(args.gib * GiB) // g.block_bytes)
    num_blocks = 2 * move_blocks
    rotate_tokens = 5 * g.block_size + 3 if args.tiny else args.rotate_tokens
    sizes = [4 * KiB * 4 ** i for i in range(4 if args.tiny else 9)]  # 4 KiB .. 256 MiB
    started = time.monotonic()
    print(f"kv_transfer on {backend.device_name}: block {g.block_bytes / MiB:g} MiB "
          f"({2 * g.layers} segments of {g.segment_bytes / KiB:g} KiB), {move_blocks} blocks "
          f"= {move_blocks * g.block_bytes / GiB:.2f} GiB each way, {args.repeats} repeats",
          flush=True)
    bench = Bench(link, g, num_blocks, move_blocks, args.repeats, args.budget_s)
    print("ladder:", flush=True)
    ladder = bench.ladder()
    print("the link, raw copies over 1, 2 and 4 streams a way:", flush=True)
    link_rows = bench.link_rows()
    print("host time to issue one ticket:", flush=True)
    tickets = bench.ticket_issue()
    print("bandwidth against copy size:", flush=True)
    sweep = bench.size_sweep(sizes)
    print("rotate-out of a long request:", flush=True)
    rotations = [bench.rotate_out(rotate_tokens, eager) for eager in (True, False)]
    summary = summarize(ladder, sweep, rotations, link_rows)
    peak = summary["link_peak_gbps"]
    for row in ladder:
        both = row["direction"] == "both at once"
        row["fraction_of_peak"] = _ratio(row.get("gbps"), peak * (2 if both else 1) if peak else None)
    print()
    print_table(ladder, ["variant", "direction", "copy_bytes", "gbps", "fraction_of_peak", "seconds", "error"])
    print()
    print_table(sweep, ["size", "direction", "gbps", "seconds", "error"])
    print()
    for key in ("naive_gbps", "batched_gbps", "duplex_total_gbps", "link_peak_gbps",
                "link_duplex_peak_gbps", "link_duplex_over_one_way_peak",
                "batched_fraction_of_peak", "duplex_over_batched", "naive_over_duplex_time",
                "mapped_gbps", "mapped_in_gbps", "mapped_duplex_total_gbps",
                "rotate_out_ms_eager", "rotate_out_ms_no_eager", "rotate_out_blocks_eager",
                "rotate_out_blocks_no_eager"):
        print(f"{key:>28}: {summary[key]}")
    print(f"{'acceptance':>28}: {summary['acceptance']}")
    print(f"{'paper (GH200)':>28}: naive {PAPER['naive_gbps']}, batched {PAPER['batched_gbps']}, "
          f"duplex {PAPER['duplex_gbps']}, naive/duplex time ~{PAPER['naive_over_duplex_time']}")
    config = {"geometry": asdict(g), "block_bytes": g.block_bytes, "move_blocks": move_blocks,
              "pool_blocks": num_blocks, "repeats": args.repeats, "tiny": args.tiny,
              "staging_bytes": getattr(bench.transport, "staging_blocks", 0) * g.block_bytes,
              "rotate_tokens": rotate_tokens, "link": link.name,
              "wall_seconds": time.monotonic() - started}
    print_table(link_rows, ["variant", "direction", "gbps", "seconds", "error"])
    print()
    print_table(tickets, ["transport", "blocks", "issue_us", "error"])
    print()
    path = write_results("kv_transfer", config, {"ladder": ladder, "link": link_rows, "size_sweep": sweep,
                                                 "rotate_out": rotations, "ticket_issue": tickets},
                         summary, args.out)
    print(f"wrote {path} ({time.monotonic() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
