"""The engine and the offline ``LLM`` against the oracle, ``reference.generate``: the same tokens
whatever the batching — mixed prompts, chunked prefill interleaved with decodes, preemption by
recompute, seeded sampling, random arrivals. Weights in float64 so that no comparison can hinge on
a rounding-level near-tie."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.engine.llm_engine import LLMEngine, make_executor
from blink_edu.llm import LLM
from blink_edu.model import reference
from blink_edu.model.weights import load_weights

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def weights(checkpoints):
    folder, _ = checkpoints["qwen2"]
    return load_weights(folder, dtype=np.float64)


class RecordingExecutor:
    """The reference executor, keeping every batch it ran."""

    def __init__(self, weights, config: EngineConfig):
        self.inner = make_executor("reference", weights, config)
        self.batches = []

    def step(self, batch):
        self.batches.append(batch)
        return self.inner.step(batch)


def random_prompts(rng, vocab: int, n: int, longest: int) -> list[list[int]]:
    return [rng.integers(0, vocab, size=int(k)).tolist() for k in rng.integers(1, longest, size=n)]


def run(engine: LLMEngine, prompts, params) -> list[list[int]]:
    """Add every prompt, step until done; tokens per prompt. Checks each finishes exactly once
    and that the pool is whole again."""
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, q) for p, q in zip(prompts, per_prompt)]
    tokens = {i: [] for i in ids}
    finished = []
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id not in finished
            tokens[out.request_id].append(out.token_id)
            finished += [out.request_id] if out.finished else []
    assert sorted(finished) == sorted(ids)
    assert_pool_whole(engine)
    return [tokens[i] for i in ids]


def assert_pool_whole(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.kv_blocks_used == 0 and stats.kv_blocks_free == engine.config.num_kv_blocks
    assert stats.num_running == stats.num_waiting == 0
    engine.scheduler.block_manager.check()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_length_prompts_give_the_reference_tokens(checkpoints, arch, rng):
    weights = load_weights(checkpoints[arch][0], dtype=np.float64)
    prompts = random_prompts(rng, weights.config.vocab_size, n=6, longest=40)
    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=128))
    assert run(engine, prompts, GREEDY) == reference.generate(weights, prompts, GREEDY)


def test_small_budget_interleaves_prompt_chunks_with_decodes(weights, rng):
    prompts = random_prompts(rng, weights.config.vocab_size, n=5, longest=30)
    prompts[1] = rng.integers(0, weights.config.vocab_size, size=23).tolist()  # > budget
    config = EngineConfig(block_size=4, num_kv_blocks=128, max_num_batched_tokens=7)
    executor = RecordingExecutor(weights, config)
    engine = LLMEngine(weights, config, executor=executor)
    assert run(engine, prompts, GREEDY) == reference.generate(weights, prompts, GREEDY)
    assert all(b.num_tokens <= 7 for b in executor.batches)

    def mixes(batch) -> bool:  # a decode (1 token) and a prompt chunk (> 1 token) in one batch
        sizes = np.bincount(batch.seq_rows)
        return (sizes == 1).any() and (sizes > 1).any()

    assert any(mixes(b) for b in executor.batches)


def test_preemption_by_recompute_keeps_the_tokens(weights, rng):
    prompts = random_prompts(rng, weights.config.vocab_size, n=6, longest=12)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    # 4-token blocks: each request needs up to 7 blocks; 10 blocks cannot hold six at once.
    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=10))
    assert run(engine, prompts, params) == reference.generate(weights, prompts, params)
    assert engine.stats().num_preemptions > 0


def test_seeded_sampling_gives_the_reference_tokens(weights, rng):
    prompts = random_prompts(rng, weights.config.vocab_size, n=5, longest=20)
    params = [SamplingParams(temperature=float(rng.uniform(0.5, 1.5)),
                             top_k=int(rng.integers(0, 30)), top_p=float(rng.uniform(0.5, 1.0)),
                             max_tokens=12, seed=int(rng.integers(2**32)), ignore_eos=True)
              for _ in prompts]
    want = reference.generate(weights, prompts, params)
    for config in (EngineConfig(block_size=4, num_kv_blocks=128),
                   EngineConfig(block_size=2, num_kv_blocks=16, max_num_batched_tokens=5)):
        engine = LLMEngine(weights, config)
        assert run(engine, prompts, params) == want


def test_eos_and_stop_tokens_end_requests_like_the_reference(weights, rng):
    prompt = rng.integers(0, weights.config.vocab_size, size=8).tolist()
    free_run = reference.generate(weights, [prompt], GREEDY)[0]
    eos, stop = free_run[3], free_run[6]
    with_eos = dataclasses.replace(weights, config=dataclasses.replace(weights.config,
                                                                       eos_token_ids=(eos,)))
    params = [SamplingParams(temperature=0, max_tokens=12),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=(stop,)),
              GREEDY]
    engine = LLMEngine(with_eos, EngineConfig(block_size=4, num_kv_blocks=64))
    ids = [engine.add_request(prompt, p) for p in params]
    reasons = {}
    while engine.has_unfinished():
        reasons.update({o.request_id: o.finish_reason for o in engine.step() if o.finished})
    assert [reasons[i] for i in ids] == ["stop", "stop", "length"]
    engine = LLMEngine(with_eos, EngineConfig(block_size=4, num_kv_blocks=64))
    got = run(engine, [prompt] * 3, params)
    assert got == reference.generate(with_eos, [prompt] * 3, params)
    until = [free_run[:free_run.index(eos) + 1], free_run[:free_run.index(stop) + 1], free_run]
    assert got == until


def test_abort_frees_blocks_and_the_others_finish(weights, rng):
    prompts = random_prompts(rng, weights.config.vocab_size, n=4, longest=20)
    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=2))
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    tokens = {i: [] for i in ids}
    for _ in range(3):
        for out in engine.step():
            tokens[out.request_id].append(out.token_id)
    running, waiting = ids[0], ids[3]
    used = engine.stats().kv_blocks_used
    assert engine.abort(running) and engine.abort(waiting)
    assert engine.stats().kv_blocks_used < used
    assert not engine.abort(running)  # already gone
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id in (ids[1], ids[2])
            tokens[out.request_id].append(out.token_id)
    assert_pool_whole(engine)
    want = reference.generate(weights, prompts[1:3], GREEDY)
    assert [tokens[ids[1]], tokens[ids[2]]] == want


def test_bad_requests_raise_clear_errors(weights):
    V = weights.config.vocab_size
    engine = LLMEngine(weights, EngineConfig(block_size=4, num_kv_blocks=8, max_model_len=64))
    cases = [([], "prompt is empty"), ([1, V], "outside the vocabulary"),
             ([-1, 5], "outside the vocabulary"), ([1] * 60, "exceeds max_model_len=64"),
             ([1] * 30, "whole pool has 8")]
    for prompt, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.add_request(prompt, SamplingParams(max_tokens=10))
    engine.add_request([1, 2], GREEDY, request_id="a")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1, 2], GREEDY, request_id="a")
    with pytest.raises(ValueError, match="arrival_time must be a finite"):
        engine.add_request([1, 2], GREEDY, request_id="b", arrival_time=float("nan"))
    assert set(engine.requests) == {"a"}  # the refused ones left nothing behind
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLMEngine(weights, EngineConfig(max_model_len=weights.config.max_position_embeddings + 1))
    with pytest.raises(ValueError, match="serves a ring"):
        make_executor("persistent", weights, EngineConfig())


def test_llm_generate_returns_results_in_input_order(checkpoints, rng):
    folder, _ = checkpoints["qwen2"]
    config = EngineConfig(block_size=4, num_kv_blocks=24, max_num_batched_tokens=16)
    llm = LLM(folder, config, dtype=np.float64)
    prompts = random_prompts(rng, llm.engine.weights.config.vocab_size, n=5, longest=25)
    params = [SamplingParams(temperature=0, max_tokens=int(m)) for m in rng.integers(1, 10, size=5)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    want = reference.generate(llm.engine.weights, prompts, params)
    assert [o.token_ids for o in outs] == want
    assert [o.prompt for o in outs] == prompts and [o.prompt_token_ids for o in outs] == prompts
    eos = llm.engine.weights.config.eos_token_ids
    for out, p in zip(outs, params):
        assert out.text is None  # the tiny checkpoints have no tokenizer
        assert out.finish_reason == ("length" if len(out.token_ids) == p.max_tokens
                                     and out.token_ids[-1] not in eos else "stop")
    one = llm.generate([prompts[0]], params[0], use_tqdm=True)  # the progress bar path
    assert one[0].token_ids == want[0]
    with pytest.raises(ValueError, match="no tokenizer.json"):
        llm.generate(["hello"], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt 1: .*prompt is empty"):
        llm.generate([prompts[0], [], prompts[1]], use_tqdm=False)
    assert not llm.engine.has_unfinished()  # the good request was withdrawn too
    assert_pool_whole(llm.engine)


def add_word_tokenizer(folder) -> None:
    """A word-level tokenizer.json for a tiny checkpoint: "w5" is id 5; <s> = 1, </s> = 2."""
    import json

    import tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {f"w{i}": i for i in range(3, 300)} | {"w0": 0, "<s>": 1, "</s>": 2}
    tokenizer = tokenizers.Tokenizer(WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))


def test_llm_generate_tokenizes_text_prompts_and_decodes_the_completion(checkpoints, tmp_path, rng):
    import shutil

    folder = shutil.copytree(checkpoints["qwen2"][0], tmp_path / "with_tokenizer")
    add_word_tokenizer(folder)
    llm = LLM(folder, EngineConfig(block_size=4, num_kv_blocks=64), dtype=np.float64)
    prompt_ids = rng.integers(3, 300, size=(2, 6)).tolist()
    texts = [" ".join(f"w{i}" for i in ids) for ids in prompt_ids]
    params = SamplingParams(temperature=0, max_tokens=10)
    outs = llm.generate([texts[0], prompt_ids[1]], params, use_tqdm=False)  # text and ids mixed
    want = reference.generate(llm.engine.weights, prompt_ids, params)
    assert [o.prompt_token_ids for o in outs] == prompt_ids
    assert [o.token_ids for o in outs] == want
    for out in outs:
        words = [f"w{i}" for i in out.token_ids if i not in (1, 2)]  # special: not in the text
        assert out.text == " ".join(words)


@pytest.fixture(scope="module")
def traffic_weights(checkpoints):
    return load_weights(checkpoints["llama"][0], dtype=np.float64)


request_strategy = st.tuples(
    st.integers(0, 5),  # arrival step
    st.lists(st.integers(0, 299), min_size=1, max_size=12),  # prompt
    st.integers(1, 8),  # max_tokens
    st.sampled_from([0.0, 0.8]),  # temperature (greedy or seeded sampling)
    st.integers(0, 2**32 - 1),  # seed
)


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(request_strategy, min_size=1, max_size=5),
       block_size=st.integers(1, 4), extra_blocks=st.integers(0, 3),
       budget=st.integers(1, 20), max_num_seqs=st.integers(1, 4))
def test_random_arrivals_and_budgets_give_the_reference_tokens(
        traffic_weights, requests, block_size, extra_blocks, budget, max_num_seqs):
    biggest = max(-(-(len(p) + m - 1) // block_size) for _, p, m, _, _ in requests)
    config = EngineConfig(block_size=block_size, num_kv_blocks=biggest + extra_blocks,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    engine = LLMEngine(traffic_weights, config)
    params = [SamplingParams(temperature=t, top_k=20, max_tokens=m, seed=seed)
              for _, _, m, t, seed in requests]
    not_yet_added = {i: arrival for i, (arrival, *_) in enumerate(requests)}
    tokens = {i: [] for i in range(len(requests))}
    times_finished = {i: 0 for i in range(len(requests))}
    step = 0
    while not_yet_added or engine.has_unfinished():
        for i in [i for i, arrival in not_yet_added.items() if arrival <= step]:
            del not_yet_added[i]
            engine.add_request(requests[i][1], params[i], request_id=i)
        for out in engine.step():
            tokens[out.request_id].append(out.token_id)
            times_finished[out.request_id] += out.finished
        step += 1
    assert all(n == 1 for n in times_finished.values())
    assert_pool_whole(engine)
    want = reference.generate(traffic_weights, [p for _, p, *_ in requests], params)
    assert [tokens[i] for i in range(len(requests))] == want


def test_a_scheduler_with_its_own_block_manager_is_handed_in_whole(weights):
    """The labs' extension points: ``LLMEngine(scheduler=)`` and ``Scheduler(block_manager=)``
    are used as given, and a rotating engine attaches its rotation to them."""
    from blink_edu.engine.scheduler import Scheduler
    from blink_edu.kv.block_manager import BlockManager

    config = EngineConfig(executor="reference", preemption="rotate", block_size=4,
                          num_kv_blocks=6, max_model_len=32)
    blocks = BlockManager(config.num_kv_blocks, config.block_size)
    scheduler = Scheduler(config, 32, (), block_manager=blocks)
    engine = LLMEngine(weights, config, scheduler=scheduler)
    assert engine.scheduler is scheduler and scheduler.block_manager is blocks
    assert scheduler.rotation is not None and scheduler.rotation.blocks is blocks
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].append(o.token_id)
    assert [out[i] for i in ids] == reference.generate(weights, prompts, GREEDY, block_size=4)
    assert scheduler.num_rotations > 0, "six 4-token blocks for three requests: it must rotate"
