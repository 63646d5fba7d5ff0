"""``python -m blink_edu.bench.persistent``: the host out of the loop, measured (GPU only).

Blink §5 (CPU interference) and §7; docs/design.md §9 (making the experiments fair). One run:

1. **scan** — the persistent kernel's time to scan a 4096-slot ring (from its doorbell snapshot to
   the end of the grid barrier after the scan, read from the kernel's own counters);
2. **submit-to-claim** — ``claim_ns - arrival_ns`` of single requests (median, P99);
3. **TTFT and TPOT** at batch 1, 8 and 64 for the eager and graph executors and the persistent
   kernel with both dispatchers (``persistent``: inline; ``persistent-graph``: a forward graph
   launched from the GPU each step, ``executors/graph_dispatch.py``), all fed
   through the same ring by the same frontend (this process's main thread), timestamps written by
   the engine (the GPU clock for the persistent kernel, lined up with the host's);
4. the same under a **CPU hog**: one busy process per core on every core but the frontend's (where
   the eager and graph host loops live too, as the paper's baselines do), bounded in time and
   stopped by the benchmark; each executor's TPOT inflation;
5. the **SIGSTOP demonstration**: the engine process (persistent executor, as ``serve`` runs it) is
   stopped with SIGSTOP mid-run while this process keeps submitting; every request completes.

Writes ``persistent.json`` in the results folder (``--out``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import threading
import time
from dataclasses import replace

import numpy as np

from ..config import EngineConfig, SamplingParams
from ..kernels.reduce import THREADS, cuda
from ..kernels.sync import load_acquire
from ..ring.layout import PREFILL_PENDING
from ..model.bundled import resolve_model_dir
from ..model.weights import load_weights
from ..ring import Ring, RingClient, RingLayout
from .cli import bench_parser
from .hog import CpuHog
from .results import print_table, write_results

LAYOUT = RingLayout(num_slots=4096, max_prompt_tokens=256, max_output_tokens=256)


def percentile(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


# --- the executors, each serving a ring -----------------------------------------------------------
class HostLoop:
    """eager / graph: ``RingEngineLoop`` over ``LLMEngine`` in a host thread (pinned to ``cpus``)."""

    def __init__(self, name, weights, engine_config, ring, eos, cpus):
        from ..engine.llm_engine import LLMEngine
        from ..engine.ring_loop import RingEngineLoop

        self.name = name
        self.loop = RingEngineLoop(ring, LLMEngine(weights, engine_config, eos_token_ids=eos),
                                   idle_sleep_s=0)
        self.cpus, self.stop_event = cpus, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        os.sched_setaffinity(threading.get_native_id(), self.cpus)
        self.loop.run(self.stop_event)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stop_event.set()
        self.thread.join()


class Persistent:
    """The persistent kernel; ``name`` "persistent" (inline dispatch, one block per SM),
    "persistent@N" (inline, N blocks) or "persistent-graph" (device-graph dispatch)."""

    def __init__(self, name, weights, engine_config, ring, eos):
        from ..executors.persistent import PersistentExecutor
        from ..engine.llm_engine import kernel_weight_dtype

        self.name = name
        grid_blocks = int(name.split("@")[1]) if "@" in name else None
        self.executor = PersistentExecutor(weights, engine_config, ring, eos_token_ids=eos,
                                           weight_dtype=kernel_weight_dtype(weights, engine_config),
                                           grid_blocks=grid_blocks,
                                           dispatch="graph" if name == "persistent-graph" else "inline")

    def start(self):
        self.executor.start()

    def stop(self):
        self.executor.stop()


# --- workloads ------------------------------------------------------------------------------------
def run_batch(client: RingClient, batch: int, prompt_len: int, max_tokens: int, rng,
              timeout_s: float = 120) -> list[dict]:
    """Submit ``batch`` requests at once, wait for all; per-request timings from the ring."""
    ring = client.ring
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    slots = [client.submit(rng.integers(3, 4000, size=prompt_len).tolist(), params, request_id=i)
             for i in range(batch)]
    deadline = time.monotonic() + timeout_s
    rows, pending = [], set(slots)
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} of {batch} requests unfinished")
        for slot in list(pending):
            _, finished, reason = client.poll(slot, 0)
            if finished:
                n = int(ring.generated[slot])
                first, last = int(ring.first_token_ns[slot]), int(ring.last_token_ns[slot])
                rows.append(dict(ttft_us=(first - int(ring.arrival_ns[slot])) / 1e3,
                                 tpot_us=(last - first) / 1e3 / max(1, n - 1),
                                 claim_us=(int(ring.claim_ns[slot]) - int(ring.arrival_ns[slot])) / 1e3,
                                 tokens=n, reason=reason))
                client.release(slot)
                pending.discard(slot)
        time.sleep(20e-6)
    return rows


def phase_split(before: dict, after: dict) -> dict:
    """Mean GPU microseconds per model step in each phase of the kernel's loop, between two
    ``PersistentExecutor.stats()`` readings (A+B schedule, C forward, D publish)."""
    steps = after["steps"] - before["steps"]
    return {f"{phase}_us_per_step": (after[f"{phase}_ns"] - before[f"{phase}_ns"]) / 1e3 / steps
            for phase in ("schedule", "forward", "publish")} if steps > 0 else {}


def summarize(rows: list[dict]) -> dict:
    return dict(ttft_us=statistics.median(r["ttft_us"] for r in rows),
                tpot_us=statistics.median(r["tpot_us"] for r in rows),
                claim_us_median=statistics.median(r["claim_us"] for r in rows),
                claim_us_p99=percentile([r["claim_us"] for r in rows], 99))


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]  # R running, S sleeping, T stopped


def wait_for_state(pid: int, wanted: str, timeout_s: float = 2.0) -> str:
    """A signal is delivered asynchronously: wait until the process shows ``wanted``."""
    deadline = time.monotonic() + timeout_s
    while process_state(pid) != wanted and time.monotonic() < deadline:
        time.sleep(1e-3)
    return process_state(pid)


# --- the SIGSTOP demonstration ---------------------------------------------------------------------
def sigstop_demo(model_dir, engine_config, n_before=4, n_during=8, max_tokens=48) -> dict:
    """Engine process (persistent) + this process as the frontend; SIGSTOP the engine mid-run."""
    from ..engine.process import run_engine
    from ..ring.control import EngineStatsBoard, request_stop

    ctx = multiprocessing.get_context("spawn")
    layout = RingLayout(num_slots=64, max_prompt_tokens=64, max_output_tokens=max_tokens)
    ring = Ring.create(layout)
    board = EngineStatsBoard(ring)
    proc = ctx.Process(target=run_engine, args=(ring.name, str(model_dir), engine_config))
    proc.start()
    client, rng = RingClient(ring), np.random.default_rng(7)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    result = dict(passed=False)
    try:
        deadline = time.monotonic() + 300
        while board.read() is None or board.read()["num_steps"] < 0:
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError("engine process did not start")
            time.sleep(0.1)
        slots = [client.submit(rng.integers(3, 4000, size=16).tolist(), params, request_id=i)
                 for i in range(n_before)]
        while all(int(ring.generated[s]) == 0 for s in slots):  # the kernel is serving
            if time.monotonic() > deadline:
                raise RuntimeError("no token before SIGSTOP")
            time.sleep(1e-3)
        os.kill(proc.pid, signal.SIGSTOP)
        result["engine_state_during"] = wait_for_state(proc.pid, "T")  # 'T': stopped
        slots += [client.submit(rng.integers(3, 4000, size=16).tolist(), params, request_id=100 + i)
                  for i in range(n_during)]
        done, while_stopped = {}, 0
        while len(done) < len(slots) and time.monotonic() < deadline:
            for s in slots:
                if s not in done:
                    tokens, finished, reason = client.poll(s, 0)
                    if finished:
                        done[s] = (len(tokens), reason)
                        while_stopped += process_state(proc.pid) == "T"
            time.sleep(1e-3)
        result.update(submitted=len(slots), completed=len(done),
                      completed_while_stopped=while_stopped,
                      all_full_length=all(n == max_tokens for n, _ in done.values()))
        result["engine_state_after"] = process_state(proc.pid)
        result["passed"] = (result["engine_state_during"] == "T" and while_stopped == len(slots)
                            and result["all_full_length"])
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        request_stop(ring)
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        ring.close()
        ring.unlink()
    return result


# --- scanning the ring: mapped host memory against device memory ----------------------------------
def scan_placements(ring: Ring, repeats: int = 2000) -> dict:
    """Time for the whole grid (one 128-thread block per SM) to read all 4096 state words with
    acquire loads, the ring in mapped host memory (as served here) and in device memory (Blink's
    placement, which the frontend would fill with copies); each scan repeated ``repeats`` times
    in one launch and timed with CUDA events."""
    import cupy

    from ..ring.placement import map_ring_for_gpu

    mapping = map_ring_for_gpu(ring, ("state",))
    placements = {"mapped_host": mapping.views["state"],
                  "device": cuda.to_device(np.ascontiguousarray(ring.state))}
    found = cuda.to_device(np.zeros(1, np.int64))
    blocks = cuda.get_current_device().MULTIPROCESSOR_COUNT
    out = {}
    for name, state in placements.items():
        count_pending_kernel[blocks, THREADS](state, 1, found)  # compile, warm up
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        count_pending_kernel[blocks, THREADS](state, repeats, found)
        end.record()
        end.synchronize()
        out[f"{name}_scan_us"] = cupy.cuda.get_elapsed_time(start, end) * 1e3 / repeats
    mapping.release()
    return out


@cuda.jit
def count_pending_kernel(state, repeats, found):
    """Every thread reads its share of the state words ``repeats`` times (acquire loads: never
    hoisted out of the loop), counting PREFILL_PENDING ones."""
    thread, n_threads = cuda.grid(1), cuda.gridsize(1)
    n = 0
    for _ in range(repeats):
        for slot in range(thread, state.shape[0], n_threads):
            if load_acquire(state, slot) == PREFILL_PENDING:
                n += 1
    if n > 0:
        cuda.atomic.add(found, 0, n)


@cuda.jit
def barrier_loop_kernel(n):
    """``n`` grid barriers back to back (the persistent kernel's only cost besides its ops)."""
    for _ in range(n):
        cuda.cg.this_grid().sync()


def grid_barrier_costs(grids: list[int], n: int = 20000) -> dict:
    """Microseconds per grid barrier for cooperative grids of ``grids`` blocks of THREADS."""
    import cupy

    out = {}
    for blocks in grids:
        barrier_loop_kernel[blocks, THREADS](1)  # compile, warm up
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        barrier_loop_kernel[blocks, THREADS](n)
        end.record()
        end.synchronize()
        out[str(blocks)] = cupy.cuda.get_elapsed_time(start, end) * 1e3 / n
    return out


# --- the headline figures ----------------------------------------------------------------------
def summary_of(results: dict) -> dict:
    """The headline summary, from the raw results (JSON keys: batch sizes as strings
    once written, ints before)."""
    def tpot(name, b, kind="quiet"):
        by_batch = results.get(name, {}).get(kind, {})
        return (by_batch.get(b) or by_batch.get(str(b)) or {}).get("tpot_us")

    def ratio(x, y):
        return x / y if x and y else None

    persistent = results.get("persistent", {})
    scan_claim, placements = persistent.get("scan_claim", {}), persistent.get("scan_placements", {})
    return dict(
        # "persistent" figures: inline dispatch (the cooperative megakernel); "persistent-graph":
        # the one-block scheduler launching a forward graph per step from the GPU
        dispatcher="persistent-inline",
        dispatchers_measured=[n for n in ("persistent", "persistent-graph") if n in results],
        scan_4096_us=placements.get("mapped_host_scan_us"),  # the raw scan, ring as served
        scan_4096_device_memory_us=placements.get("device_scan_us"),
        scan_4096_in_loop_us=scan_claim.get("scan_us_median"),  # + a grid barrier and a clock
        claim_latency_p50_us=scan_claim.get("claim_us_median"),
        claim_latency_p99_us=scan_claim.get("claim_us_p99"),
        persistent_tpot_over_graph_b1=ratio(tpot("persistent", 1), tpot("graph", 1)),
        persistent_interference_inflation=ratio(tpot("persistent", 1, "hog"), tpot("persistent", 1)),
        persistent_graph_tpot_over_graph_b1=ratio(tpot("persistent-graph", 1), tpot("graph", 1)),
        persistent_graph_tpot_over_inline_b1=ratio(tpot("persistent-graph", 1), tpot("persistent", 1)),
        persistent_graph_interference_inflation=ratio(tpot("persistent-graph", 1, "hog"),
                                                      tpot("persistent-graph", 1)),
        eager_interference_inflation=ratio(tpot("eager", 1, "hog"), tpot("eager", 1)),
        graph_interference_inflation=ratio(tpot("graph", 1, "hog"), tpot("graph", 1)),
        sigstop_passed=results.get("sigstop", {}).get("passed"),
    )


# --- main -----------------------------------------------------------------------------------------
def claim_seen_by_host_us(client: RingClient, rng, timeout_s: float = 10.0) -> float:
    """Submit one request and spin on its state word until it leaves PREFILL_PENDING: µs from
    the submit (``arrival_ns``) to the claim, both on the host's clock (the GPU-stamped
    ``claim_ns`` rides on a GPU-to-host clock offset that drifts by tens of µs over a run)."""
    ring = client.ring
    slot = client.submit(rng.integers(3, 4000, size=8).tolist(),
                         SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                         request_id=0)
    deadline = time.monotonic() + timeout_s
    while int(ring.state[slot]) == PREFILL_PENDING:  # x86: an aligned load is an acquire load
        if time.monotonic() > deadline:
            raise TimeoutError("the request was not claimed")
    latency_us = (time.monotonic_ns() - int(ring.arrival_ns[slot])) / 1e3
    client.collect([slot], timeout_s)  # and release the slot
    return latency_us


def scan_and_claim(executor, client, rng, n=30) -> dict:
    """Single requests, one at a time: the kernel's scan time and submit-to-claim latency."""
    scans, claims = [], []
    for _ in range(n):
        claims.append(claim_seen_by_host_us(client, rng))
        scans.append(executor.stats()["last_scan_ns"] / 1e3)
    return dict(scan_us_median=statistics.median(scans), scan_us_p99=percentile(scans, 99),
                claim_us_median=statistics.median(claims), claim_us_p99=percentile(claims, 99),
                claim_clock="host: submit to the state word seen leaving PREFILL_PENDING")


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"grid sizes must be >= 1, got {text!r}")
    return values


