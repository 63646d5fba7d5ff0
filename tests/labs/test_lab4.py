"""Lab 4 — DuplexKV. The books and the plan on hand-made cases, then inside the engine's rotation
under memory pressure: exactly the reference's tokens, and rotate-outs that move only the dirty
tail (``python -m blink_edu.labs check 4``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu import labs
from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.kv.block_manager import COPY_OUT, DIRTY, FREE, SYNCED
from blink_edu.labs.checks import check_equal, check_tokens
from blink_edu.labs.plug import lab4
from blink_edu.model import reference

pytestmark = pytest.mark.lab4


def impl(task: str):
    module = labs.implementation(4)
    name = {"4.1": "mark_written", "4.2": "on_written", "4.3": "blocks_to_rotate_out",
            "4.4": "plan_batched_copy"}[task]
    labs.require(getattr(module, name), task)
    return getattr(module, name)


@pytest.fixture(scope="module")
def mark_fn():
    return impl("4.1")  # a stub fails here, before hypothesis draws a single example


@pytest.fixture(scope="module")
def plan_fn():
    return impl("4.4")


# --- 4.1 ------------------------------------------------------------------------------------------
@pytest.mark.task("4.1")
def test_blocks_become_synced_when_they_fill():
    states = np.full(10, FREE, np.int8)
    table = [7, 2, 9]
    states[table] = DIRTY
    mark = impl("4.1")
    check_equal(list(mark(states, table, 0, 3, 4)), [], "filled by tokens 0-2 (block 7 not full)")
    check_equal(states[7], DIRTY, "block 7 after 3 of its 4 tokens (DIRTY=1)")
    check_equal(list(mark(states, table, 3, 9, 4)), [7, 2],
                "filled by tokens 3-8 (blocks 7 and 2; block 9 holds one token)")
    check_equal(states[[7, 2, 9]], [SYNCED, SYNCED, DIRTY], "states of blocks 7, 2, 9 (SYNCED=2)")
    check_equal(list(mark(states, table, 9, 12, 4)), [9], "filled by tokens 9-11")
    assert (np.delete(states, table) == FREE).all(), "only the table's blocks may change"


@pytest.mark.task("4.1")
@settings(max_examples=30, deadline=None, report_multiple_bugs=False)
@given(steps=st.lists(st.integers(1, 7), min_size=1, max_size=6), block_size=st.integers(1, 5))
def test_synced_blocks_are_exactly_the_full_ones(mark_fn, steps, block_size):
    total = sum(steps)
    n_blocks = -(-total // block_size)
    table = [int(b) for b in np.random.default_rng(total).permutation(64)[:n_blocks]]
    states = np.full(64, FREE, np.int8)
    states[table] = DIRTY
    written, filled_all = 0, []
    for n in steps:
        filled_all += list(mark_fn(states, table, written, written + n, block_size))
        written += n
    full = table[: written // block_size]
    assert filled_all == full, "each block is reported once, when it fills, in table order"
    check_equal(states[full], [SYNCED] * len(full), "states of the full blocks (SYNCED=2)")
    check_equal(states[table[len(full):]], [DIRTY] * (len(table) - len(full)),
                "state of the partly filled tail (DIRTY=1)")


# --- 4.2 ------------------------------------------------------------------------------------------
@pytest.mark.task("4.2")
def test_written_blocks_go_stale_and_filled_ones_queue_for_copy_out():
    mirrored, pending = {0, 1, 2}, set()
    impl("4.2")(mirrored, pending, 6, 13, 4)  # tokens 6..12 touch blocks 1, 2, 3
    check_equal(mirrored, {0}, "mirrored after tokens 6-12 (blocks 1-3 written: stale)")
    check_equal(pending, {1, 2}, "pending copy-out (blocks 1 and 2 full now; 3 is the tail)")
    impl("4.2")(mirrored, pending, 13, 14, 4)
    check_equal(pending, {1, 2}, "pending copy-out after token 13 (block 3 still not full)")
    check_equal(mirrored, {0}, "mirrored after token 13")


@pytest.mark.task("4.2")
def test_a_prompt_filling_blocks_exactly_queues_them_all():
    mirrored, pending = set(), set()
    impl("4.2")(mirrored, pending, 0, 8, 4)
    check_equal(pending, {0, 1}, "pending copy-out after an 8-token prompt (both blocks full)")
    check_equal(mirrored, set(), "mirrored")


# --- 4.3 ------------------------------------------------------------------------------------------
@pytest.mark.task("4.3")
def test_rotate_out_moves_what_has_no_current_host_copy():
    rotate = impl("4.3")
    check_equal(list(rotate(4, {0, 1, 2})), [3], "4 blocks, 0-2 mirrored (only the dirty tail)")
    check_equal(list(rotate(3, set())), [0, 1, 2], "3 blocks, none mirrored (everything)")
    check_equal(list(rotate(4, {1, 3})), [0, 2], "4 blocks, 1 and 3 mirrored")


# --- 4.4 ------------------------------------------------------------------------------------------
@pytest.mark.task("4.4")
def test_plan_merges_consecutive_host_blocks():
    plan = impl("4.4")
    check_equal([(h, list(g)) for h, g in plan([7, 3, 9], [11, 10, 20])], [(10, [3, 7]), (20, [9])],
                "plan_batched_copy([7, 3, 9], [11, 10, 20])")
    check_equal([(h, list(g)) for h, g in plan([1, 2, 3], [5, 7, 6])], [(5, [1, 3, 2])],
                "plan_batched_copy([1, 2, 3], [5, 7, 6])")
    check_equal(list(plan([], [])), [], "plan_batched_copy([], [])")


@pytest.mark.task("4.4")
@settings(max_examples=40, deadline=None, report_multiple_bugs=False)
@given(host=st.lists(st.integers(0, 40), unique=True, max_size=12), data=st.data())
def test_plan_copies_every_pair_once_in_the_fewest_copies(plan_fn, host, data):
    gpu = data.draw(st.permutations(range(len(host))))
    plan = lab4.checked_plan(list(gpu), host, impl=labs.implementation(4))  # every pair, once
    runs = 0 if not host else 1 + sum(1 for a, b in zip(sorted(host), sorted(host)[1:]) if b != a + 1)
    check_equal(len(plan), runs, "copies (one per run of consecutive host blocks)")
    check_equal([h for h, _ in plan], sorted(h for h, _ in plan), "first host blocks of the runs, "
                                                                 "in order")


# --- everything, inside the engine ------------------------------------------------------------
@pytest.fixture(scope="module")
def weights():
    return lab4.micro_weights(seed=3)


@pytest.mark.task("4.1")
@pytest.mark.task("4.2")
@pytest.mark.task("4.3")
@pytest.mark.task("4.4")
@pytest.mark.parametrize("delay", [0, 2])
def test_rotation_under_memory_pressure_keeps_the_reference_tokens(weights, rng, delay):
    prompts = [rng.integers(3, 64, size=int(n)).tolist() for n in rng.integers(1, 12, size=6)]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    # 4-token blocks: each request needs up to 7; 10 blocks cannot hold six at once
    config = EngineConfig(executor="reference", preemption="rotate", block_size=4,
                          num_kv_blocks=10, max_model_len=48)
    got, engine = lab4.generate(weights, prompts, greedy, config, delay=delay)
    check_tokens(got, reference.generate(weights, prompts, greedy, block_size=4),
                 "tokens of the rotating engine with your books and plan")
    rotation = engine.scheduler.rotation
    assert engine.scheduler.num_rotations > 0, "this pool is too small not to rotate"
    rotate_outs = [r for r in rotation.history if r.reason == "rotate-out"]
    eager = [r for r in rotation.history if r.reason == "eager"]
    assert eager and rotation.blocks_copied[COPY_OUT] > 0, "full blocks are copied out eagerly"
    # (a rotate-out whose blocks were all synced already moves nothing and leaves no record)
    assert all(r.num_blocks <= 1 for r in rotate_outs), \
        "with eager rotation a rotate-out moves at most the dirty tail"
