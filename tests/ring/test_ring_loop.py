"""The ring engine loop against the oracle, ``reference.generate``: requests written into the ring
by frontends (threads here, or another process) come back with exactly the reference's greedy
tokens, or a prefix of them when cancelled; every submission is claimed once; a bad payload fails
its own slot only; afterwards every slot is EMPTY and every KV block free."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import TINY

from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.engine.llm_engine import LLMEngine
from blink_edu.engine.ring_loop import IdleNap, RingEngineLoop
from blink_edu.model import reference
from blink_edu.model.weights import load_weights
from blink_edu.ring import (EMPTY, FILLING, PREFILL_PENDING,
                            PREFILL_PROCESSING, Ring, RingClient, RingFull, RingLayout)

LAYOUT = RingLayout(num_slots=6, max_prompt_tokens=16, max_output_tokens=10)
CONFIG = EngineConfig(executor="reference", block_size=4, num_kv_blocks=48, max_num_seqs=4,
                      max_num_batched_tokens=24)
VOCAB = TINY["vocab_size"]
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def weights(checkpoints):
    folder, _ = checkpoints["qwen2"]
    return load_weights(folder, dtype=np.float64)


@dataclass(frozen=True)
class Job:
    request_id: int
    prompt: tuple[int, ...]
    params: SamplingParams
    cancel_after: int | None = None  # cancel once this many tokens were seen (None: never)


def greedy(max_tokens: int, ignore_eos: bool = True) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)


@contextmanager
def serving(weights, layout: RingLayout = LAYOUT, num_slots: int | None = None):
    """A fresh shared-memory ring and a loop running over it in its own thread; yields
    (ring, loop, claims): ``claims`` lists the request id of every PREFILL_PENDING ->
    PREFILL_PROCESSING move, recorded as the loop makes it."""
    if num_slots is not None:
        layout = RingLayout(num_slots, layout.max_prompt_tokens, layout.max_output_tokens)
    ring = Ring.create(layout)
    claims: list[int] = []
    cas = ring.cas

    def recording_cas(slot, expected, new):
        ok = cas(slot, expected, new)
        if ok and (expected, new) == (PREFILL_PENDING, PREFILL_PROCESSING):
            claims.append(int(ring.request_id[slot]))
        return ok

    ring.cas = recording_cas
    loop = RingEngineLoop(ring, LLMEngine(weights, CONFIG))
    stop, crashed = threading.Event(), []

    def run():
        try:
            loop.run(stop)
        except BaseException as error:  # surface it here instead of timing out the frontends
            crashed.append(error)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield ring, loop, claims
    finally:
        stop.set()
        thread.join(TIMEOUT_S)
        ring.close()
        ring.unlink()
        assert not crashed, f"the engine loop crashed: {crashed[0]!r}"
    assert not thread.is_alive()


def frontend(client: RingClient, jobs: list[Job], held: set, held_lock) -> dict:
    """Submit ``jobs`` (retrying while the ring is full), poll them, cancel some, release each
    slot when done. Returns {request_id: (tokens, finish_reason)}. ``held`` is every slot some
    frontend holds right now: a slot handed to two frontends at once fails the test."""
    todo, inflight, results = list(jobs), {}, {}
    deadline = time.monotonic() + TIMEOUT_S
    while todo or inflight:
        assert time.monotonic() < deadline, "requests did not finish"
        if todo:
            try:
                slot = client.submit(todo[0].prompt, todo[0].params, todo[0].request_id)
                with held_lock:
                    assert slot not in held
                    held.add(slot)
                inflight[slot] = (todo.pop(0), [])
            except RingFull:
                pass
        for slot, (job, tokens) in list(inflight.items()):
            new, finished, reason = client.poll(slot, len(tokens))
            tokens += new
            if job.cancel_after is not None and len(tokens) >= job.cancel_after:
                client.cancel(slot)
            if finished:
                results[job.request_id] = (tokens, reason)
                with held_lock:
                    held.remove(slot)
                client.release(slot)
                del inflight[slot]
        time.sleep(2e-4)
    return results


def run_frontends(ring: Ring, jobs_per_frontend: list[list[Job]]) -> dict:
    held, held_lock = set(), threading.Lock()
    with ThreadPoolExecutor(len(jobs_per_frontend)) as pool:
        futures = [pool.submit(frontend, RingClient(ring), jobs, held, held_lock)
                   for jobs in jobs_per_frontend]
        results = {}
        for f in futures:
            results.update(f.result(timeout=TIMEOUT_S))
    return results


def assert_all_free(ring: Ring, loop: RingEngineLoop) -> None:
    assert (ring.state == EMPTY).all()
    assert not loop.live and not loop.engine.has_unfinished()
    assert loop.engine.stats().kv_blocks_used == 0
    loop.engine.scheduler.block_manager.check()


def expected_reason(tokens: list[int], params: SamplingParams, eos: tuple[int, ...]) -> str:
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
    return "stop" if tokens[-1] in stops else "length"


def test_run_once_serves_requests_with_the_reference_tokens(weights, rng):
    ring = Ring(np.empty(LAYOUT.nbytes, dtype=np.uint8), LAYOUT)  # one process: a plain buffer
    loop = RingEngineLoop(ring, LLMEngine(weights, CONFIG))
    client = RingClient(ring)
    prompts = [rng.integers(0, VOCAB, size=int(n)).tolist() for n in rng.integers(1, 16, size=5)]
    params = [greedy(int(m)) for m in rng.integers(1, 11, size=5)]
    assert not loop.run_once()  # nothing to do yet
    beats = int(ring.engine_heartbeat)
    slots = [client.submit(p, q, request_id=100 + i)
             for i, (p, q) in enumerate(zip(prompts, params))]
    assert all(ring.state[s] == PREFILL_PENDING for s in slots)
    tokens = {s: [] for s in slots}
    for _ in range(100):
        if not loop.run_once():
            break
        for s in slots:
            tokens[s] += client.poll(s, len(tokens[s]))[0]
    assert int(ring.engine_heartbeat) > beats
    assert [tokens[s] for s in slots] == reference.generate(weights, prompts, params)
    for s in slots:
        assert client.poll(s, 0) == (tokens[s], True, "length")
        assert 0 < ring.arrival_ns[s] <= ring.claim_ns[s] <= ring.first_token_ns[s] \
            <= ring.last_token_ns[s]
        client.release(s)
    assert_all_free(ring, loop)


def test_the_oldest_pending_request_is_admitted_first(weights, rng):
    ring = Ring(np.empty(LAYOUT.nbytes, dtype=np.uint8), LAYOUT)
    one_at_a_time = EngineConfig(executor="reference", block_size=4, num_kv_blocks=48,
                                 max_num_seqs=1)
    loop = RingEngineLoop(ring, LLMEngine(weights, one_at_a_time))
    client = RingClient(ring)
    client._cursor = LAYOUT.num_slots - 2  # the circular scan wraps: arrival order != slot order
    slots = [client.submit(rng.integers(0, VOCAB, size=4).tolist(), greedy(3), request_id=i)
             for i in range(4)]
    assert slots == [4, 5, 0, 1]
    loop.run_once()
    assert ring.generated[slots].tolist() == [1, 0, 0, 0]  # only the oldest ran


def test_a_bad_payload_fails_its_own_slot_only(weights, rng):
    prompts = [rng.integers(0, VOCAB, size=int(n)).tolist() for n in rng.integers(2, 12, size=3)]
    params = greedy(8)
    with serving(weights) as (ring, loop, claims):
        client = RingClient(ring)
        good = [client.submit(prompts[0], params, request_id=0)]
        out_of_vocab = client.submit([5, VOCAB + 7, 3], params, request_id=1)
        good.append(client.submit(prompts[1], params, request_id=2))
        # A frontend that skips the checks: max_tokens past the output arena.
        raw = int(np.flatnonzero(ring.state == EMPTY)[0])
        assert ring.cas(raw, EMPTY, FILLING)
        client._write_payload(raw, np.array(prompts[2]), params, request_id=3)
        ring.max_tokens[raw] = LAYOUT.max_output_tokens + 1
        ring.advance(raw, FILLING, PREFILL_PENDING)
        ring.ring_doorbell()
        good.append(client.submit(prompts[2], params, request_id=4))
        got = {}
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 5 and time.monotonic() < deadline:
            for s in {out_of_vocab, raw, *good} - got.keys():
                tokens, finished, reason = client.poll(s, 0)
                if finished:
                    got[s] = (tokens, reason)
                    client.release(s)
            time.sleep(1e-3)
        assert got[out_of_vocab] == ([], "error") and got[raw] == ([], "error")
        want = reference.generate(weights, prompts, params)
        assert [got[s] for s in good] == [(w, "length") for w in want]
        assert sorted(claims) == [0, 1, 2, 3, 4]
        assert_all_free(ring, loop)


job_strategy = st.tuples(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=LAYOUT.max_prompt_tokens),
    st.integers(1, LAYOUT.max_output_tokens),  # max_tokens
    st.booleans(),  # ignore_eos
    st.one_of(st.none(), st.integers(0, 5)),  # cancel after this many tokens
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frontends=st.lists(st.lists(job_strategy, min_size=1, max_size=4), min_size=1, max_size=3),
       num_slots=st.integers(2, 6))
def test_concurrent_frontends_get_reference_tokens_or_a_cancelled_prefix(weights, frontends,
                                                                         num_slots):
    ids = iter(range(10**6))
    jobs = [[Job(next(ids), tuple(p), greedy(m, ignore_eos), cancel) for p, m, ignore_eos, cancel
             in per_frontend] for per_frontend in frontends]
    everyone = [job for per_frontend in jobs for job in per_frontend]
    with serving(weights, num_slots=num_slots) as (ring, loop, claims):
        results = run_frontends(ring, jobs)
        assert sorted(claims) == [job.request_id for job in everyone]  # each claimed once
        assert_all_free(ring, loop)
    eos = weights.config.eos_token_ids
    for job in everyone:
        want = reference.generate(weights, [list(job.prompt)], job.params)[0]
        tokens, reason = results[job.request_id]
        if reason == "abort":
            assert job.cancel_after is not None and tokens == want[:len(tokens)]
        else:
            assert tokens == want and reason == expected_reason(want, job.params, eos)


REMOTE_FRONTEND = """
import json, sys, time
from blink_edu.config import SamplingParams
from blink_edu.ring import Ring, RingClient, RingFull
ring = Ring.attach(sys.argv[1])
client, todo, inflight, results = RingClient(ring), json.loads(sys.argv[2]), {}, {}
while todo or inflight:
    if todo:
        try:
            i, prompt, max_tokens = todo[0]
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            inflight[client.submit(prompt, params, request_id=i)] = (i, [])
            todo.pop(0)
        except RingFull:
            pass
    for slot, (i, tokens) in list(inflight.items()):
        new, finished, reason = client.poll(slot, len(tokens))
        tokens += new
        if finished:
            results[i] = (tokens, reason)
            client.release(slot)
            del inflight[slot]
    time.sleep(2e-4)
