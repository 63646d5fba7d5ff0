"""Lab 5 — RotaSched. VLT against the project's NumPy formula, the ranking, the LVF decision on
hand-made steps, then the lab's policy driving the simulator decision for decision like the
project's LVF (``python -m blink_edu.labs check 5``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu import labs
from blink_edu.labs.checks import check_equal, check_number, check_values
from blink_edu.labs.plug import lab5
from blink_edu.sched.policies import LVF, RequestView, StepView, check_decision, view_vlt
from blink_edu.sched.vlt import ROTARY, RUNNING, WAITING, RotaSchedConfig

pytestmark = pytest.mark.lab5
CONFIG = RotaSchedConfig(alpha=3.0, beta_f=0.5, beta_b=0.2, ttft_slo_s=2.0, tbt_slo_s=0.1,
                         transfer_budget_blocks=6)


def impl(task: str):
    module = labs.implementation(5)
    name = {"5.1": "vlt", "5.2": "rank_by_vlt", "5.3": "lvf_decide"}[task]
    labs.require(getattr(module, name), task)
    return getattr(module, name)


@pytest.fixture(scope="module")
def vlt_fn():
    return impl("5.1")  # a stub fails here, before hypothesis draws a single example


@pytest.fixture(scope="module")
def decide_fn():
    return impl("5.3")


def req(rid, state, t_arr=0.0, t_run=math.nan, t_last=math.nan, held=0, to_run=1, on_host=0):
    return RequestView(request_id=rid, state=state, arrival_time=t_arr, run_start_time=t_run,
                       last_token_time=t_last, blocks_held=held, blocks_to_run=to_run,
                       blocks_on_host=on_host)


# --- 5.1 ------------------------------------------------------------------------------------------
@pytest.mark.task("5.1")
def test_vlt_of_each_state_by_hand():
    vlt = impl("5.1")
    now = 10.0
    check_number(vlt(req(0, RUNNING, t_run=7.5), now, CONFIG), -2.5, "RUNNING since 7.5, now 10")
    check_number(vlt(req(1, WAITING, t_arr=9.5), now, CONFIG), 0.0,
                 "WAITING since 9.5 (within beta_F * S_F = 1 s)")
    check_number(vlt(req(2, WAITING, t_arr=6.0), now, CONFIG), 3.0, "WAITING since 6 (4 s - 1 s)")
    check_number(vlt(req(3, ROTARY, t_last=9.0), now, CONFIG), 3 * (1 - 0.02),
                 "ROTARY, last token at 9 (alpha 3 * (1 s - 0.02 s))")
    check_number(vlt(req(4, ROTARY, t_arr=8.0), now, CONFIG), 3 * (2 - 0.02),
                 "ROTARY with no token yet, arrived at 8 (it lags from its arrival)")


@pytest.mark.task("5.1")
@settings(max_examples=50, deadline=None, report_multiple_bugs=False)
@given(st.lists(st.tuples(st.sampled_from([WAITING, RUNNING, ROTARY]), st.floats(0, 50),
                          st.floats(0, 50), st.one_of(st.just(math.nan), st.floats(0, 50))),
                min_size=1, max_size=8), st.floats(0, 60))
def test_vlt_equals_the_projects_formula(vlt_fn, rows, now):
    view = StepView(now=now, free_blocks=0,
                    requests=[req(i, s, a, r, t) for i, (s, a, r, t) in enumerate(rows)])
    expected = view_vlt(view, CONFIG)  # blink_edu.sched: vlt_numpy
    got = [vlt_fn(r, now, CONFIG) for r in view.requests]
    check_values(got, expected, 1e-9, "VLT of each request")


# --- 5.2 ------------------------------------------------------------------------------------------
@pytest.mark.task("5.2")
def test_rank_largest_lag_first_ties_in_fcfs_order():
    view = StepView(now=10.0, free_blocks=0, requests=[
        req(0, RUNNING, t_run=9.0), req(1, WAITING, t_arr=9.8), req(2, WAITING, t_arr=2.0),
        req(3, WAITING, t_arr=9.9), req(4, ROTARY, t_last=9.9), req(5, RUNNING, t_run=1.0)])
    ranked = [r.request_id for r in impl("5.2")(view, CONFIG)]
    # VLTs: 0: -1, 1: 0, 2: 7, 3: 0, 4: 3 * max(0, 0.1 - 0.02) = 0.24, 5: -9
    check_equal(ranked, [2, 4, 1, 3, 0, 5], "request ids ranked (VLTs -1, 0, 7, 0, 0.24, -9)")


# --- 5.3 ------------------------------------------------------------------------------------------
@pytest.mark.task("5.3")
def test_enough_memory_means_plain_fcfs():
    view = StepView(now=5.0, free_blocks=10, max_num_seqs=8, requests=[
        req(0, RUNNING, t_run=1.0, held=2, to_run=1), req(1, WAITING, t_arr=4.0, to_run=3),
        req(2, ROTARY, t_last=3.0, to_run=2, on_host=2)])
    d = impl("5.3")(view, CONFIG)
    check_equal(d.admit, [1, 2], "admitted")
    check_equal(d.preempted, [], "preempted")
    check_equal(d.fcfs_fallback, True, "fcfs_fallback (everything fits)")


@pytest.mark.task("5.3")
def test_under_pressure_admit_the_most_lagging_and_rotate_out_the_longest_running():
    view = StepView(now=10.0, free_blocks=1, max_num_seqs=8, requests=[
        req(0, RUNNING, t_run=2.0, held=5, to_run=0),   # VLT -8: the first to go
        req(1, RUNNING, t_run=8.0, held=3, to_run=0),   # VLT -2
        req(2, WAITING, t_arr=3.0, to_run=4),           # VLT 6
        req(3, WAITING, t_arr=9.5, to_run=2)])          # VLT 0
    d = impl("5.3")(view, CONFIG)
    check_decision(view, d)
    check_equal(d.admit, [2, 3], "admitted (largest VLT first)")
    check_equal(d.preempt_rotary, [0], "rotated out (the longest running)")
    check_equal(d.fcfs_fallback, False, "fcfs_fallback (memory pressure)")
    check_number(d.vlt.get(2, float("nan")), 6.0, "Decision.vlt[2]")
    check_number(d.vlt.get(0, float("nan")), -8.0, "Decision.vlt[0]")


def random_view(draw) -> StepView:
    n = draw(st.integers(1, 8))
    now = draw(st.floats(5, 30))
    reqs = []
    for i in range(n):
        state = draw(st.sampled_from([WAITING, RUNNING, ROTARY]))
        t_arr = draw(st.floats(0, now))
        held = draw(st.integers(1, 6)) if state == RUNNING else 0
        reqs.append(req(i, state, t_arr=t_arr, t_run=draw(st.floats(t_arr, now)),
                        t_last=draw(st.one_of(st.just(math.nan), st.floats(t_arr, now))),
                        held=held, to_run=draw(st.integers(0 if state == RUNNING else 1, 4)),
                        on_host=draw(st.integers(0, 4)) if state == ROTARY else 0))
    running = [r for r in reqs if r.state == RUNNING]
    growth = sum(r.blocks_to_run for r in running)
    free = draw(st.integers(growth, growth + 12))
    seats = draw(st.integers(max(1, len(running)), 10))
    return StepView(now=now, free_blocks=free, requests=reqs, max_num_seqs=seats)


def describe(view: StepView) -> str:
    """A step in a line: now, free blocks, seats, and each request's numbers."""
    names = {WAITING: "waiting", RUNNING: "running", ROTARY: "rotary"}
    reqs = "; ".join(f"{r.request_id} {names[r.state]} arrived {r.arrival_time:.3g}"
                     + (f" running since {r.run_start_time:.3g}" if r.state == RUNNING else "")
                     + (f" last token {r.last_token_time:.3g}" if r.state == ROTARY else "")
                     + f" holds {r.blocks_held} needs {r.blocks_to_run}"
                     + (f" on host {r.blocks_on_host}" if r.state == ROTARY else "")
                     for r in view.requests)
    return (f"the step at now={view.now:.3g} s, {view.free_blocks} free blocks, "
            f"{view.max_num_seqs} seats, requests: {reqs}")


