"""The persistent scheduler kernel against the oracle (``reference.generate``), in the simulator
(one block; the GPU-marked copies of these checks run on the H200 via tools/run_gpu_tests.sh).

Requests go in through the ring exactly as the server's frontend writes them; the kernel claims,
batches (decodes first, prompt chunks within the token budget), runs the model and publishes. We
check: greedy and seeded tokens equal the reference's; a bad payload fails its own slot only;
several frontend threads submitting and cancelling at random never get a slot claimed twice, every
request completes or is cancelled, and afterwards every slot is EMPTY and every KV block free."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blink_edu.backend import get_backend
from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.executors import persistent_kernel as pk
from blink_edu.executors.persistent import PersistentExecutor
from blink_edu.model import reference
from blink_edu.kv.pool import allocate_kv_pool
from blink_edu.model.micro import micro_weights
from blink_edu.ring import (DECODE_PAUSED, EMPTY, PREFILL_PROCESSING, Ring, RingClient,
                             RingLayout)
from test_tensor_core_steps import as_float32

LAYOUT = RingLayout(num_slots=8, max_prompt_tokens=16, max_output_tokens=6)
# 2 lanes and a budget of 8 tokens: an 11-token prompt is prefilled in two chunks, and a third
# request must wait in the ring until a lane frees up.
CONFIG = EngineConfig(block_size=4, num_kv_blocks=12, max_num_seqs=2, max_num_batched_tokens=8)
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def weights():
    return micro_weights(seed=3, num_attention_heads=4, num_key_value_heads=2)


DISPATCHERS = ["inline", pytest.param("graph", marks=pytest.mark.gpu)]


@contextmanager
def running(weights, eos=(), dispatch="inline", weight_dtype=np.float32, config=CONFIG):
    ring = Ring(bytearray(LAYOUT.nbytes), LAYOUT)
    executor = PersistentExecutor(weights, config, ring, eos_token_ids=eos, dispatch=dispatch,
                                  weight_dtype=weight_dtype)
    executor.start()
    try:
        yield ring, RingClient(ring), executor
    finally:
        executor.stop()


def assert_all_free(ring: Ring, executor: PersistentExecutor, config=CONFIG):
    """Every slot EMPTY, every lane empty, every GPU block and every host-arena block free."""
    assert (ring.state == EMPTY).all()
    state = executor.scheduler_state
    assert (state.lanes.copy_to_host()[:, pk.L_SLOT] == -1).all()
    for top, stack, tables, n in ((state.free_top, state.free_blocks, state.block_tables,
                                   config.num_kv_blocks),
                                  (state.host_free_top, state.host_free_blocks, state.host_tables,
                                   executor.num_host_kv_blocks)):
        assert int(top.copy_to_host()[0]) == n
        assert sorted(stack.copy_to_host().tolist()) == list(range(n))
        assert (tables.copy_to_host() == -1).all()


@pytest.mark.parametrize("dispatch", DISPATCHERS)
def test_greedy_and_seeded_tokens_equal_the_reference(weights, rng, dispatch):
    prompts = [rng.integers(3, 64, size=n).tolist() for n in (11, 3, 6)]
    params = [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=int(rng.integers(2**31)),
                             max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)]
    expected = reference.generate(weights, prompts, params, block_size=CONFIG.block_size)
    with running(weights, dispatch=dispatch) as (ring, client, executor):
        slots = [client.submit(p, q, request_id=i) for i, (p, q) in enumerate(zip(prompts, params))]
        done = client.collect(slots, TIMEOUT_S)
        assert [done[s] for s in slots] == [(e, "length") for e in expected]
        assert executor.stats()["claimed"] == 3
        assert_all_free(ring, executor)


# 5 blocks of 4 tokens: an 11-token prompt with 6 tokens to generate needs 4 blocks, a 6-token one
# 3, so the two cannot both finish at once — blocks are taken as tokens need them, and when a
# decode finds the pool empty the newest lane is preempted: by recompute, or rotated out to the
# host arena and back.
TIGHT = EngineConfig(block_size=4, num_kv_blocks=5, max_num_seqs=2, max_num_batched_tokens=8)
PREEMPTIONS = [("inline", "recompute"), ("inline", "rotate"),
               pytest.param("graph", "recompute", marks=pytest.mark.gpu),
               pytest.param("graph", "rotate", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("dispatch,preemption", PREEMPTIONS)
def test_preempted_lanes_keep_their_tokens(weights, rng, dispatch, preemption):
    """Greedy and seeded requests on a pool too small for them all: the kernel preempts (counted:
    by recompute, the victims refill their caches from prompt + generated tokens; by rotation,
    block 0 copies a victim's KV to the host arena and back) and every request still gets the
    reference's tokens; a request that would not fit the whole pool alone fails at once instead
    of waiting forever; afterwards every lane, slot, GPU block and host block is free."""
    config = replace(TIGHT, preemption=preemption)
    prompts = [rng.integers(3, 64, size=n).tolist() for n in (11, 6, 7, 16)]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=20, seed=int(rng.integers(2**31)),
                             max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)]  # 21 tokens > 5 blocks
    expected = reference.generate(weights, prompts[:3], params[:3], block_size=TIGHT.block_size)
    with running(weights, dispatch=dispatch, config=config) as (ring, client, executor):
        slots = [client.submit(p, q, request_id=i) for i, (p, q) in enumerate(zip(prompts, params))]
        done = client.collect(slots, TIMEOUT_S)
        assert [done[s] for s in slots[:3]] == [(e, "length") for e in expected]
        assert done[slots[3]] == ([], "error")
        assert_all_free(ring, executor, config)
    stats = executor.stats()  # once stopped: the counters of the last step are out too
    assert stats["preemptions"] >= 1
    if preemption == "rotate":
        assert stats["rotations"] == stats["rotate_ins"] == stats["preemptions"]
        # a rotate-out copies its dirty blocks; its full ones went out eagerly before (DuplexKV)
        assert stats["blocks_mirrored"] >= 1 and stats["blocks_out"] <= stats["blocks_in"]
    else:
        assert stats["rotations"] == stats["blocks_mirrored"] == 0


@pytest.mark.parametrize("dispatch", DISPATCHERS)
def test_lvf_decides_in_the_kernel_and_keeps_the_tokens(weights, rng, dispatch):
    """RotaSched's Largest-VLT-First inside the kernel (``policy="lvf"``): lanes beyond the
    batch hold the requests it keeps waiting, it decides every step from the lanes' times and
    blocks (counted), rotates out and back in under pressure, and every request still gets the
    reference's tokens; afterwards everything is free."""
    config = replace(TIGHT, preemption="rotate", policy="lvf")
    prompts = [rng.integers(3, 64, size=n).tolist() for n in (11, 6, 7, 5)]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=20, seed=int(rng.integers(2**31)),
                             max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)]
    expected = reference.generate(weights, prompts, params, block_size=TIGHT.block_size)
    with running(weights, dispatch=dispatch, config=config) as (ring, client, executor):
        assert executor.num_lanes > config.max_num_seqs
        slots = [client.submit(p, q, request_id=i) for i, (p, q) in enumerate(zip(prompts, params))]
        done = client.collect(slots, TIMEOUT_S)
        assert [done[s] for s in slots] == [(e, "length") for e in expected]
        assert_all_free(ring, executor, config)
    stats = executor.stats()  # once stopped: the counters of the last step are out too
    assert stats["decisions"] >= 1 and stats["preemptions"] >= 1
    assert stats["rotations"] == stats["rotate_ins"]
    # back in: every block of each; out: only the dirty ones, the rest had a current copy there
    # (copied out eagerly, or kept from an earlier rotation: full blocks never change)
    assert stats["blocks_out"] <= stats["blocks_in"]


