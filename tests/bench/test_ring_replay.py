"""bench.ring_replay: a seeded workload replayed through the ring to the persistent kernel (in
Numba's simulator: one block, a tiny model) is measured like a replay on the host engine --
every request's tokens timed, counted and scored -- and a ring too small for the workload pushes
back instead of dropping a request; one look at the ring (``poll_ring``) times, closes and
reports what the engine published; bench.slo_ring's summary and bench.hog's pinned threads."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.bench.hog import Cores, run_on
from blink_edu.bench.replay import MeasuredRequest
from blink_edu.bench.ring_replay import poll_ring, ring_replay
from blink_edu.bench.slo_ring import summary
from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.executors.persistent import PersistentExecutor
from blink_edu.model.micro import micro_weights
from blink_edu.ring import (DECODE_COMPLETED, DECODE_PROCESSING, EMPTY, FINISH_CODES,
                            PREFILL_PENDING, PREFILL_PROCESSING, Ring, RingClient, RingLayout)
from blink_edu.sim.metrics import score
from blink_edu.sim.workload import RequestSpec

# 2 lanes, 12 blocks of 4 tokens: two requests run at once; and a ring of 2 slots, so the third
# request finds it full until one is released
CONFIG = EngineConfig(block_size=4, num_kv_blocks=12, max_num_seqs=2, max_num_batched_tokens=8)
LAYOUT = RingLayout(num_slots=2, max_prompt_tokens=16, max_output_tokens=8)


def test_a_ring_replay_times_every_token_and_drops_nothing(rng):
    weights = micro_weights(seed=5, num_attention_heads=4, num_key_value_heads=2)
    workload = [RequestSpec(0, 0.0, 5, 2), RequestSpec(1, 0.0, 6, 3), RequestSpec(2, 0.01, 3, 1)]
    ring = Ring(bytearray(LAYOUT.nbytes), LAYOUT)
    executor = PersistentExecutor(weights, CONFIG, ring)
    executor.start()
    try:
        replay = ring_replay(executor, ring, workload, rng, weights.config.vocab_size,
                             poll_s=0.05, timeout_s=240)
    finally:
        executor.stop()
    assert (ring.state == EMPTY).all()  # every slot released
    for request in replay.requests:
        spec = request.spec
        assert len(request.token_times) == spec.output_len  # ignore_eos: every token
        assert spec.arrival_time <= request.first_token_time == request.token_times[0]
        assert request.token_times == sorted(request.token_times)
        assert request.finish_time == request.token_times[-1]
    counts = replay.counts
    assert counts["tokens"] == 2 + 3 + 1 and counts["steps"] >= 4
    assert counts["host_cpu_s"] > 0 and counts["host_cpu_us_per_token"] > 0
    assert counts["preemptions"] == counts["rotations"] == 0  # the pool holds them all
    assert counts["forward_us_per_step"] > 0 and counts["schedule_us_per_step"] > 0
    scored = score(replay.requests, ttft_slo_s=600, tbt_slo_s=600)
    assert scored["ttft_attainment_pct"] == scored["tbt_attainment_pct"] == 100


def test_run_on_pins_a_thread_and_re_raises():
    cores = Cores.of_this_process()
    assert run_on([cores.frontend], lambda: __import__("os").sched_getaffinity(0)) == {
        cores.frontend}
    with pytest.raises(ZeroDivisionError):
        run_on(cores.others, lambda: 1 / 0)


def row(ttft, tbt, cpu=10.0):
    return {"ttft_attainment_pct": ttft, "tbt_attainment_pct": tbt, "host_cpu_us_per_token": cpu}


def test_the_summary_reads_gaps_losses_and_host_shares_at_the_last_rate():
    executors = {
        "graph": {"quiet": {"fcfs": {"1.0": row(50, 100), "2.0": row(40, 100)},
                            "lvf": {"1.0": row(90, 99), "2.0": row(85, 97, cpu=40.0)}},
                  "hog": {"lvf": {"2.0": row(60, 70)}}},
        "persistent": {"quiet": {"fcfs": {"1.0": row(45, 100), "2.0": row(30, 100)},
                                 "lvf": {"1.0": row(95, 100), "2.0": row(80, 98, cpu=2.0)}},
                       "hog": {"lvf": {"2.0": row(79, 98)}}}}
    got = summary(executors, [1.0, 2.0])
    assert got["persistent_lvf_minus_fcfs_ttft_pts"] == 50
    assert got["persistent_lvf_minus_fcfs_tbt_pts"] == -2
    assert got["persistent_lvf_minus_fcfs_by_rate"]["1.0"] == {"ttft_pts": 50, "tbt_pts": 0}
    assert got["persistent_lvf_hog_ttft_loss_pts"] == 1 and got["persistent_lvf_hog_tbt_loss_pts"] == 0
    assert got["graph_lvf_hog_ttft_loss_pts"] == 25 and got["graph_lvf_hog_tbt_loss_pts"] == 27
    assert got["host_cpu_us_per_token_graph"] == 40 and got["host_cpu_us_per_token_persistent"] == 2
    assert "graph_lvf_minus_fcfs_ttft_pts" not in got  # the host engine's: real_lvf_minus_fcfs_*
    assert np.isfinite(list(v for k, v in got.items() if not k.endswith("by_rate"))).all()


def test_one_look_at_the_ring_times_new_tokens_and_closes_finished_requests():
    """``poll_ring`` with the engine's part played by hand: a slot that published two tokens has
    them timed; a slot completed with "length" is closed and released; one completed with
    "error" is reported, not scored as finished."""
    layout = RingLayout(num_slots=4, max_prompt_tokens=4, max_output_tokens=4)
    ring = Ring(bytearray(layout.nbytes), layout)
    client = RingClient(ring)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    slots = [client.submit([5, 6], params, request_id=i) for i in range(3)]
    active = {s: MeasuredRequest(RequestSpec(i, 0.0, 2, 3)) for i, s in enumerate(slots)}
    seen = np.zeros(layout.num_slots, np.int64)
    for slot, (generated, moves, reason) in zip(slots, [
            (2, (PREFILL_PROCESSING, DECODE_PROCESSING), None),
            (3, (PREFILL_PROCESSING, DECODE_PROCESSING, DECODE_COMPLETED), "length"),
            (0, (PREFILL_PROCESSING, DECODE_COMPLETED), "error")]):
        for before, after in zip((PREFILL_PENDING,) + moves, moves):  # the engine's moves
            ring.advance(slot, before, after)
        ring.generated[slot] = generated
        if reason:
            ring.finish_reason[slot] = FINISH_CODES[reason]
    running, done, failed_request = (active[s] for s in slots)
    failed = []
    poll_ring(ring, client, active, seen, 0.5, failed)
    assert running.token_times == [0.5, 0.5] and running.finish_time is None
    assert done.token_times == [0.5] * 3 and done.finish_time == 0.5
    assert failed == [(2, "error")] and failed_request.finish_time is None
    assert set(active) == {slots[0]} and seen[slots[0]] == 2
    assert (ring.state[slots[1:]] == EMPTY).all()  # released
    ring.generated[slots[0]] = 3
    poll_ring(ring, client, active, seen, 0.75, failed)
    assert running.token_times == [0.5, 0.5, 0.75] and running.first_token_time == 0.5
