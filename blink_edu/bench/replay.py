"""Replaying a seeded workload on the real engine, in real time, and measuring what it did.

SuperInfer §5 and docs/design.md §9 (the same work for every variant). Each request is added to
the engine when its arrival time comes; its token times are taken as the engine hands the
tokens out; every iteration that ran the model is recorded in the simulator's terms
(``sim.calibrate.Iteration``), so that a replay can both be scored like a simulated run
(``sim.metrics``) and calibrate the simulator's cost model. The experiment that uses it is
``slo_real.py``.

An iteration is everything the loop does from one model step to the next -- arrivals,
scheduling, the policy, rotations, the model, handing tokens out -- which is what the simulator
charges for a step.
"""

from __future__ import annotations

import gc
import resource
import time
from dataclasses import dataclass, field

import numpy as np

from ..config import SamplingParams
from ..executors.protocol import Executor
from ..engine.llm_engine import LLMEngine
from ..executors.step import StepBatch
from ..sim.calibrate import Iteration
from ..sim.workload import RequestSpec


@dataclass
class MeasuredRequest:
    """What ``sim.metrics`` reads of a request, measured on the engine."""

    spec: RequestSpec
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list = field(default_factory=list)
    num_preemptions: int = 0


@dataclass
class Replay:
    """One workload replayed on the engine."""

    requests: list[MeasuredRequest]
    iterations: list[Iteration]
    counts: dict  # the engine's counters over the replay


class BatchRecorder:
    """An ``Executor`` that runs another one and records (batched tokens, context tokens,
    sequences, seconds) of every step."""

    def __init__(self, executor: Executor):
        self.executor, self.batches = executor, []
        self.name, self.kv_pool, self.block_size = (executor.name, executor.kv_pool,
                                                    executor.block_size)

    @property
    def compute_stream(self):
        return self.executor.compute_stream

    @property
    def buckets(self):
        return self.executor.buckets

    def step(self, batch: StepBatch) -> np.ndarray:
        # context as the simulator counts it: each sequence's cached + scheduled tokens, i.e. its
        # last token's position + 1 (S,)
        context = int((batch.positions[batch.logit_rows] + 1).sum())
        began = time.perf_counter()
        sampled = self.executor.step(batch)  # (S,) int32
        self.batches.append((batch.num_tokens, context, batch.num_seqs,
                             time.perf_counter() - began))
        return sampled


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all its threads; not its children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def host_share(cpu_s: float, requests: list[MeasuredRequest]) -> dict:
    """The host's CPU time over a replay, and per token generated."""
    tokens = sum(len(r.token_times) for r in requests)
    return {"host_cpu_s": cpu_s, "tokens": tokens,
            "host_cpu_us_per_token": cpu_s * 1e6 / tokens if tokens else None}


def requests_moved(scheduler) -> int:
    """Every request the scheduler moved so far, each move once (the simulator's ``moves``)."""
    return scheduler.num_recomputes + scheduler.num_rotations + scheduler.num_rotate_ins


def replay(engine: LLMEngine, recorder: BatchRecorder, workload: list[RequestSpec],
           rng: np.random.Generator) -> Replay:
    """Replay ``workload`` on ``engine`` (fresh, built over ``recorder``) in real time: each
    request is added when its arrival time comes, with a random prompt from ``rng``; per request
    its token times (seconds from the start), per iteration that ran the model an
    ``Iteration``; and the host's CPU time per token (``host_share``: here the whole engine
    loop is the host's)."""
    gc.collect()  # the last replay's engine and books: collected now, not in this one's steps
    sched = engine.scheduler
    vocab = engine.weights.config.vocab_size
    prompts = {s.request_id: rng.integers(3, vocab, size=s.prompt_len).tolist() for s in workload}
    measured = {s.request_id: MeasuredRequest(s) for s in workload}
    pending = sorted(workload, key=lambda s: s.arrival_time)
    iterations = []
    unclosed = None  # the last iteration that ran the model: (tokens, context, seqs,
    #                  model_seconds, moved, decided, mirrored, its start)
    mirrored = int(sched.rotation is not None)
    cpu_before = cpu_seconds()
    start, engine_start = time.perf_counter(), time.monotonic()  # (the engine's clock)
    while pending or engine.has_unfinished():
        began = time.perf_counter()
        if unclosed is not None:
            iterations.append(closed(unclosed, began))
            unclosed = None
        while pending and pending[0].arrival_time <= began - start:
            spec = pending.pop(0)
            engine.add_request(prompts[spec.request_id], SamplingParams(
                temperature=0, max_tokens=spec.output_len, ignore_eos=True),
                request_id=spec.request_id, arrival_time=engine_start + spec.arrival_time)
        if not engine.has_unfinished():
            time.sleep(min(1e-3, max(0.0, pending[0].arrival_time - (began - start))))
            continue
        steps_before, moved_before = len(recorder.batches), requests_moved(sched)
        outputs = engine.step()
        record_tokens(measured, outputs, time.perf_counter() - start)
        if len(recorder.batches) > steps_before:
            decided = int(sched.last_decision is not None)
            unclosed = (*recorder.batches[-1], requests_moved(sched) - moved_before, decided,
                        mirrored, began)
    cpu_s = cpu_seconds() - cpu_before
    if unclosed is not None:
        iterations.append(closed(unclosed, time.perf_counter()))
    counts = {"recomputes": sched.num_recomputes, "rotations": sched.num_rotations,
              "rotate_ins": sched.num_rotate_ins, "moved": requests_moved(sched),
              "preemptions": sched.num_recomputes + sched.num_rotations,  # as the simulator's
              "steps": engine.stats().num_steps, **host_share(cpu_s, list(measured.values()))}
    return Replay(list(measured.values()), iterations, counts)


def closed(unclosed: tuple, next_start: float) -> Iteration:
    """The iteration that began at ``unclosed[-1]``, lasting until the next one began."""
    *counts, began = unclosed
    return Iteration(*counts, next_start - began)


def record_tokens(measured: dict, outputs, t: float) -> None:
    """The engine handed ``outputs`` out at ``t`` seconds from the start."""
    for out in outputs:
        r = measured[out.request_id]
        r.token_times.append(t)
        if r.first_token_time is None:
            r.first_token_time = t
        if out.finished:
            r.finish_time = t