@pytest.mark.skipif(not get_backend().is_simulator,
                    reason="on a GPU a rotated-out lane comes back within microseconds: the test "
                           "cannot cancel it in between (the simulator's steps take seconds)")
def test_a_request_cancelled_while_rotated_out_gives_its_host_blocks_back(weights, rng):
    """The newest lane is rotated out when the oldest needs its blocks; cancelled before it
    comes back (its slot DECODE_PAUSED meanwhile), it completes as "abort" with the tokens it
    had published, never rotates back in, and its host-arena blocks are free again. The oldest
    request keeps the reference's tokens."""
    config = replace(TIGHT, preemption="rotate")
    prompts = [rng.integers(3, 64, size=n).tolist() for n in (11, 6)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = reference.generate(weights, prompts, [params, params], block_size=TIGHT.block_size)
    with running(weights, config=config) as (ring, client, executor):
        oldest, newest = (client.submit(p, params, request_id=i) for i, p in enumerate(prompts))
        deadline = time.monotonic() + TIMEOUT_S
        while executor.stats()["rotations"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert executor.stats()["rotate_ins"] == 0, "it came back before the cancel"
        # out, a request that was decoding shows as paused in the ring
        assert ring.state[newest] == (DECODE_PAUSED if ring.generated[newest] > 0
                                      else PREFILL_PROCESSING)
        client.cancel(newest)
        done = client.collect([oldest, newest], TIMEOUT_S)
        assert done[oldest] == (expected[0], "length")
        tokens, reason = done[newest]
        assert reason == "abort" and tokens == expected[1][:len(tokens)]
        assert_all_free(ring, executor, config)
    assert executor.stats()["rotate_ins"] == 0


def prompt_logits(weights, prompt):
    """The reference's (V,) logits after ``prompt``, on a KV pool of its own."""
    T, B = len(prompt), CONFIG.block_size
    pool = allocate_kv_pool(weights.config, -(-T // B), B)
    i32 = np.int32
    return reference.forward(weights, pool, np.asarray(prompt, i32), np.arange(T, dtype=i32),
                             np.zeros(T, i32), np.arange(-(-T // B), dtype=i32)[None],
                             np.array([T - 1], i32))[0]


def assert_first_tokens_are_the_references(done, slots, logits, margin=0.05):
    """Each request's one token is the argmax of the reference's logits where the lead over the
    runner-up is beyond what fp16 activations can move (``margin``); a near-tie decides nothing."""
    decided = 0
    for slot, lg in zip(slots, logits):
        runner_up, best = np.sort(lg)[-2:]
        if best - runner_up > margin:
            assert done[slot] == ([int(np.argmax(lg))], "length")
            decided += 1
    assert decided >= 1, "every request was a near-tie: nothing checked"


@pytest.mark.parametrize("dispatch", DISPATCHERS)
def test_fp16_prompt_chunks_on_tensor_cores_pick_the_reference_tokens(rng, dispatch):
    """Float16 weights: the prompt chunks (3 to 8 tokens a step) run every linear layer on
    ``matmul_tc_decode`` inside the kernel, RoPE and SwiGLU fused. The first token of each
    request is the reference's argmax on the same fp16 weights wherever its lead over the
    runner-up is beyond what fp16 activations can move; a near-tie decides nothing."""
    weights16 = micro_weights(seed=int(rng.integers(1000)), dtype=np.float16,
                              num_attention_heads=4, num_key_value_heads=2)
    prompts = [rng.integers(3, 64, size=n).tolist() for n in (11, 3, 6, 9)]
    logits = [prompt_logits(as_float32(weights16), p) for p in prompts]  # (V,) each
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    with running(weights16, dispatch=dispatch, weight_dtype=np.float16) as (ring, client, executor):
        assert executor.model.tensor_cores
        slots = [client.submit(p, one, request_id=i) for i, p in enumerate(prompts)]
        done = client.collect(slots, TIMEOUT_S)
        assert_all_free(ring, executor)
    assert_first_tokens_are_the_references(done, slots, logits)


@pytest.mark.gpu
@pytest.mark.parametrize("dispatch", ["inline", "graph"])
def test_fp16_prompts_of_64_dim_heads_take_the_attention_tile(rng, dispatch):
    """Head size 64, three query heads a KV head (SmolLM2's): with a budget of 64 tokens a step,
    the prompts' chunks fill tiles of 21 tokens, which ``attention_tc``'s tile takes inside the
    kernel. Their first tokens are the reference's argmax as above."""
    weights16 = micro_weights(seed=int(rng.integers(1000)), dtype=np.float16, hidden_size=192,
                              num_attention_heads=3, num_key_value_heads=1,
                              max_position_embeddings=128)
    prompts = [rng.integers(3, 64, size=n).tolist() for n in (60, 45, 23, 50)]
    logits = [prompt_logits(as_float32(weights16), p) for p in prompts]  # (V,) each
    layout = RingLayout(num_slots=8, max_prompt_tokens=64, max_output_tokens=2)
    config = EngineConfig(block_size=16, num_kv_blocks=24, max_num_seqs=2,
                          max_num_batched_tokens=64)
    ring = Ring(bytearray(layout.nbytes), layout)
    executor = PersistentExecutor(weights16, config, ring, dispatch=dispatch,
                                  weight_dtype=np.float16)
    executor.start()
    try:
        client = RingClient(ring)
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        slots = [client.submit(p, one, request_id=i) for i, p in enumerate(prompts)]
        done = client.collect(slots, TIMEOUT_S)
    finally:
        executor.stop()
    assert (ring.state == EMPTY).all()
    assert_first_tokens_are_the_references(done, slots, logits)


@pytest.mark.parametrize("dispatch", DISPATCHERS)
def test_penalties_and_logit_bias_equal_the_reference(weights, rng, dispatch):
    prompts = [rng.integers(3, 64, size=n).tolist() for n in (7, 4, 5)]
    greedy = reference.generate(weights, [prompts[1]], SamplingParams(temperature=0, max_tokens=1,
                                                                      ignore_eos=True))[0][0]
    forced = next(int(f) for f in rng.integers(3, 64, size=16) if f ^ 1 != greedy)  # bias: two ids
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                             presence_penalty=1.5, frequency_penalty=0.8),
              SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                             logit_bias=((greedy, -100.0), (forced ^ 1, 2.5))),
              SamplingParams(temperature=0.8, seed=int(rng.integers(2**31)), max_tokens=5,
                             ignore_eos=True, frequency_penalty=-0.5,
                             logit_bias=((forced, 100.0),))]
    expected = reference.generate(weights, prompts, params, block_size=CONFIG.block_size)
    assert expected[1][0] != greedy and expected[2] == [forced] * 5  # the bias took effect
    with running(weights, dispatch=dispatch) as (ring, client, executor):
        slots = [client.submit(p, q, request_id=i) for i, (p, q) in enumerate(zip(prompts, params))]
        done = client.collect(slots, TIMEOUT_S)
        assert [done[s] for s in slots] == [(e, "length") for e in expected]
        assert_all_free(ring, executor)


def test_stop_rules_and_a_bad_payload(weights, rng):
    prompt = rng.integers(3, 64, size=5).tolist()
    free_run = reference.generate(weights, [prompt], SamplingParams(temperature=0, max_tokens=6,
                                                                    ignore_eos=True))[0]
    stop_at = free_run[2]  # a stop id that the greedy run meets at its 3rd token (or earlier)
    with running(weights) as (ring, client, executor):
        good = client.submit(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                    stop_token_ids=(stop_at,)), request_id=0)
        bad = client.submit([1, 999, 3], SamplingParams(max_tokens=2), request_id=1)  # 999: no token
        done = client.collect([good, bad], TIMEOUT_S)
        cut = free_run.index(stop_at) + 1
        assert done[good] == (free_run[:cut], "stop")
        assert done[bad] == ([], "error")
        assert_all_free(ring, executor)


@pytest.mark.parametrize("config", [CONFIG, replace(TIGHT, policy="lvf", preemption="rotate")],
                         ids=["fcfs", "lvf-tight"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_frontend_threads_submit_and_cancel(weights, config, data):
    """Under FCFS with room to spare, and under LVF on a pool too small for every request (a
    cancel may then find its request running, waiting in a lane or rotated out)."""
    n_threads = 3
    jobs = [[(data.draw(st.lists(st.integers(3, 63), min_size=1, max_size=9)),
              data.draw(st.integers(1, 4)), data.draw(st.booleans()))
             for _ in range(2)] for _ in range(n_threads)]
    results: dict[tuple[int, int], tuple] = {}
    with running(weights, config=config) as (ring, client, executor):
        def frontend(t):
            for j, (prompt, max_tokens, cancel) in enumerate(jobs[t]):
                slot = client.submit(prompt, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                            ignore_eos=True), request_id=t * 10 + j)
                if cancel:
                    client.cancel(slot)
                results[(t, j)] = client.collect([slot], TIMEOUT_S)[slot]

        threads = [threading.Thread(target=frontend, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert executor.stats()["claimed"] == n_threads * 2  # each submission claimed exactly once
        assert_all_free(ring, executor, config)
    for (t, j), (tokens, reason) in results.items():
        prompt, max_tokens, cancel = jobs[t][j]
        full = reference.generate(weights, [prompt], SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]
        if reason == "abort":
            assert cancel and tokens == full[:len(tokens)]
        else:
            assert (tokens, reason) == (full, "length")


@pytest.mark.gpu
def test_device_graph_dispatch_relaunches_itself_and_keeps_the_tokens(weights, rng):
    """Waves of requests run for more steps than one execution of the scheduler graph may launch
    forward graphs (graph_dispatch.MAX_LAUNCHES): it must tail-launch itself and carry on."""
    from blink_edu.executors.graph_dispatch import MAX_LAUNCHES

    greedy = SamplingParams(temperature=0, max_tokens=LAYOUT.max_output_tokens, ignore_eos=True)
    waves = [[rng.integers(3, 64, size=int(rng.integers(1, 12))).tolist() for _ in range(6)]
             for _ in range(8)]  # 48 requests of 6 tokens on 2 lanes: ~150 steps
    with running(weights, dispatch="graph") as (ring, client, executor):
        for prompts in waves:
            slots = [client.submit(p, greedy, request_id=i) for i, p in enumerate(prompts)]
            done = client.collect(slots, TIMEOUT_S)
            expected = reference.generate(weights, prompts, greedy, block_size=CONFIG.block_size)
            assert [done[s] for s in slots] == [(e, "length") for e in expected]
        stats = executor.stats()
        assert stats["steps"] > MAX_LAUNCHES and stats["relaunches"] >= stats["steps"] // MAX_LAUNCHES
        assert stats["dispatch_error"] == 0
        assert_all_free(ring, executor)


def test_the_dispatcher_choice_is_checked(weights):
    ring = Ring(bytearray(LAYOUT.nbytes), LAYOUT)
    with pytest.raises(ValueError, match="unknown dispatcher"):
        PersistentExecutor(weights, CONFIG, ring, dispatch="nope")
    if get_backend().is_simulator:  # no CUDA graphs there
        with pytest.raises(RuntimeError, match="needs a GPU"):
            PersistentExecutor(weights, CONFIG, ring, dispatch="graph")


@pytest.mark.parametrize("executor", ["persistent", "persistent-graph"])
def test_a_persistent_executor_serves_a_ring_only(weights, executor):
    from blink_edu.engine.llm_engine import make_executor

    with pytest.raises(ValueError, match="serves a ring"):
        make_executor(executor, weights, EngineConfig(executor=executor))
