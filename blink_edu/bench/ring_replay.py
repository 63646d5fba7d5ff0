"""Replaying a seeded workload through the ring, to an engine the host does not drive.

Blink §5 (the host out of the loop, and what a busy host does to it) with SuperInfer §5's
workload and scoring: ``replay.py`` replays a workload on ``LLMEngine``, whose ``step()`` the
host calls; here the engine is the persistent scheduler kernel behind a ring
(``executors/persistent.py``), and the only host code in the loop is a frontend -- this thread --
that writes each request into the ring when its arrival time comes and watches the ring's
``generated`` counters for tokens. Token times are when the frontend sees them (it looks every
``poll_s``), as ``replay.py``'s are when ``step()`` hands them out: both are what a client would
see, and both are scored by ``sim.metrics``.

Besides the token times a replay measures the host's share of the work: the CPU time this
process spent over the replay (``resource.getrusage``: every thread of it, not its children) per
token generated. Here that is the frontend's polling alone; for ``replay.py`` it is the whole
host-driven engine loop.
"""

from __future__ import annotations

import gc
import time

import numpy as np

from ..config import SamplingParams
from ..ring import DECODE_COMPLETED, FINISH_REASONS, Ring, RingClient
from ..ring.client import RingFull
from ..sim.workload import RequestSpec
from .replay import MeasuredRequest, Replay, cpu_seconds, host_share

#: the kernel's counters a replay reports (``PersistentExecutor.stats()``), over the replay: its
#: steps, moves and decisions, and the GPU time of its phases (A+B schedule, C forward, D publish)
COUNTERS = ("steps", "preemptions", "rotations", "rotate_ins", "decisions", "blocks_out",
            "blocks_in", "blocks_mirrored", "schedule_ns", "forward_ns", "publish_ns")


def poll_ring(ring: Ring, client: RingClient, active: dict, seen: np.ndarray, t: float,
              failed: list) -> None:
    """One look at every active slot, all at once (the state words first, then the ``generated``
    counters: a finished slot has published every token): new tokens are timed ``t``, finished
    requests are closed and their slots released. Only the counts are read -- the bench times
    tokens, it does not need them -- so a look costs the frontend microseconds, not a Python
    call per slot."""
    slots = np.fromiter(active, np.int64, len(active))  # (n,)
    finished = ring.state[slots] == DECODE_COMPLETED  # (n,) bool
    fresh = ring.generated[slots] - seen[slots]  # (n,) tokens published since the last look
    for k in np.flatnonzero((fresh > 0) | finished):
        slot, request = int(slots[k]), active[int(slots[k])]
        if fresh[k] > 0:
            if request.first_token_time is None:
                request.first_token_time = t
            request.token_times += [t] * int(fresh[k])
            seen[slot] += fresh[k]
        if finished[k]:
            reason = FINISH_REASONS[int(ring.finish_reason[slot])]
            if reason in ("length", "stop"):
                request.finish_time = t
            else:
                failed.append((request.spec.request_id, reason))
            client.release(slot)
            del active[slot]


def ring_replay(executor, ring: Ring, workload: list[RequestSpec], rng: np.random.Generator,
                vocab_size: int, poll_s: float = 100e-6, timeout_s: float = 300.0) -> Replay:
    """Replay ``workload`` through ``ring`` to ``executor`` (started, serving ``ring``; anything
    with ``stats()`` and ``alive()``, such as ``PersistentExecutor``) in real time: each request
    is submitted when its arrival time comes (later if every slot is taken: the ring pushes back,
    nothing is dropped), with a random prompt from ``rng``. Returns per request its token times
    (seconds from the start), no iterations (the host sees none), and as counts the kernel's
    counters over the replay plus the host's CPU time per token. RuntimeError if the kernel
    stops; TimeoutError if the requests are not all done ``timeout_s`` after the last arrival."""
    gc.collect()  # the last replay's garbage: collected now, not in this one
    client = RingClient(ring)
    prompts = {s.request_id: rng.integers(3, vocab_size, size=s.prompt_len).tolist()
               for s in workload}
    measured = {s.request_id: MeasuredRequest(s) for s in workload}
    pending = sorted(workload, key=lambda s: s.arrival_time)
    deadline_s = (pending[-1].arrival_time if pending else 0.0) + timeout_s
    active: dict[int, MeasuredRequest] = {}  # slot -> its request
    seen = np.zeros(ring.layout.num_slots, np.int64)  # (num_slots,) tokens seen per slot
    failed = []
    before, cpu_before = executor.stats(), cpu_seconds()
    start = time.perf_counter()
    while pending or active:
        now = time.perf_counter() - start
        if now > deadline_s or not executor.alive():
            raise (TimeoutError if executor.alive() else RuntimeError)(
                f"the ring replay stopped with {len(active)} request(s) running and "
                f"{len(pending)} not yet submitted (kernel {'alive' if executor.alive() else 'stopped'})")
        while pending and pending[0].arrival_time <= now:
            spec = pending[0]
            try:
                slot = client.submit(prompts[spec.request_id], SamplingParams(
                    temperature=0, max_tokens=spec.output_len, ignore_eos=True),
                    request_id=spec.request_id)
            except RingFull:
                break  # every slot taken: submit it as soon as one is released
            active[slot] = measured[pending.pop(0).request_id]
            seen[slot] = 0
        poll_ring(ring, client, active, seen, time.perf_counter() - start, failed)
        time.sleep(poll_s)
    cpu_s, after = cpu_seconds() - cpu_before, executor.stats()
    if failed:
        raise RuntimeError(f"{len(failed)} request(s) failed in the kernel: {failed[:5]}")
    counts = {name: after[name] - before[name] for name in COUNTERS}
    counts.update({f"{phase}_us_per_step": counts[f"{phase}_ns"] / 1e3 / max(1, counts["steps"])
                   for phase in ("schedule", "forward", "publish")})
    return Replay(list(measured.values()), [], {**counts, **host_share(cpu_s, list(measured.values()))})
