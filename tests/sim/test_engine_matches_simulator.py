"""The simulator's schedule is the engine's: the real engine (scheduler, RotaSched policy,
DuplexKV rotation), run in *virtual* time charged by the simulator's own cost model, serves a
pressured workload with the attainments and latencies the simulator predicts. What is left of a
gap between ``bench.slo --real`` and its prediction is then the cost model (how long the machine
really takes), not the schedule."""

from __future__ import annotations

import types

import numpy as np
import pytest

from blink_edu.bench.replay import MeasuredRequest, record_tokens, requests_moved
from blink_edu.bench.slo_real import LENGTHS, PREDICTED
from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.engine import llm_engine, scheduler, sequence
from blink_edu.engine.llm_engine import LLMEngine, StepOutput
from blink_edu.executors.reference_executor import ReferenceExecutor
from blink_edu.model.micro import micro_weights
from blink_edu.sched.policies import make_policy
from blink_edu.sched.vlt import RotaSchedConfig
from blink_edu.sim.costs import CostModel
from blink_edu.sim.metrics import score
from blink_edu.sim.presets import PCIE_H200, Preset
from blink_edu.sim.simulator import simulate
from blink_edu.sim.workload import poisson_workload

# about the bundled model on the H200 as bench.slo --real fits it (bench/results/slo.json)
COST = CostModel(fixed_s=0.4e-3, per_token_s=5e-6, per_context_token_s=0.15e-6,
                 block_bytes=128 * 1024, link=PCIE_H200, per_move_s=100e-6,
                 per_decision_s=50e-6, per_mirror_step_s=40e-6, per_seq_s=100e-6, padded=True)
PRESET = Preset(name="engine-vs-sim", description="", cost=COST, num_gpu_blocks=96,
                max_num_seqs=16, max_num_batched_tokens=256, transfer_budget_blocks=16,
                lengths=LENGTHS, rates=(), num_requests=200)
STEP_S = 1.6e-3
CONFIG = RotaSchedConfig(ttft_slo_s=250 * STEP_S, tbt_slo_s=5 * STEP_S, transfer_budget_blocks=16,
                         decision_interval=4)


class ModelFreeExecutor:
    """An ``Executor`` that owns a KV pool (rotation copies real blocks) but runs no model: the
    tokens do not matter here (ignore_eos, max_tokens), the schedule does."""

    name = "model-free"
    block_size = 16
    compute_stream = None
    buckets = None  # steps at their own shape (the cost model pads, as the graph executor)

    def __init__(self, weights):
        self.kv_pool = ReferenceExecutor(weights, PRESET.num_gpu_blocks, self.block_size).kv_pool
        self.last = (0, 0)

    def step(self, batch):
        self.last = (batch.num_tokens, int((batch.positions[batch.logit_rows] + 1).sum()),
                     batch.num_seqs)
        return np.zeros(batch.num_seqs, np.int32)


def serve_in_virtual_time(weights, policy: str, workload, monkeypatch) -> list[MeasuredRequest]:
    """The engine's loop, each iteration charged ``COST.step_s`` of its batch, moves, decision
    and mirror on a virtual clock that the engine reads as ``time.monotonic``."""
    clock = [0.0]
    fake_time = types.SimpleNamespace(monotonic=lambda: clock[0])
    for module in (llm_engine, scheduler, sequence):
        monkeypatch.setattr(module, "time", fake_time)
    rotary = policy != "fcfs"
    executor = ModelFreeExecutor(weights)
    engine = LLMEngine(weights, EngineConfig(
        block_size=16, num_kv_blocks=PRESET.num_gpu_blocks, max_num_seqs=16,
        max_num_batched_tokens=256, preemption="rotate" if rotary else "recompute",
        num_host_kv_blocks=PRESET.num_gpu_blocks + len(workload) * 32, policy=policy),
        executor=executor)
    if rotary:
        engine.scheduler.policy = make_policy(policy, CONFIG)
    sched = engine.scheduler
    measured = {s.request_id: MeasuredRequest(s) for s in workload}
    pending = sorted(workload, key=lambda s: s.arrival_time)
    while pending or engine.has_unfinished():
        while pending and pending[0].arrival_time <= clock[0]:
            spec = pending.pop(0)
            engine.add_request([3] * spec.prompt_len, SamplingParams(
                temperature=0, max_tokens=spec.output_len, ignore_eos=True),
                request_id=spec.request_id, arrival_time=spec.arrival_time)
        if not engine.has_unfinished():
            clock[0] = pending[0].arrival_time
            continue
        moved = requests_moved(sched)
        batch, scheduled = sched.schedule()
        assert batch is not None, "nothing ran: the NumPy pool's copies land at once"
        executor.step(batch)
        tokens, context, seqs = executor.last
        clock[0] += COST.step_s(tokens, context, moves=requests_moved(sched) - moved,
                                decided=sched.last_decision is not None, mirrored=rotary,
                                seqs=seqs)
        produced = sched.postprocess(scheduled, np.zeros(len(scheduled), np.int32), clock[0])
        record_tokens(measured, [StepOutput(s.request_id, 0, s.is_finished, s.finish_reason)
                                 for s in produced], clock[0])
        for seq in produced:
            if seq.is_finished:
                del engine.requests[seq.request_id]
    return list(measured.values())


@pytest.mark.parametrize("policy", ["fcfs", "lvf", "waiting-first", "swapped-first"])
def test_the_engine_in_virtual_time_meets_the_simulators_prediction(policy, monkeypatch):
    weights = micro_weights(seed=5, scale=0.5, vocab_size=120,
                            max_position_embeddings=LENGTHS.max_model_len)
    workload = poisson_workload(PRESET.num_requests, 38.0, LENGTHS, seed=2)  # past the knee
    engine = score(serve_in_virtual_time(weights, policy, workload, monkeypatch),
                   CONFIG.ttft_slo_s, CONFIG.tbt_slo_s)
    sim = score(simulate(PRESET, make_policy(policy, CONFIG), workload).requests,
                CONFIG.ttft_slo_s, CONFIG.tbt_slo_s)
    assert min(sim["ttft_attainment_pct"], sim["tbt_attainment_pct"]) < 100, \
        "no pressure: the test would prove nothing"
    for key in ("ttft_attainment_pct", "tbt_attainment_pct"):
        assert engine[key] == pytest.approx(sim[key], abs=3), key
    # the schedules agree step for step for LVF and Waiting-First (the engine's t_run, arrival
    # times and blocks a rotary request needs are the simulator's); FCFS and Swapped-First
    # drift apart by about 1% (not traced yet)
    for key in PREDICTED:
        assert engine[key] == pytest.approx(sim[key], rel=0.05), key
