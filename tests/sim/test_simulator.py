"""The discrete-event simulator: deterministic, conserves blocks, every policy produces the same
tokens (only their timing differs), and the cost model follows its measured points."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.sched import POLICIES, make_policy
from blink_edu.sim import PRESETS, RequestSpec, SimRequest, get_preset, poisson_workload, simulate
from blink_edu.sim.costs import KiB, MiB
from blink_edu.sim.metrics import meets_tbt, meets_ttft, summarize, tpot, ttft
from blink_edu.sim.presets import C2C_GH200, PCIE_H200
from blink_edu.sim.sweep import headline, run_one

PRESET = get_preset("qwen2.5-32b-gh200")


def small_run(policy, rate, n=40, seed=0, **options):
    workload = poisson_workload(n, rate, PRESET.lengths, seed)
    return simulate(PRESET, make_policy(policy, PRESET.rotasched_config()), workload, **options)


def token_times(result):
    return [tuple(r.token_times) for r in result.requests]


def test_deterministic_for_a_seed(rng):
    seed = int(rng.integers(1 << 30))
    a, b = small_run("lvf", 8.0, seed=seed), small_run("lvf", 8.0, seed=seed)
    assert token_times(a) == token_times(b)
    assert [r.transitions for r in a.requests] == [r.transitions for r in b.requests]
    assert token_times(small_run("lvf", 8.0, seed=seed + 1)) != token_times(a)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_request_gets_exactly_its_tokens_and_blocks_come_back(policy):
    result = small_run(policy, 8.0)  # far above capacity: memory pressure, preemptions
    assert result.completed
    for r in result.requests:
        assert len(r.token_times) == r.spec.output_len
        assert np.all(np.diff(r.token_times) > 0)
        assert r.first_token_time > r.spec.arrival_time
        assert r.gpu_blocks == 0
    assert len(result.free_blocks) == result.steps
    assert result.free_blocks.min() >= 0 and result.free_blocks.max() <= PRESET.num_gpu_blocks


def test_pressure_makes_policies_differ_and_rotation_move_blocks():
    lvf, fcfs = small_run("lvf", 20.0, n=80), small_run("fcfs", 20.0, n=80)
    assert sum(r.num_preemptions for r in fcfs.requests) > 0 and fcfs.blocks_in == 0
    assert lvf.blocks_in > 0 and lvf.blocks_out > 0
    assert token_times(lvf) != token_times(fcfs)


def test_at_a_low_rate_every_policy_is_fcfs():
    runs = [small_run(p, 0.5, n=12) for p in sorted(POLICIES)]
    assert all(token_times(r) == token_times(runs[0]) for r in runs)
    assert all(sum(q.num_preemptions for q in r.requests) == 0 for r in runs)


def test_max_time_cuts_a_run_short():
    result = small_run("fcfs", 50.0, n=40, max_time_s=3.0)
    assert not result.completed
    assert result.end_time < 3.0 + 1.0
    summary = summarize(result, 5.0, 0.1)
    assert summary["finished"] < 40 and summary["tbt_attainment_pct"] < 100


def test_metrics_by_hand():
    r = SimRequest(RequestSpec(0, arrival_time=1.0, prompt_len=8, output_len=3))
    r.token_times = [3.0, 3.1, 3.4]
    r.first_token_time, r.finish_time = 3.0, 3.4
    assert ttft(r) == pytest.approx(2.0) and tpot(r) == pytest.approx(0.2)
    assert meets_ttft(r, 2.0) and not meets_ttft(r, 1.9)
    assert meets_tbt(r, 0.2) and not meets_tbt(r, 0.19)
    r.finish_time = None
    assert not meets_tbt(r, 1.0)  # unfinished: a miss


def test_bandwidth_curve_passes_through_its_points_and_grows():
    for curve in (PCIE_H200, C2C_GH200):
        for size, gbps in zip(curve.sizes_bytes, curve.gbps):
            assert curve.bandwidth_gbps(size) == pytest.approx(gbps)
        sizes = np.geomspace(16 * KiB, 256 * MiB, 30)
        bw = [curve.bandwidth_gbps(s) for s in sizes]
        assert np.all(np.diff(bw) >= 0)
        one = curve.one_way_s(64 * MiB)
        both = curve.both_ways_s(64 * MiB, 64 * MiB)
        assert one < both < 2 * one  # duplex helps, but each way gets only half the total


def test_presets_are_consistent():
    assert PRESET.cost.block_bytes == 4 * MiB  # 64 layers x 2 x 16 x 8 x 128 x bf16
    for name in PRESETS:
        preset = get_preset(name)
        assert preset.num_gpu_blocks * preset.block_size >= preset.lengths.max_model_len
        small = preset.cost.step_s(1, 100)
        assert 0 < small < preset.cost.step_s(preset.max_num_batched_tokens, 100_000)
    with pytest.raises(ValueError, match="qwen2.5-32b-gh200"):
        get_preset("tpu")


def test_headline_picks_the_most_pressured_completed_rate():
    results = {p: {r: run_one(PRESET, p, r, num_requests=30)[0] for r in (1.0, 6.0)}
               for p in ("lvf", "fcfs")}
    h = headline(results)
    completed = [r for r in (1.0, 6.0) if results["fcfs"][r]["completed"]]
    assert h["headline_rate"] == completed[-1]
    d = results["lvf"][h["headline_rate"]]["ttft_attainment_pct"] - \
        results["fcfs"][h["headline_rate"]]["ttft_attainment_pct"]
    assert h["lvf_minus_fcfs_ttft_attainment_pts"] == pytest.approx(d)


def test_vlt_trace_records_every_live_request():
    result = small_run("lvf", 8.0, n=20, record_vlt=True)
    assert len(result.vlt_trace) >= result.steps
    for t, ids, states, vlt in result.vlt_trace[:50]:
        assert ids.shape == states.shape == vlt.shape
        assert np.all(vlt[states == 1] <= 0) and np.all(vlt[states != 1] >= 0)


@pytest.mark.parametrize("interval", [1, 4])
def test_the_policy_decides_every_interval_and_each_decision_costs(interval):
    """A policy with decision_interval k decides at every k-th step (and when nothing runs);
    only those steps pay ``per_decision_s``, and the tokens are the same."""
    from dataclasses import replace

    class Counting(type(make_policy("lvf"))):
        def decide(self, view):
            self.decided.append(view.now)
            return super().decide(view)

    cost = 1e-3
    preset = replace(PRESET, cost=replace(PRESET.cost, per_decision_s=cost))
    workload = poisson_workload(30, 8.0, PRESET.lengths, 1)
    policy = Counting(PRESET.rotasched_config(decision_interval=interval))
    policy.decided = []
    result = simulate(preset, policy, workload)
    assert result.completed
    assert all(len(r.token_times) == r.spec.output_len for r in result.requests)
    decided_steps = np.isin(result.step_starts, policy.decided)  # (steps,)
    assert decided_steps[0] and decided_steps.sum() <= len(set(policy.decided))
    assert (result.step_times[decided_steps] >= cost).all()
    if interval == 1:
        assert decided_steps.all()
    else:  # every interval-th step decides; a few more where nothing was running
        every_kth = np.arange(result.steps) % interval == 0
        assert (decided_steps >= every_kth).all()
        assert decided_steps.sum() < 0.5 * result.steps
    assert preset.cost.step_s(8, 100, decided=True) - preset.cost.step_s(8, 100) == pytest.approx(cost)