def executor_names(text: str) -> list[str]:
    names = text.split(",")
    for name in names:
        base, _, blocks = name.partition("@")
        grid_ok = not blocks or (base == "persistent" and blocks.isdigit() and int(blocks) >= 1)
        if base not in ("eager", "graph", "persistent", "persistent-graph") or not grid_ok:
            raise argparse.ArgumentTypeError(f"unknown executor {name!r}: eager, graph, persistent, "
                                             f"persistent@N or persistent-graph")
    return names


def main(argv=None) -> int:
    from ..backend import get_backend
    from ..model.tokenizer import stop_ids

    parser = bench_parser("persistent", __doc__)
    parser.add_argument("--batches", default="1,8,64", help="concurrent requests, comma-separated")
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per request")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--executors", default="eager,graph,persistent,persistent-graph",
                        type=executor_names,
                        help="eager, graph, persistent (inline dispatch), persistent@N (N blocks) "
                             "or persistent-graph (device-graph dispatch), comma-separated")
    parser.add_argument("--hog-seconds", type=float, default=60, help="0: no CPU-hog runs")
    parser.add_argument("--barrier-grids", default=[], type=positive_ints,
                        help="e.g. 16,33,66,132: time one grid barrier at these grid sizes")
    parser.add_argument("--skip-sigstop", action="store_true",
                        help="skip the SIGSTOP demonstration")
    args = parser.parse_args(argv)
    if get_backend().is_simulator:
        print("bench.persistent needs a GPU (the persistent kernel in the simulator is for tests)")
        return 2
    folder = resolve_model_dir()
    weights, eos = load_weights(folder), stop_ids(folder)
    batches = [int(b) for b in args.batches.split(",")]
    engine_config = EngineConfig(block_size=16, num_kv_blocks=1024, max_num_seqs=max(batches),
                                 max_num_batched_tokens=512, weight_dtype="float16")
    cpus = sorted(os.sched_getaffinity(0))
    frontend_cpu, other_cpus = cpus[0], cpus[1:]
    os.sched_setaffinity(0, {frontend_cpu})  # the frontend: this thread, on its own core
    rng = np.random.default_rng(0)
    results, table = {}, []
    for name in args.executors:
        ring = Ring(bytearray(LAYOUT.nbytes), LAYOUT)
        client = RingClient(ring)
        persistent = name.startswith("persistent")
        runner = (Persistent(name, weights, engine_config, ring, eos) if persistent
                  else HostLoop(name, weights, replace(engine_config, executor=name), ring, eos,
                                set(other_cpus)))
        runner.start()
        entry = {"quiet": {}, "hog": {}}
        try:
            for b in batches:
                run_batch(client, b, args.prompt_len, args.max_tokens, rng)  # warm-up / capture
                before = runner.executor.stats() if persistent else None
                entry["quiet"][b] = summarize(run_batch(client, b, args.prompt_len, args.max_tokens, rng))
                if persistent:
                    after = runner.executor.stats()
                    entry["quiet"][b].update(phase_split(before, after),
                                             grid_blocks=runner.executor.grid_blocks,
                                             relaunches=after["relaunches"] - before["relaunches"])
                print(f"  {name:14s} B={b:3d} quiet  {entry['quiet'][b]}", flush=True)
            if name == "persistent":
                entry["scan_claim"] = scan_and_claim(runner.executor, client, rng)
                print(f"  persistent scan/claim {entry['scan_claim']}", flush=True)
            if args.hog_seconds > 0:
                with CpuHog(other_cpus, args.hog_seconds):
                    for b in batches:
                        entry["hog"][b] = summarize(run_batch(client, b, args.prompt_len, args.max_tokens, rng))
                        print(f"  {name:14s} B={b:3d} hog    {entry['hog'][b]}", flush=True)
        finally:
            runner.stop()
        if name == "persistent":  # after the kernel: nothing else may run beside it on the GPU
            entry["scan_placements"] = scan_placements(Ring(bytearray(LAYOUT.nbytes), LAYOUT))
            print(f"  scan of 4096 slots by placement {entry['scan_placements']}", flush=True)
        for b in batches:
            q, h = entry["quiet"][b], entry["hog"].get(b)
            table.append(dict(executor=name, batch=b, ttft_us=q["ttft_us"], tpot_us=q["tpot_us"],
                              forward_us=q.get("forward_us_per_step"),
                              sched_us=q.get("schedule_us_per_step"),
                              publish_us=q.get("publish_us_per_step"),
                              hog_tpot_us=h and h["tpot_us"],
                              inflation=h and h["tpot_us"] / q["tpot_us"]))
        results[name] = entry
    print()
    print_table(table, ["executor", "batch", "ttft_us", "tpot_us", "sched_us", "forward_us",
                        "publish_us", "hog_tpot_us", "inflation"])
    if args.barrier_grids:
        results["grid_barrier"] = grid_barrier_costs(args.barrier_grids)
        print("grid barrier, µs each:", results["grid_barrier"], flush=True)
    if not args.skip_sigstop:
        results["sigstop"] = sigstop_demo(folder, EngineConfig(
            executor="persistent", block_size=16, num_kv_blocks=256, max_num_seqs=16,
            max_num_batched_tokens=256, weight_dtype="float16"))
        print("SIGSTOP demonstration:", results["sigstop"], flush=True)

    summary = summary_of(results)
    path = write_results("persistent", vars(args), results, summary, args.out)
    print("summary:", summary)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