print(json.dumps(results))
ring.close()
"""


def test_a_frontend_in_another_process_is_served(weights, rng):
    prompts = [rng.integers(0, VOCAB, size=int(n)).tolist() for n in rng.integers(1, 16, size=8)]
    max_tokens = [int(m) for m in rng.integers(1, 11, size=8)]
    todo = [[i, p, m] for i, (p, m) in enumerate(zip(prompts, max_tokens))]
    with serving(weights, num_slots=3) as (ring, loop, claims):  # fewer slots than requests
        child = subprocess.run([sys.executable, "-c", REMOTE_FRONTEND, ring.name, json.dumps(todo)],
                               capture_output=True, text=True, timeout=TIMEOUT_S)
        assert child.returncode == 0, child.stderr
        results = {int(i): v for i, v in json.loads(child.stdout).items()}
        assert sorted(claims) == list(range(8))
        assert_all_free(ring, loop)
    want = reference.generate(weights, prompts, [greedy(m) for m in max_tokens])
    assert [results[i] for i in range(8)] == [[w, "length"] for w in want]


def test_rotated_requests_show_as_decode_paused(weights, rng):
    """With DuplexKV rotation (policy lvf), a request whose KV is on the host is DECODE_PAUSED in
    the ring, and comes back to DECODE_PROCESSING; tokens stay the reference's."""
    from blink_edu.ring.layout import DECODE_PAUSED

    config = EngineConfig(executor="reference", block_size=4, num_kv_blocks=8, max_num_seqs=4,
                          max_num_batched_tokens=16, preemption="rotate", policy="lvf")
    ring = Ring(bytearray(LAYOUT.nbytes), LAYOUT)
    loop = RingEngineLoop(ring, LLMEngine(weights, config))
    client = RingClient(ring)
    prompts = [rng.integers(3, VOCAB, size=8).tolist() for _ in range(5)]
    slots = [client.submit(p, greedy(8), request_id=i) for i, p in enumerate(prompts)]
    paused_seen, done = set(), {}
    for _ in range(500):
        loop.run_once()
        paused_seen |= {s for s in slots if ring.state[s] == DECODE_PAUSED}
        for s in slots:
            if s not in done:
                tokens, finished, _ = client.poll(s, 0)
                if finished:
                    done[s] = tokens
                    client.release(s)
        if len(done) == len(slots):
            break
    assert paused_seen, "no request was rotated out: the pool was not small enough"
    assert [done[s] for s in slots] == reference.generate(weights, prompts, greedy(8))
    assert (ring.state == EMPTY).all()


def test_an_idle_loop_backs_off_and_any_work_resets_its_nap():
    nap = IdleNap(shortest_s=1e-4, longest_s=1e-3)
    quiet = [nap.after(False) for _ in range(8)]
    assert quiet[:5] == pytest.approx([1e-4, 2e-4, 4e-4, 8e-4, 1e-3])
    assert max(quiet) == 1e-3  # bounded: a request after a quiet spell waits at most 1 ms more
    assert nap.after(True) == 0 and nap.after(False) == 1e-4
    spin = IdleNap(shortest_s=0, longest_s=1e-3)  # shortest 0: a benchmark's spinning loop
    assert {spin.after(False) for _ in range(5)} == {0}
    with pytest.raises(ValueError, match="shortest_s <= longest_s"):
        IdleNap(shortest_s=1e-2, longest_s=1e-3)
