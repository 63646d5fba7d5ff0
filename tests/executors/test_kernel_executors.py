"""The kernel executors inside the engine give the reference's tokens (simulator here; eager and
graph on a GPU through tools/run_gpu_tests.sh)."""

from __future__ import annotations

import pytest

from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.executors.kernel_executor import BucketTable
from blink_edu.engine.llm_engine import LLMEngine
from blink_edu.model import reference as ref
from blink_edu.model.weights import load_weights

EXECUTORS = ["eager", pytest.param("graph", marks=pytest.mark.gpu)]


def run_engine(weights, prompts, params, executor, **config) -> list[list[int]]:
    engine = LLMEngine(weights, EngineConfig(executor=executor, **config))
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].append(o.token_id)
    stats = engine.stats()
    assert stats.kv_blocks_used == 0
    engine.scheduler.block_manager.check()
    return [out[i] for i in ids], stats


@pytest.mark.parametrize("executor", EXECUTORS)
def test_greedy_mixed_batch_matches_reference(checkpoints, rng, executor):
    weights = load_weights(checkpoints["qwen2"][0])  # q/k/v biases, GQA 4:1, untied head
    V = weights.config.vocab_size
    prompts = [rng.integers(3, V, size=int(n)).tolist() for n in rng.integers(1, 7, size=3)]
    greedy = [SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)] * 3
    got, _ = run_engine(weights, prompts, greedy, executor, block_size=4, num_kv_blocks=12,
                        max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32)
    assert got == ref.generate(weights, prompts, greedy, block_size=4)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_seeded_sampling_matches_reference(checkpoints, rng, executor):
    weights = load_weights(checkpoints["llama"][0])
    V = weights.config.vocab_size
    prompts = [rng.integers(3, V, size=4).tolist() for _ in range(2)]
    params = [SamplingParams(temperature=0.8, top_k=int(rng.integers(5, 30)), max_tokens=3,
                             seed=int(s), ignore_eos=True) for s in rng.integers(0, 2**31, size=2)]
    got, _ = run_engine(weights, prompts, params, executor, block_size=4, num_kv_blocks=8,
                        max_num_seqs=2, max_num_batched_tokens=8, max_model_len=16)
    assert got == ref.generate(weights, prompts, params, block_size=4)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_preemption_by_recompute_keeps_the_tokens(checkpoints, rng, executor):
    weights = load_weights(checkpoints["llama"][0])
    V = weights.config.vocab_size
    prompts = [rng.integers(3, V, size=2).tolist() for _ in range(2)]
    greedy = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)] * 2
    # both 2-token prompts fit at once, but 5 blocks of 2 tokens cannot hold both sequences as
    # they grow to 7 cached tokens (4 blocks each): one must be preempted and recomputed
    got, stats = run_engine(weights, prompts, greedy, executor, block_size=2, num_kv_blocks=5,
                            max_num_seqs=2, max_num_batched_tokens=16, max_model_len=16)
    assert stats.num_preemptions > 0
    assert got == ref.generate(weights, prompts, greedy, block_size=2)


def test_bucket_table_is_a_padding_lookup():
    table = BucketTable(max_seqs=6, max_tokens=40)
    assert table.seq_sizes == [1, 2, 4, 8] and table.token_sizes == [1, 2, 4, 8, 16, 32, 64]
    assert table(1, 1) == (1, 1) and table(3, 3) == (4, 4) and table(3, 17) == (4, 32)
    assert all(s <= t for s, t in table.all_buckets())
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        table(9, 9)


def test_graph_executor_needs_a_gpu_and_says_so(checkpoints):
    from blink_edu.backend import get_backend

    if not get_backend().is_simulator:
        pytest.skip("on a GPU the graph executor is exercised by the tests above")
    weights = load_weights(checkpoints["llama"][0])
    with pytest.raises(RuntimeError, match="graph executor needs a GPU"):
        LLMEngine(weights, EngineConfig(executor="graph", num_kv_blocks=4, max_num_seqs=1,
                                        max_num_batched_tokens=4, max_model_len=16))


@pytest.mark.parametrize("executor", ["reference"] + EXECUTORS)
def test_logit_bias_and_penalties_match_reference(checkpoints, rng, executor):
    """Penalties and logit_bias through the engine (adjustments packed from each sequence's
    generated tokens) give the reference's tokens; a banned token never appears, a forced one
    always does."""
    weights = load_weights(checkpoints["llama"][0])
    V = weights.config.vocab_size
    prompts = [rng.integers(3, V, size=3).tolist() for _ in range(3)]
    forced = int(rng.integers(3, V))
    params = [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                             frequency_penalty=2.0, presence_penalty=1.0),
              SamplingParams(temperature=0.8, max_tokens=4, ignore_eos=True, seed=7,
                             logit_bias=((forced, 100.0),)),
              SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)]
    plain = ref.generate(weights, prompts[2:], params[2:], block_size=4)[0]
    params[2] = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                               logit_bias=((plain[0], -100.0),))
    got, _ = run_engine(weights, prompts, params, executor, block_size=4, num_kv_blocks=12,
                        max_num_seqs=4, max_num_batched_tokens=16, max_model_len=32)
    assert got == ref.generate(weights, prompts, params, block_size=4)
    assert got[1] == [forced] * 4 and plain[0] not in got[2]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_logprobs_match_the_reference_executor(checkpoints, rng, executor):
    """The chosen token's log-probability and the top ones: the kernel executor's equal the
    reference executor's; greedy picks the most likely; only the rows that asked get them."""
    weights = load_weights(checkpoints["llama"][0])
    V = weights.config.vocab_size
    prompts = [rng.integers(3, V, size=3).tolist() for _ in range(2)]
    params = [SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=3,
                             logit_bias=((int(rng.integers(V)), 5.0),)),
              SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)]
    outputs = {}
    for name in ("reference", executor):
        engine = LLMEngine(weights, EngineConfig(executor=name, block_size=4, num_kv_blocks=8,
                                                 max_num_seqs=2, max_model_len=16))
        for p, q in zip(prompts, params):
            engine.add_request(p, q)
        outputs[name] = [o for _ in range(3) for o in engine.step()]
    for ref_out, out in zip(outputs["reference"], outputs[executor]):
        assert out.token_id == ref_out.token_id
        if out.request_id == 1:
            assert out.logprobs is None and ref_out.logprobs is None
            continue
        assert out.logprobs.logprob == pytest.approx(ref_out.logprobs.logprob, abs=1e-4)
        assert [t for t, _ in out.logprobs.top] == [t for t, _ in ref_out.logprobs.top]
        assert out.logprobs.top[0] == (out.token_id, pytest.approx(out.logprobs.logprob))
        assert len(out.logprobs.top) == 3 and out.logprobs.logprob < 0
