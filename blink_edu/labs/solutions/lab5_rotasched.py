"""Lab 5 reference solution (instructors only)."""

from __future__ import annotations

import math

from ...sched.policies import Decision, RequestView, StepView  # noqa: F401
from ...sched.vlt import ROTARY, RUNNING, WAITING, RotaSchedConfig  # noqa: F401


def vlt(request: RequestView, now: float, config: RotaSchedConfig) -> float:
    if request.state == RUNNING:
        return -(now - request.run_start_time)
    if request.state == WAITING:
        return max(0.0, now - request.arrival_time - config.beta_f * config.ttft_slo_s)
    if request.state == ROTARY:
        last = request.last_token_time
        if math.isnan(last):
            last = request.arrival_time
        return config.alpha * max(0.0, now - last - config.beta_b * config.tbt_slo_s)
    return math.nan


def rank_by_vlt(view: StepView, config: RotaSchedConfig) -> list:
    lag = {id(r): vlt(r, view.now, config) for r in view.requests}
    return sorted(view.requests, key=lambda r: -lag[id(r)])


def lvf_decide(view: StepView, config: RotaSchedConfig) -> Decision:
    running = [r for r in view.requests if r.state == RUNNING]
    waiting_or_rotary = [r for r in view.requests if r.state != RUNNING]
    growth = sum(r.blocks_to_run for r in running)
    seats = view.max_num_seqs - len(running)
    wanted = sum(r.blocks_to_run for r in waiting_or_rotary)
    if wanted + growth <= view.free_blocks and len(waiting_or_rotary) <= seats:
        return Decision(admit=[r.request_id for r in waiting_or_rotary], fcfs_fallback=True)

    ranking = rank_by_vlt(view, config)
    reclaimable = sum(r.blocks_held + r.blocks_to_run for r in running)
    room = min(view.free_blocks + config.transfer_budget_blocks - growth,
               view.free_blocks - growth + reclaimable)
    chosen = []
    for r in ranking:
        if r.state == RUNNING:
            continue
        if r.blocks_to_run > room:
            break
        chosen.append(r)
        room -= r.blocks_to_run

    short = sum(r.blocks_to_run for r in chosen) + growth - view.free_blocks
    victims = []
    for r in reversed(ranking):
        if r.state != RUNNING:
            continue
        if short <= 0 and len(running) - len(victims) + len(chosen) <= view.max_num_seqs:
            break
        victims.append(r)
        short -= r.blocks_held + r.blocks_to_run
    while chosen and len(running) - len(victims) + len(chosen) > view.max_num_seqs:
        chosen.pop()
    return Decision(admit=[r.request_id for r in chosen],
                    preempt_rotary=[r.request_id for r in victims],
                    vlt={r.request_id: vlt(r, view.now, config) for r in view.requests})
