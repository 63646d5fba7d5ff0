"""RotaSched policies driving the real engine (engine/policy_step.py): every policy yields exactly
the reference's tokens — only *when* each request runs changes — while the KV pool is small
enough to force preemptions and rotations; afterwards no block is held anywhere."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.engine.llm_engine import LLMEngine
from blink_edu.model import reference
from blink_edu.model.micro import micro_weights

POLICIES = ["fcfs", "lvf", "waiting-first", "swapped-first"]


@pytest.fixture(scope="module")
def weights():
    return micro_weights(seed=5, scale=0.5, dtype=np.float64, vocab_size=120)


def run(engine: LLMEngine, arrivals: list[tuple[int, list[int], SamplingParams]]) -> dict:
    """Add each request at its step (``arrivals`` sorted by step), step to the end;
    request id -> tokens."""
    tokens, step, pending = {}, 0, list(arrivals)
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.pop(0)
            tokens[engine.add_request(prompt, params)] = []
        for out in engine.step():
            tokens[out.request_id].append(out.token_id)
        step += 1
        assert step < 2000, "the engine did not finish"
    return tokens


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_gives_the_reference_tokens_under_memory_pressure(weights, policy, rng):
    def arrival(i: int, step: int, prompt_len: int, max_tokens: int):
        return (step, rng.integers(3, 120, size=prompt_len).tolist(),
                SamplingParams(temperature=0.8 if i % 3 == 0 else 0, seed=i, ignore_eos=True,
                               max_tokens=max_tokens))

    # 10 blocks of 4 tokens. Two requests of 14 + 11 tokens at step 0 need 7 blocks each at
    # their end, so whatever the random rest does, the policy must preempt or rotate (a fully
    # random workload sometimes fit, seed 3706530902).
    arrivals = [arrival(i, 0, 14, 11) for i in range(2)]
    arrivals += [arrival(i, int(rng.integers(0, 12)), int(rng.integers(2, 14)), int(rng.integers(4, 12)))
                 for i in range(2, 10)]
    arrivals.sort(key=lambda a: a[0])  # request ids follow the order of adding
    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=10, max_num_seqs=4,
                                             max_num_batched_tokens=16, preemption="rotate",
                                             policy=policy))
    got = run(engine, arrivals)
    expected = reference.generate(weights, [a[1] for a in arrivals], [a[2] for a in arrivals],
                                  block_size=4)
    assert [got[i] for i in sorted(got)] == expected
    stats = engine.stats()
    assert stats.kv_blocks_used == 0 and stats.num_rotated == 0 and stats.host_kv_blocks_used == 0
    sched = engine.scheduler
    assert sched.num_recomputes + sched.num_rotations > 0, "the pool was not small enough"
    if policy == "fcfs":  # the built-in rules: a preemption is a recompute or a rotation, once
        assert sched.num_preemptions == sched.num_recomputes + sched.num_rotations
    if policy != "fcfs":
        assert sched.last_decision is not None  # the policy object decided the steps


def test_lvf_records_vlt_when_memory_runs_short(weights, rng):
    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=8, max_num_seqs=4,
                                             max_num_batched_tokens=16, preemption="rotate",
                                             policy="lvf"))
    vlt_steps = 0
    for i in range(6):
        engine.add_request(rng.integers(3, 120, size=10).tolist(),
                           SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
        decision = engine.scheduler.last_decision
        if decision is not None and not decision.fcfs_fallback:
            vlt_steps += 1
            assert decision.vlt and all(np.isfinite(v) for v in decision.vlt.values())
    assert vlt_steps > 0, "LVF never had to rank requests by VLT"


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown scheduling policy 'sjf'"):
        EngineConfig(policy="sjf")


def test_between_decisions_the_batch_stands(weights, rng):
    """decision_interval=3: the engine describes its requests to the policy at every third
    step (or when nothing runs) and admits nobody in between; the tokens do not change."""
    from blink_edu.sched.policies import make_policy
    from blink_edu.sched.vlt import RotaSchedConfig

    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=10, max_num_seqs=4,
                                             max_num_batched_tokens=16, preemption="rotate",
                                             policy="lvf"))
    engine.scheduler.policy = make_policy("lvf", RotaSchedConfig(decision_interval=3))
    params = [SamplingParams(temperature=0, max_tokens=int(rng.integers(4, 10)), ignore_eos=True)
              for _ in range(6)]
    prompts = [rng.integers(3, 120, size=int(rng.integers(4, 12))).tolist() for _ in range(6)]
    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    sched, tokens, decided, admitted = engine.scheduler, {i: [] for i in range(6)}, [], set()
    while engine.has_unfinished():
        running_before = {s.seq_id for s in sched.running}
        step = sched.num_iterations
        for out in engine.step():
            tokens[out.request_id].append(out.token_id)
        if sched.last_decision is not None:
            decided.append(step)
            admitted = set(sched.last_decision.admit)
        else:  # held: besides those running, only what the last decision admitted may enter
            assert {s.seq_id for s in sched.running} - running_before <= admitted
            assert step % 3 != 0 and running_before
    assert decided[0] == 0 and len(decided) < sched.num_iterations  # some steps were held
    assert sched.num_rotations > 0, "the pool was not small enough"
    assert [tokens[i] for i in range(6)] == reference.generate(weights, prompts, params,
                                                               block_size=4)


def count_forward_tokens(engine: LLMEngine) -> dict:
    """Wrap the engine's executor so that it counts the tokens each step feeds the model."""
    counts = {"tokens": 0}
    step = engine.executor.step

    def counting_step(batch):
        counts["tokens"] += batch.num_tokens
        return step(batch)

    engine.executor.step = counting_step
    return counts


def test_lvf_under_memory_pressure_does_no_more_model_work_than_fcfs(weights, rng):
    """16 requests at once on 24 blocks, a host arena no larger than the GPU pool: LVF rotates
    the batch around; when the host is full it must not turn its rotary preemptions into
    recomputes (each one re-runs the victim's whole context, and the victim, soon the most
    lagging, comes back to be preempted again: 6x FCFS's model work here, 10x the time of a
    served workload on a CPU). Same tokens as FCFS, and no more than 1.5x its forward work."""
    prompts = [rng.integers(3, 120, size=int(rng.integers(8, 20))).tolist() for _ in range(16)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    work, tokens = {}, {}
    for policy in ("fcfs", "lvf"):
        engine = LLMEngine(weights, EngineConfig(
            block_size=4, num_kv_blocks=24, num_host_kv_blocks=24, max_num_seqs=64,
            policy=policy, preemption="recompute" if policy == "fcfs" else "rotate"))
        counts = count_forward_tokens(engine)
        tokens[policy] = run(engine, [(0, p, params) for p in prompts])
        work[policy] = counts["tokens"]
        if policy == "lvf":
            assert engine.scheduler.num_rotations > 0, "LVF never rotated: no memory pressure"
    assert tokens["lvf"] == tokens["fcfs"]
    assert work["lvf"] <= 1.5 * work["fcfs"], work
