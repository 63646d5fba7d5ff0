"""Lab 3 — continuous batching. Each function on hand-made situations, then the lab's scheduler
driving ``LLMEngine`` to the reference's tokens (``python -m blink_edu.labs check 3``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu import labs
from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.labs.checks import check_equal, check_tokens
from blink_edu.labs.plug import lab3
from blink_edu.labs.plug.lab3 import StepContext, add_running, add_waiting, scheduler_for
from blink_edu.model import reference

pytestmark = pytest.mark.lab3


def impl(task: str):
    module = labs.implementation(3)
    name = {"3.1": "schedule_decodes", "3.2": "prompt_chunk", "3.3": "schedule_prompts"}[task]
    labs.require(getattr(module, name), task)
    return getattr(module, name)


def plan(ctx: StepContext) -> dict[int, int]:
    return {s.seq_id: s.num_scheduled_tokens for s in ctx.scheduled}


# --- 3.1 ------------------------------------------------------------------------------------------
@pytest.mark.task("3.1")
def test_decodes_one_token_each_oldest_first_within_the_budget():
    s = scheduler_for(num_blocks=20, budget=2)
    for i in range(3):
        add_running(s, i, prompt_len=3, outputs=1)  # 4 tokens, 3 cached: decoding
    ctx = StepContext(s)
    left = impl("3.1")(ctx, 2)
    check_equal(plan(ctx), {0: 1, 1: 1}, "tokens per sequence id (budget 2, three decoding)")
    check_equal(left, 0, "the budget returned")


@pytest.mark.task("3.1")
def test_decodes_skip_sequences_part_way_through_their_prompt():
    s = scheduler_for(num_blocks=20, budget=8)
    add_running(s, 0, prompt_len=3, outputs=1)
    add_running(s, 1, prompt_len=9, cached=4)  # still prefilling: not a decode
    add_running(s, 2, prompt_len=2, outputs=2)
    ctx = StepContext(s)
    check_equal(impl("3.1")(ctx, 8), 6, "the budget returned (8, two decodes)")
    check_equal(plan(ctx), {0: 1, 2: 1}, "tokens per sequence id (1 is still prefilling)")


@pytest.mark.task("3.1")
def test_decodes_preempt_the_newest_when_the_pool_is_full():
    # 4-token blocks, 3 blocks: seq 0 and 1 hold 1 block each (4 cached tokens: the next token
    # opens a block), seq 2 holds the third. Seq 0 needs a new block: the newest (2) must go.
    s = scheduler_for(num_blocks=3, budget=8)
    a = add_running(s, 0, prompt_len=4, outputs=1)
    b = add_running(s, 1, prompt_len=3, outputs=1)
    c = add_running(s, 2, prompt_len=2, outputs=1)
    ctx = StepContext(s)
    impl("3.1")(ctx, 8)
    check_equal(ctx.preempted, [c], "preempted (the newest must go)")
    check_equal(list(s.waiting)[:1], [c], "the front of the waiting queue")
    check_equal(c.num_cached_tokens, 0, "the preempted sequence's cached tokens")
    check_equal(plan(ctx), {0: 1, 1: 1}, "tokens per sequence id")
    check_equal(s.running, [a, b], "running after the step")


@pytest.mark.task("3.1")
def test_decodes_stop_when_a_sequence_must_preempt_itself():
    # Seq 0 holds the only block and needs another: preempting the newest (itself) ends the step.
    s = scheduler_for(num_blocks=1, budget=8)
    a = add_running(s, 0, prompt_len=4, outputs=1)
    ctx = StepContext(s)
    impl("3.1")(ctx, 8)
    check_equal(ctx.preempted, [a], "preempted")
    check_equal(ctx.scheduled, [], "scheduled (it preempted itself: nothing runs)")
    check_equal(list(s.waiting), [a], "waiting")


# --- 3.2 ------------------------------------------------------------------------------------------
@pytest.mark.task("3.2")
def test_prompt_chunk_is_limited_by_budget_and_memory():
    s = scheduler_for(num_blocks=2, budget=8)  # 8 tokens of KV
    ctx = StepContext(s)
    long = add_waiting(s, 0, prompt_len=12)
    short = add_waiting(s, 1, prompt_len=3)
    chunk = impl("3.2")
    check_equal(chunk(ctx, short, 8), 3, "a 3-token prompt, budget 8 (all of it)")
    check_equal(chunk(ctx, long, 5), 5, "a 12-token prompt, budget 5 (cut by the budget)")
    check_equal(chunk(ctx, long, 8), 8, "a 12-token prompt, budget 8 (exactly the pool)")
    check_equal(chunk(ctx, long, 12), 0, "a 12-token prompt, budget 12 (3 blocks: does not fit)")
    check_equal(chunk(ctx, short, 0), 0, "budget 0")


# --- 3.3 ------------------------------------------------------------------------------------------
@pytest.mark.task("3.3")
def test_prompts_continue_the_partial_one_then_admit_fcfs_and_cut_the_last():
    s = scheduler_for(num_blocks=20, budget=8, max_num_seqs=4)
    add_running(s, 0, prompt_len=10, cached=4)  # 6 prompt tokens left
    w1 = add_waiting(s, 1, prompt_len=1)
    w2 = add_waiting(s, 2, prompt_len=5)
    add_waiting(s, 3, prompt_len=2)
    ctx = StepContext(s)
    impl("3.3")(ctx, 8, True)
    check_equal(plan(ctx), {0: 6, 1: 1, 2: 1},
                "tokens per sequence id (6 left of 0's prompt, 1's prompt, 1 token of 2's)")
    check_equal(ctx.admitted, [w1, w2], "admitted")
    check_equal([q.seq_id for q in s.waiting], [3], "still waiting")


@pytest.mark.task("3.3")
def test_prompts_do_not_overtake_one_that_does_not_fit():
    s = scheduler_for(num_blocks=2, budget=16, max_num_seqs=4)  # 8 tokens of KV
    add_waiting(s, 0, prompt_len=9)  # can never fit in this pool right now (nor be cut to fit)
    add_waiting(s, 1, prompt_len=2)
    ctx = StepContext(s)
    impl("3.3")(ctx, 16, True)
    check_equal(plan(ctx), {}, "tokens per sequence id (the front does not fit: nobody runs)")
    check_equal([q.seq_id for q in s.waiting], [0, 1], "still waiting")


@pytest.mark.task("3.3")
def test_prompts_respect_seats_and_admit_new():
    s = scheduler_for(num_blocks=20, budget=8, max_num_seqs=2)
    add_running(s, 0, prompt_len=3, outputs=1)
    add_waiting(s, 1, prompt_len=2)
    add_waiting(s, 2, prompt_len=2)
    ctx = StepContext(s)
    impl("3.3")(ctx, 7, True)
    check_equal(plan(ctx), {1: 2}, "tokens per sequence id (max_num_seqs=2: one more may join)")
    s2 = scheduler_for(num_blocks=20, budget=8)
    add_waiting(s2, 0, prompt_len=2)
    ctx2 = StepContext(s2)
    impl("3.3")(ctx2, 8, False)
    check_equal(plan(ctx2), {}, "tokens per sequence id (admit_new=False: a step that preempted "
                                "admits nobody)")


# --- everything, inside LLMEngine -----------------------------------------------------------------
def run_engine(weights, prompts, params, **config):
    cfg = EngineConfig(executor="reference", max_model_len=48, **config)
    got, engine = lab3.generate(weights, prompts, params, cfg)
    expected = reference.generate(weights, prompts, params, block_size=cfg.block_size)
    return got, expected, engine


@pytest.fixture(scope="module")
def all_three():
    return [impl(task) for task in ("3.1", "3.2", "3.3")]  # a stub fails here, not in hypothesis


@pytest.fixture(scope="module")
def weights():
    return lab3.micro_weights(seed=7)


@pytest.mark.task("3.1")
@pytest.mark.task("3.2")
@pytest.mark.task("3.3")
def test_engine_with_chunked_prefill_and_preemption_gives_the_reference_tokens(weights, rng):
    prompts = [rng.integers(3, 64, size=int(n)).tolist() for n in (9, 3, 6, 2, 5)]
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    got, expected, engine = run_engine(weights, prompts, greedy, block_size=2, num_kv_blocks=10,
                                       max_num_seqs=3, max_num_batched_tokens=4)
    check_tokens(got, expected, "tokens of LLMEngine with your scheduler")
    history = engine.scheduler.history
    assert any(len(h["tokens"]) > 1 and not set(h["decodes"]) >= set(h["tokens"])
               for h in history), "some step should mix decodes and a prompt chunk (inline prefill)"
    assert engine.scheduler.num_preemptions > 0, "this pool is too small not to preempt"


@pytest.mark.task("3.1")
@pytest.mark.task("3.2")
@pytest.mark.task("3.3")
@settings(max_examples=15, deadline=None, report_multiple_bugs=False)
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=5),
       budget=st.integers(1, 9), blocks=st.integers(5, 14), seats=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1))
def test_engine_on_random_workloads_gives_the_reference_tokens(all_three, weights, lengths, budget, blocks,
                                                                seats, seed):
    prompts = [[3 + (seed + 7 * i + j) % 60 for j in range(n)] for i, n in enumerate(lengths)]
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=4, seed=seed, ignore_eos=True)
    got, expected, engine = run_engine(weights, prompts, params, block_size=2,
                                       num_kv_blocks=blocks, max_num_seqs=seats,
                                       max_num_batched_tokens=budget)
    check_tokens(got, expected, "tokens of LLMEngine with your scheduler")
    check_equal(max(sum(h["tokens"].values()) for h in engine.scheduler.history) <= budget, True,
                f"every step within the budget of {budget} tokens")
