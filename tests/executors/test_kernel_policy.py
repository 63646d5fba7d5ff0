"""RotaSched inside the persistent kernel: its glue against the host engine's.

``persistent_kernel.describe_lanes`` must list the kernel's lanes as ``engine/policy_step.py``'s
``describe`` lists the engine's sequences — FCFS order (running in order of admission, then
waiting, then rotated out), the same blocks held, blocks to run, blocks on the host and times —
and ``decide`` must then answer what the host policy answers on that view. (``decide_step``
itself is checked against the host policies in tests/sched/test_device_policy.py; this is the
part between the lanes and it.) Random lanes, one block, in the simulator or on a GPU.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import int32

from blink_edu.executors import persistent_kernel as pk
from blink_edu.executors.persistent import policy_words
from blink_edu.kernels.reduce import THREADS, cuda
from blink_edu.sched.policies import RequestView, StepView, make_policy
from blink_edu.sched.vlt import ROTARY, RUNNING, WAITING, RotaSchedConfig

B, W, LANES, MAX_RUNNING = 4, 8, 8, 3  # block size, block-table width, lanes, batch limit
NOW_NS = 50 * 10**9  # the kernel's clock at the decision (host monotonic ns)
GROUPS = (RUNNING, WAITING, ROTARY)  # lane_group's 0, 1, 2


@cuda.jit
def describe_and_decide_kernel(q, block_size, now_ns, answer):
    """describe_lanes, then the block decides (LVF's ranking by every thread, the rest by
    thread 0); answer (3,): admitted, preempted, requests."""
    sizes = cuda.shared.array(4, int32)
    pk.describe_lanes(q, block_size, sizes)
    if cuda.threadIdx.x == 0:
        answer[2] = sizes[3]
    pk.decide(q, sizes[3], now_ns, answer)


@st.composite
def lane_sets(draw):
    """(lanes (LANES, fields) i64, block tables, host tables (LANES, W) i32, free GPU blocks):
    each lane empty, running (decoding or part-way through its prompt), waiting or rotated out,
    with distinct admission orders and times up to 20 s before NOW_NS (-1: not yet)."""
    lanes = np.zeros((LANES, pk.NUM_LANE_FIELDS), np.int64)
    lanes[:, pk.L_SLOT] = -1
    tables = np.full((LANES, W), -1, np.int32)
    host_tables = np.full((LANES, W), -1, np.int32)
    orders = draw(st.permutations(range(LANES)))
    next_block = 0
    for s in range(LANES):
        kind = draw(st.sampled_from(("empty", "running", "waiting", "rotary")))
        if kind == "empty":
            continue
        known = draw(st.integers(1, B * (W - 1)))
        cached = draw(st.integers(0 if kind != "rotary" else 1, known)) if kind != "waiting" else 0
        arrival = NOW_NS - draw(st.integers(0, 20 * 10**9))
        ran = kind == "running" or (kind == "rotary" and draw(st.booleans()))
        run = draw(st.integers(arrival, NOW_NS)) if ran or kind == "running" else -1
        last = draw(st.integers(run, NOW_NS)) if run >= 0 and draw(st.booleans()) else -1
        lanes[s, [pk.L_SLOT, pk.L_ORDER, pk.L_LEN, pk.L_CACHED, pk.L_PROMPT]] = (
            s, orders[s], known, cached, known)
        lanes[s, [pk.L_RUNNING, pk.L_ROTATED]] = (kind == "running", kind == "rotary")
        lanes[s, [pk.L_ARRIVAL_NS, pk.L_RUN_NS, pk.L_LAST_NS]] = arrival, run, last
        held = -(-cached // B)
        if kind in ("running", "rotary"):
            rows = tables if kind == "running" else host_tables
            rows[s, :held] = np.arange(next_block, next_block + held)
            next_block += held
        if kind == "running":  # DuplexKV's mirror: some full blocks copied out already, which
            synced = draw(st.integers(0, cached // B))  # the policy must not count as on host
            host_tables[s, :synced] = np.arange(next_block, next_block + synced)
            lanes[s, pk.L_SYNCED] = synced
            next_block += synced
    return lanes, tables, host_tables, draw(st.integers(0, 12))


def scheduler_state(lanes, tables, host_tables, free, policy):
    """A SchedulerState around the drawn lanes (the fields describe_lanes and decide read; the
    rest the smallest arrays of the right kind)."""
    d, i32, L = cuda.to_device, np.int32, lanes.shape[0]
    return pk.SchedulerState(
        lanes=d(lanes), lane_sampling=d(np.zeros((L, 2), np.float32)),
        lane_stop_ids=d(np.zeros((L, 1), i32)), eos_ids=d(np.zeros(1, i32)),
        block_tables=d(tables), free_blocks=d(np.arange(max(free, 1), dtype=i32)),
        free_top=d(np.array([free], i32)), sched=d(np.zeros(pk.NUM_SCHED_WORDS, np.int64)),
        candidates=d(np.zeros(pk.MAX_CANDIDATES, i32)), kv_blocks=d(np.zeros((1, 1), np.float32)),
        host_kv=d(np.zeros((1, 1), np.float32)), host_tables=d(host_tables),
        host_free_blocks=d(np.zeros(1, i32)), host_free_top=d(np.zeros(1, i32)),
        policy=d(policy), decide_ints=d(np.zeros((8, L), i32)),
        decide_floats=d(np.zeros((4, L), np.float64)),
        mirror_pairs=d(np.zeros((2, pk.MAX_MIRROR_BLOCKS), i32)))


def seconds(ns) -> float:
    return math.nan if ns < 0 else ns * 1e-9


def host_view(lanes, tables, host_tables, free) -> StepView:
    """The StepView engine/policy_step.py's ``describe`` would build for these requests: the
    lane index as the request id."""
    def group(s):
        if lanes[s, pk.L_SLOT] < 0:
            return -1
        return 0 if lanes[s, pk.L_RUNNING] else (2 if lanes[s, pk.L_ROTATED] else 1)

    listed = sorted((s for s in range(LANES) if group(s) >= 0),
                    key=lambda s: (group(s), lanes[s, pk.L_ORDER]))
    views = []
    for s in listed:
        held = int((tables[s] >= 0).sum())
        views.append(RequestView(
            s, GROUPS[group(s)], seconds(lanes[s, pk.L_ARRIVAL_NS]),
            seconds(lanes[s, pk.L_RUN_NS]), seconds(lanes[s, pk.L_LAST_NS]), held,
            max(0, -(-int(lanes[s, pk.L_LEN]) // B) - held),
            int((host_tables[s] >= 0).sum()) if group(s) == 2 else 0))  # rotary: to swap in
    return StepView(now=NOW_NS * 1e-9, free_blocks=free, requests=views,
                    max_num_seqs=MAX_RUNNING)


# RotaSched's parameters, drawn (SLOs at the scale of the drawn times: seconds)
configs = st.builds(RotaSchedConfig, alpha=st.floats(1.0, 5.0), beta_f=st.floats(0.0, 1.0),
                    beta_b=st.floats(0.0, 2.0), ttft_slo_s=st.floats(1.0, 8.0),
                    tbt_slo_s=st.floats(0.02, 0.3), transfer_budget_blocks=st.integers(0, 30))


def check_policy(name, drawn, config):
    lanes, tables, host_tables, free = drawn
    q = scheduler_state(lanes, tables, host_tables, free, policy_words(name, MAX_RUNNING, config))
    answer = cuda.to_device(np.zeros(3, np.int32))
    describe_and_decide_kernel[1, THREADS](q, B, NOW_NS, answer)
    num_admitted, num_preempted, n = answer.copy_to_host()
    view = host_view(lanes, tables, host_tables, free)
    ints, floats = q.decide_ints.copy_to_host(), q.decide_floats.copy_to_host()  # (8|4, LANES)
    listed = [RequestView(int(ints[pk.D_LANE, c]), int(ints[pk.D_STATE, c]),
                          *floats[[pk.D_T_ARR, pk.D_T_RUN, pk.D_T_LAST], c].tolist(),
                          *ints[[pk.D_HELD, pk.D_TO_RUN, pk.D_ON_HOST], c].tolist())
              for c in range(n)]
    assert len(listed) == len(view.requests)
    for got, want in zip(listed, view.requests):  # the same numbers (NaN: the same "not yet")
        assert np.array_equal(np.array(got, float), np.array(want, float), equal_nan=True), \
            f"{got} != {want}"
    decision = make_policy(name, config).decide(view)
    lane_of = ints[pk.D_LANE]
    assert [int(lane_of[i]) for i in ints[pk.D_ADMIT, :num_admitted]] == list(decision.admit)
    assert ([int(lane_of[i]) for i in ints[pk.D_PREEMPT, :num_preempted]]
            == list(decision.preempt_rotary))
    return num_admitted, num_preempted


def test_the_kernel_lists_its_lanes_and_decides_as_the_host_engine():
    for name in ("lvf", "waiting-first", "swapped-first"):
        answers = []

        @settings(max_examples=40, deadline=None)
        @given(drawn=lane_sets(), config=configs)
        def check(drawn, config):
            answers.append(check_policy(name, drawn, config))

        check()
        # the draws were not all trivial: some decisions admitted, some preempted
        assert any(a for a, _ in answers) and any(p for _, p in answers), (name, answers)
