"""Rotation inside the engine: requests rotated out to host memory and back in, by preemption
(``EngineConfig(preemption="rotate")``) or by a policy through ``Scheduler.rotate_out/rotate_in``,
give exactly the tokens of a run without rotation (the reference oracle), greedy and seeded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.engine.llm_engine import LLMEngine
from blink_edu.engine.sequence import SequenceStatus
from blink_edu.kv.block_manager import COPY_IN, COPY_OUT
from blink_edu.model import reference
from blink_edu.model.micro import micro_weights

# the micro model, a little bigger: two layers, GQA 4/2
SMALL = dict(vocab_size=200, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=64)


def weights_of(changes: dict, dtype=np.float64, seed: int = 0):
    return micro_weights(seed=seed, scale=0.5, dtype=dtype, **changes)


@pytest.fixture(scope="module")
def weights():
    return weights_of(SMALL)  # float64: no rounding-level near-ties between batchings


def prompts_for(rng, vocab: int, n: int, longest: int) -> list[list[int]]:
    return [rng.integers(3, vocab, size=int(k)).tolist() for k in rng.integers(1, longest, size=n)]


def drive(engine: LLMEngine, prompts, params, between_steps=None) -> list[list[int]]:
    """Run to the end; ``between_steps(scheduler)`` may rotate sequences between steps."""
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, q) for p, q in zip(prompts, per_prompt)]
    tokens = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].append(out.token_id)
        engine.scheduler.rotation.check()
        if between_steps:
            between_steps(engine.scheduler)
    stats = engine.stats()
    assert stats.kv_blocks_used == 0 and stats.num_rotated == 0 and stats.host_kv_blocks_used == 0
    engine.scheduler.rotation.check()
    return [tokens[i] for i in ids]


def rotating_engine(weights, delay=0, **config) -> LLMEngine:
    engine = LLMEngine(weights, EngineConfig(preemption="rotate", **config))
    if delay:
        engine.scheduler.attach_rotation(engine.make_rotation_engine(delay=delay))
    return engine


def test_default_engine_does_not_rotate(weights):
    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=16))
    assert engine.config.preemption == "recompute" and engine.scheduler.rotation is None


@pytest.mark.parametrize("delay", [0, 2])
def test_preemption_by_rotation_keeps_the_tokens(weights, rng, delay):
    prompts = prompts_for(rng, weights.config.vocab_size, n=6, longest=12)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    # 4-token blocks: each request needs up to 7 blocks; 10 blocks cannot hold six at once
    engine = rotating_engine(weights, delay, block_size=4, num_kv_blocks=10)
    assert drive(engine, prompts, params) == reference.generate(weights, prompts, params)
    rotation = engine.scheduler.rotation
    assert engine.scheduler.num_rotations > 0 and rotation.blocks_copied[COPY_OUT] > 0
    # eager: a rotate-out copies at most the request's dirty tail, and nothing at all when its
    # last block is full (already mirrored) -- so there may be fewer copies than rotations
    rotate_outs = [r for r in rotation.history if r.reason == "rotate-out"]
    assert len(rotate_outs) <= engine.scheduler.num_rotations
    assert all(r.num_blocks <= 1 for r in rotate_outs)


def test_seeded_sampling_survives_rotation(weights, rng):
    prompts = prompts_for(rng, weights.config.vocab_size, n=5, longest=10)
    params = [SamplingParams(temperature=float(rng.uniform(0.5, 1.5)), top_k=int(rng.integers(0, 30)),
                             max_tokens=14, seed=int(rng.integers(2**32)), ignore_eos=True)
              for _ in prompts]
    engine = rotating_engine(weights, 1, block_size=2, num_kv_blocks=16, max_num_batched_tokens=5)
    assert drive(engine, prompts, params) == reference.generate(weights, prompts, params)
    assert engine.scheduler.num_rotations > 0


def random_rotations(rng, p_out: float, p_in: float):
    """A stand-in policy for ``drive``'s ``between_steps``: rotate each running sequence with
    cached tokens out with probability ``p_out``, then each rotated one (the ones just rotated out
    among them) back in with probability ``p_in`` where it fits; ``check()`` after every move."""

    def policy(scheduler):
        for seq in [s for s in scheduler.running if s.num_cached_tokens > 0]:
            if rng.random() < p_out:
                scheduler.rotate_out(seq)
                assert seq.status is SequenceStatus.ROTATED
                scheduler.rotation.check()
        for seq in list(scheduler.rotated):
            fits = scheduler.blocks_to_rotate_in(seq) + 1 <= scheduler.block_manager.num_free
            if fits and (rng.random() < p_in or not scheduler.running):
                scheduler.rotate_in(seq)
                scheduler.rotation.check()
        stats = scheduler.rotation_stats()
        assert stats.num_rotated == len(scheduler.rotated)
        assert stats.host_blocks_used + stats.host_blocks_free == scheduler.rotation.host.num_blocks

    return policy


def chunked_prefill_engine(weights, delay: int) -> LLMEngine:
    """3 tokens a step: prompts are prefilled in chunks, so sequences are rotated out part-way
    through their prompts too, and must go on from what they had cached. The pool is large:
    only the test's "policy" rotates, and it decides every rotate-in."""
    engine = rotating_engine(weights, delay, block_size=2, num_kv_blocks=48,
                             max_num_batched_tokens=3)
    engine.scheduler.resume_rotated = False
    return engine


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), delay=st.integers(0, 2),
       p_out=st.floats(0.1, 0.9), p_in=st.floats(0.1, 0.9))
