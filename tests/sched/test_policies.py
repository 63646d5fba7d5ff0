"""Scheduling policies (SuperInfer §3): LVF's properties with hypothesis, and the baselines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu.sched import (FCFS, LVF, POLICIES, ROTARY, RUNNING, WAITING, PolicyError,
                             RequestView, RotaSchedConfig, StepView, check_decision, make_policy)
from blink_edu.sched.policies import SwappedFirst, WaitingFirst, view_vlt
from policy_views import request_view


@st.composite
def step_views(draw, max_requests=12):
    now = draw(st.floats(10.0, 100.0))
    n = draw(st.integers(0, max_requests))
    requests = []
    for i in range(n):
        state = draw(st.sampled_from([WAITING, RUNNING, ROTARY]))
        t_arr = now - draw(st.floats(0.0, 9.0))
        t_run = draw(st.floats(t_arr, now)) if state == RUNNING else float("nan")
        t_last = draw(st.one_of(st.just(float("nan")), st.floats(t_arr, now)))
        held = draw(st.integers(1, 8)) if state == RUNNING else 0
        to_run = draw(st.integers(0, 1)) if state == RUNNING else draw(st.integers(1, 10))
        requests.append(RequestView(
            request_id=100 + i, state=state, arrival_time=t_arr, run_start_time=t_run,
            last_token_time=t_last, blocks_held=held, blocks_to_run=to_run,
            blocks_on_host=to_run if state == ROTARY else 0))
    num_running = sum(r.state == RUNNING for r in requests)  # a valid view: they all fit
    return StepView(now=now, free_blocks=draw(st.integers(0, 40)), requests=requests,
                    max_num_seqs=draw(st.integers(max(1, num_running), 16)))


configs = st.builds(RotaSchedConfig, alpha=st.floats(1.0, 5.0), beta_f=st.floats(0.0, 1.0),
                    beta_b=st.floats(0.0, 2.0), transfer_budget_blocks=st.integers(0, 30))


@settings(max_examples=200, deadline=None)
@given(view=step_views(), config=configs, name=st.sampled_from(sorted(POLICIES)))
def test_every_policy_keeps_the_block_and_seat_budget(view, config, name):
    # check_decision: admitted + growth of those staying <= free + preempted blocks; seats.
    check_decision(view, make_policy(name, config).decide(view))


def _memory_suffices(view):
    running = view.in_state(RUNNING)
    others = [r for r in view.requests if r.state != RUNNING]
    need = sum(r.blocks_to_run for r in view.requests)
    return need <= view.free_blocks and len(running) + len(others) <= view.max_num_seqs


@settings(max_examples=200, deadline=None)
@given(view=step_views(), config=configs)
def test_lvf_is_fcfs_when_memory_suffices(view, config):
    decision = LVF(config).decide(view)
    if _memory_suffices(view):
        assert decision.fcfs_fallback
        assert decision.admit == [r.request_id for r in view.requests if r.state != RUNNING]
        assert decision.preempted == []
        assert decision.admit == FCFS(config).decide(view).admit
    else:
        assert not decision.fcfs_fallback


@settings(max_examples=200, deadline=None)
@given(view=step_views(), config=configs)
def test_lvf_never_admits_beyond_free_plus_transfer_budget(view, config):
    decision = LVF(config).decide(view)
    if decision.fcfs_fallback:
        return
    by_id = {r.request_id: r for r in view.requests}
    admitted = sum(by_id[i].blocks_to_run for i in decision.admit)
    assert admitted <= view.free_blocks + config.transfer_budget_blocks


@settings(max_examples=200, deadline=None)
@given(view=step_views(), config=configs)
def test_lvf_admits_from_the_head_and_preempts_from_the_tail(view, config):
    decision = LVF(config).decide(view)
    if decision.fcfs_fallback:
        return
    vlt = dict(zip([r.request_id for r in view.requests], view_vlt(view, config)))
    running = [r.request_id for r in view.in_state(RUNNING)]
    preempted = set(decision.preempted)
    # the most advanced (most negative VLT = running longest) go first
    if preempted:
        assert max(vlt[i] for i in preempted) <= min(
            (vlt[i] for i in running if i not in preempted), default=np.inf)
    # admitted: a prefix of the waiting/rotary requests in VLT order (ties in FCFS order)
    candidates = [r.request_id for r in view.requests if r.state != RUNNING]
    ranked = sorted(candidates, key=lambda i: -vlt[i])  # sorted() is stable: FCFS among ties
    assert decision.admit == ranked[:len(decision.admit)]
    assert all(view.requests[[r.request_id for r in view.requests].index(i)].state == RUNNING
               for i in preempted)


def test_lvf_rotates_the_longest_running_out_for_a_lagging_request():
    now = 10.0
    view = StepView(now=now, free_blocks=0, requests=[
        request_view(1, RUNNING, run_start_time=1.0),  # running for 9 s: VLT -9 (most advanced)
        request_view(2, RUNNING, run_start_time=8.0),  # VLT -2
        request_view(3, WAITING, arrival_time=4.0, blocks_to_run=3),  # waited 6 s: VLT 3.5
    ])
    decision = LVF(RotaSchedConfig()).decide(view)
    assert decision.admit == [3]
    assert decision.preempt_rotary == [1] and decision.preempt_recompute == []
    assert decision.vlt[3] == pytest.approx(3.5) and decision.vlt[1] == pytest.approx(-9.0)


def test_fcfs_preempts_the_newest_by_recompute_and_admits_nobody_that_step():
    view = StepView(now=10.0, free_blocks=0, requests=[
        request_view(1, RUNNING, blocks_to_run=1), request_view(2, RUNNING, blocks_to_run=1),
        request_view(3, WAITING, blocks_to_run=1)])
    decision = FCFS(RotaSchedConfig()).decide(view)
    assert decision.preempt_recompute == [2] and decision.admit == []


@pytest.mark.parametrize("name, first", [("waiting-first", 1), ("swapped-first", 2)])
def test_static_offload_priorities(name, first):
    view = StepView(now=10.0, free_blocks=2, requests=[
        request_view(1, WAITING, blocks_to_run=2), request_view(2, ROTARY, blocks_to_run=2, blocks_on_host=2)])
    assert make_policy(name).decide(view).admit == [first]


def test_check_decision_catches_over_commitment():
    view = StepView(now=10.0, free_blocks=1, requests=[request_view(1, WAITING, blocks_to_run=2)])
    from blink_edu.sched import Decision
    with pytest.raises(PolicyError):
        check_decision(view, Decision(admit=[1]))


def test_make_policy_names_the_choices():
    assert set(POLICIES) == {"lvf", "fcfs", "waiting-first", "swapped-first"}
    assert make_policy("lvf", RotaSchedConfig(alpha=2.0)).config.alpha == 2.0
    with pytest.raises(ValueError, match="lvf, fcfs, waiting-first, swapped-first"):
        make_policy("round-robin")


@pytest.mark.parametrize("policy", [SwappedFirst, WaitingFirst])
def test_a_rotary_request_larger_than_the_transfer_budget_still_comes_back_alone(policy):
    """B_xfer caps swap-ins per step, but the first of a step may exceed it on its own: else a
    rotary request with more KV than the budget never returns (found on the H200: the static
    policies stalled with B_xfer = 8 blocks and 10-block requests)."""
    view = StepView(now=10.0, free_blocks=30, requests=[
        request_view(1, ROTARY, blocks_to_run=10, blocks_on_host=10),
        request_view(2, ROTARY, blocks_to_run=10, blocks_on_host=10)])
    decision = policy(RotaSchedConfig(transfer_budget_blocks=8)).decide(view)
    assert decision.admit == [1]  # one, over budget; not the second
    check_decision(view, decision)


@settings(max_examples=100, deadline=None)
@given(interval=st.integers(1, 8), step=st.integers(0, 200), num_running=st.integers(0, 4),
       name=st.sampled_from(sorted(POLICIES)))
def test_a_policy_decides_every_interval_and_whenever_nothing_runs(interval, step, num_running,
                                                                   name):
    policy = make_policy(name, RotaSchedConfig(decision_interval=interval))
    expected = name == "fcfs" or step % interval == 0 or num_running == 0
    assert policy.decides_at(step, num_running) == expected


@settings(max_examples=200, deadline=None)
@given(view=step_views(), config=configs, name=st.sampled_from(sorted(POLICIES)))
def test_hold_admits_nobody_and_preempts_only_the_newest_for_growth(view, config, name):
    policy = make_policy(name, config)
    decision = policy.hold(view)
    check_decision(view, decision)
    assert decision.admit == []
    running = view.in_state(RUNNING)
    preempted = decision.preempted
    # the newest running requests, newest first, and only as many as the growth needs
    assert preempted == [r.request_id for r in reversed(running)][:len(preempted)]
    growth = sum(r.blocks_to_run for r in running)
    if growth <= view.free_blocks:
        assert preempted == []


def test_a_bad_decision_interval_is_refused():
    with pytest.raises(ValueError, match="decision_interval"):
        RotaSchedConfig(decision_interval=0)
