"""The NumPy reference against Hugging Face transformers, and against itself (paging, batching)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blink_edu.config import ModelConfig, SamplingParams
from blink_edu.kv.pool import allocate_kv_pool
from blink_edu.model import reference as ref
from blink_edu.model.weights import load_weights

from tiny_models import ARCHS


def full_forward(weights, ids: np.ndarray, block_size: int = 8) -> np.ndarray:
    """Logits (T, V) for one sequence, everything recomputed from scratch."""
    T = len(ids)
    nb = -(-T // block_size)
    pool = allocate_kv_pool(weights.config, nb, block_size, dtype=weights.embed.dtype)
    table = np.arange(nb, dtype=np.int32)[None, ::-1].copy()  # blocks deliberately out of order
    return ref.forward(weights, pool, ids, np.arange(T), np.zeros(T, dtype=int), table)


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids[None])).logits[0].double().numpy()


def rel_err(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_match_transformers_fp32(checkpoints, arch, rng):
    folder, model = checkpoints[arch]
    weights = load_weights(folder)  # float32
    ids = rng.integers(3, weights.config.vocab_size, size=int(rng.integers(5, 60)))
    err = rel_err(full_forward(weights, ids), hf_logits(model, ids))
    assert err < 1e-4, f"{arch}: relative error {err:.2e}"


@pytest.mark.parametrize("arch", list(ARCHS))
def test_32_greedy_tokens_match_transformers_generate(checkpoints, arch, rng):
    # Both sides in float64 so that the comparison cannot hinge on a rounding-level near-tie.
    folder, model = checkpoints[arch]
    weights = load_weights(folder, dtype=np.float64)
    prompt = rng.integers(3, weights.config.vocab_size, size=int(rng.integers(3, 20))).tolist()
    # No EOS on the HF side either (min_new_tokens would instead mask EOS's logit to -inf).
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                            pad_token_id=0)[0, len(prompt):].tolist()
    assert len(hf) == 32
    ours = ref.generate(weights, [prompt], SamplingParams(temperature=0, max_tokens=32,
                                                          ignore_eos=True))[0]
    assert ours == hf


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_paged_decoding_equals_full_recomputation(checkpoints, arch, rng):
    folder, _ = checkpoints[arch]
    weights = load_weights(folder, dtype=np.float64)
    B = 4
    ids = rng.integers(3, weights.config.vocab_size, size=23)
    prompt_len = 5
    pool = allocate_kv_pool(weights.config, 8, B, dtype=np.float64)
    table = rng.permutation(8).astype(np.int32)[None, :]  # a scattered block table
    incremental = [ref.forward(weights, pool, ids[:prompt_len], np.arange(prompt_len),
                               np.zeros(prompt_len, dtype=int), table)]
    for p in range(prompt_len, len(ids)):  # one decode token per step, reading the cache
        incremental.append(ref.forward(weights, pool, ids[p:p + 1], np.array([p]),
                                       np.array([0]), table))
    assert rel_err(np.concatenate(incremental), full_forward(weights, ids)) < 1e-10


@pytest.mark.parametrize("prefill_chunk", [0, 3])
def test_mixed_batch_gives_each_sequence_its_solo_tokens(checkpoints, rng, prefill_chunk):
    folder, _ = checkpoints["qwen2"]
    weights = load_weights(folder, dtype=np.float64)
    V = weights.config.vocab_size
    prompts = [rng.integers(3, V, size=int(n)).tolist() for n in rng.integers(1, 40, size=5)]
    greedy = SamplingParams(temperature=0, max_tokens=int(rng.integers(4, 12)), ignore_eos=True)
    batched = ref.generate(weights, prompts, greedy, block_size=4, prefill_chunk=prefill_chunk)
    alone = [ref.generate(weights, [p], greedy, block_size=4)[0] for p in prompts]
    assert batched == alone


def test_seeded_sampling_is_reproducible_and_batch_independent(checkpoints, rng):
    folder, _ = checkpoints["llama"]
    weights = load_weights(folder)
    V = weights.config.vocab_size
    prompts = [rng.integers(3, V, size=6).tolist() for _ in range(3)]
    params = [SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=10, seed=int(s),
                             ignore_eos=True) for s in rng.integers(0, 2**31, size=3)]
    together = ref.generate(weights, prompts, params)
    assert together == ref.generate(weights, prompts, params)
    assert together[1] == ref.generate(weights, [prompts[1]], [params[1]])[0]
    other_seed = SamplingParams(**{**params[1].__dict__, "seed": params[1].seed + 1})
    runs = [ref.generate(weights, [prompts[1]], [other_seed])[0], together[1]]
    assert runs[0] != runs[1], "a different seed should (almost surely) change 10 sampled tokens"


def test_generation_stops_at_eos_and_stop_tokens(checkpoints, rng):
    folder, _ = checkpoints["llama"]
    weights = load_weights(folder)
    prompt = rng.integers(3, weights.config.vocab_size, size=8).tolist()
    free_run = ref.generate(weights, [prompt], SamplingParams(temperature=0, max_tokens=20,
                                                              ignore_eos=True))[0]
    stop = free_run[5]
    first = free_run.index(stop)
    stopped = ref.generate(weights, [prompt], SamplingParams(temperature=0, max_tokens=20,
                                                             stop_token_ids=(stop,)))[0]
    assert stopped == free_run[: first + 1]


def test_a_position_beyond_the_block_table_is_an_error(checkpoints):
    folder, _ = checkpoints["llama"]
    weights = load_weights(folder)
    pool = allocate_kv_pool(weights.config, 2, 4)
    table = np.array([[0, -1]], dtype=np.int32)
    with pytest.raises(ValueError, match="beyond its sequence's block table"):
        ref.forward(weights, pool, np.array([5]), np.array([6]), np.array([0]), table)


def test_config_parses_what_the_checkpoints_declare(checkpoints):
    cfg = ModelConfig.from_folder(checkpoints["llama3rope"][0])
    assert (cfg.head_dim, cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (32, True, True, True)
    assert cfg.rope_scaling.rope_type == "llama3" and cfg.rope_scaling.factor == 8.0
    qwen = ModelConfig.from_folder(checkpoints["qwen2"][0])
    assert (qwen.qkv_bias, qwen.o_bias, qwen.tie_word_embeddings, qwen.q_per_kv) == (True, False, False, 4)
    model = checkpoints["qwen2"][1]
    assert qwen.num_parameters() == sum(p.numel() for p in model.parameters())