@pytest.mark.task("5.3")
@settings(max_examples=60, deadline=None, report_multiple_bugs=False)
@given(data=st.data(), budget=st.integers(0, 8))
def test_decisions_equal_the_projects_lvf_on_random_steps(decide_fn, data, budget):
    view = random_view(data.draw)
    config = CONFIG.replace(transfer_budget_blocks=budget)
    got = decide_fn(view, config)
    want = LVF(config).decide(view)
    check_equal((got.admit, got.preempt_rotary, got.fcfs_fallback),
                (want.admit, want.preempt_rotary, want.fcfs_fallback),
                f"(admit, preempt_rotary, fcfs_fallback) with transfer budget {budget} for "
                f"{describe(view)}")


# --- everything, in the simulator -----------------------------------------------------------------
@pytest.mark.task("5.1")
@pytest.mark.task("5.2")
@pytest.mark.task("5.3")
def test_your_policy_drives_the_simulator_like_the_projects_lvf(vlt_fn, decide_fn):
    ours, theirs = lab5.Recording(lab5.lab_policy()), lab5.Recording(lab5.project_policy())
    result, summary = lab5.run(ours, rate=160.0, n=40)  # check_decision runs every step
    _, expected = lab5.run(theirs, rate=160.0, n=40)
    assert sum(not d.fcfs_fallback for _, d in ours.log) > 0, "memory pressure: LVF must decide"
    for step, ((view, a), (_, b)) in enumerate(zip(ours.log, theirs.log)):
        check_equal((a.admit, a.preempt_rotary), (b.admit, b.preempt_rotary),
                    f"(admit, preempt_rotary) at simulator step {step} (now={view.now:.3f} s)")
    check_equal(len(ours.log), len(theirs.log), "simulator steps")
    check_equal({**summary, "policy": None}, {**expected, "policy": None}, "the run's summary")