def test_random_rotations_by_a_policy_keep_the_tokens(weights, seed, delay, p_out, p_in):
    rng = np.random.default_rng(seed)
    prompts = prompts_for(rng, weights.config.vocab_size, n=4, longest=10)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = chunked_prefill_engine(weights, delay)
    policy = random_rotations(rng, p_out, p_in)
    assert drive(engine, prompts, params, policy) == reference.generate(weights, prompts, params)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), delay=st.integers(1, 2),
       p_out=st.floats(0.1, 0.9), p_in=st.floats(0.1, 0.9))
def test_random_rotations_batched_per_step_keep_the_tokens(weights, seed, delay, p_out, p_in):
    """All of a step's rotate-outs and rotate-ins in ONE batch (a sequence may go out and back
    in within it: its copy-in must wait for its own copy-out): one copy-out and one copy-in
    ticket, and still the reference's tokens."""
    rng = np.random.default_rng(seed)
    prompts = prompts_for(rng, weights.config.vocab_size, n=4, longest=10)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = chunked_prefill_engine(weights, delay)
    policy = random_rotations(rng, p_out, p_in)

    def batched_policy(scheduler):
        rotation = scheduler.rotation
        before, copied_before = len(rotation.history), dict(rotation.blocks_copied)
        with scheduler.batched_copies():
            policy(scheduler)
        for direction, reason in ((COPY_OUT, "rotate-out"), (COPY_IN, "rotate-in")):
            records = [r for r in rotation.history[before:] if r.reason == reason]
            copied = rotation.blocks_copied[direction] - copied_before[direction]
            assert len(records) == (1 if copied else 0)  # every block of the step in one ticket
            assert sum(r.num_blocks for r in records) == copied

    expected = reference.generate(weights, prompts, params)
    assert drive(engine, prompts, params, batched_policy) == expected


def test_rotate_out_mid_prompt_goes_on_from_the_cached_tokens(weights, rng):
    prompt = rng.integers(3, 100, size=9).tolist()
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine = rotating_engine(weights, block_size=4, num_kv_blocks=16, max_num_batched_tokens=4)
    engine.add_request(prompt, params)
    engine.step()  # the first chunk of 4 of its 9 prompt tokens
    seq = engine.scheduler.running[0]
    engine.scheduler.rotate_out(seq)
    engine.scheduler.rotation.wait_all()
    engine.scheduler.rotate_in(seq)
    assert seq.num_cached_tokens == 4  # nothing recomputed
    tokens = []
    while engine.has_unfinished():
        tokens += [out.token_id for out in engine.step()]
    assert tokens == reference.generate(weights, [prompt], params)[0]
    assert engine.stats().num_steps == 1 + 2 + 3  # 4 + 4 + 1 prompt tokens, then 3 decodes


def test_rotate_out_refuses_a_sequence_with_nothing_cached(weights, rng):
    engine = rotating_engine(weights, block_size=4, num_kv_blocks=16)
    engine.add_request(rng.integers(3, 100, size=9).tolist(), SamplingParams(max_tokens=2))
    engine.scheduler.waiting[0].status = SequenceStatus.RUNNING  # admitted, no step run yet
    engine.scheduler.running.append(engine.scheduler.waiting.popleft())
    with pytest.raises(ValueError, match="cached"):
        engine.scheduler.rotate_out(engine.scheduler.running[0])


@pytest.mark.parametrize("transport", ["mapped", "staged"])
@pytest.mark.parametrize("executor", ["eager", pytest.param("graph", marks=pytest.mark.gpu)])
def test_kernel_executor_rotates(rng, executor, transport):
    """The kernel executor's pool through MappedTransport (one kernel over mapped host memory)
    and DeviceTransport (gather/scatter kernels, staging): in the simulator here; on a GPU
    (tools/run_gpu_tests.sh) with their streams and events."""
    weights = weights_of({}, dtype=np.float32, seed=int(rng.integers(1000)))
    prompts = [rng.integers(3, 64, size=3).tolist() for _ in range(2)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine = LLMEngine(weights, EngineConfig(executor=executor, block_size=2, num_kv_blocks=5,
                                             max_num_seqs=2, max_num_batched_tokens=8,
                                             max_model_len=16, preemption="rotate",
                                             kv_transport=transport))
    expected = {"mapped": "MappedTransport", "staged": "DeviceTransport"}[transport]
    assert type(engine.scheduler.rotation.transport).__name__ == expected
    assert drive(engine, prompts, params) == reference.generate(weights, prompts, params, block_size=2)
    assert engine.scheduler.num_rotations > 0


def test_unknown_kv_transport_is_a_clear_error():
    with pytest.raises(ValueError, match="kv_transport must be one of mapped, staged"):
        EngineConfig(kv_transport="dma")
