"""The PyTorch peer of the decode benchmark against the NumPy reference (its oracle), the child
process runner's promise (one row per measurement, with a reason when there is no figure), and the
summary keys. The CUDA-graph and torch.compile paths run only on a GPU (marked ``gpu``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from blink_edu.bench import torch_peer as peer
from blink_edu.config import ModelConfig, SamplingParams
from blink_edu.kv.pool import allocate_kv_pool
from blink_edu.model import reference as ref
from blink_edu.model.weights import random_weights

MICRO = dict(vocab_size=100, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             rope_theta=10000.0, rms_norm_eps=1e-5)
CONFIGS = {
    "llama_gqa_tied": dict(model_type="llama", tie_word_embeddings=True),
    "qwen2_qkv_bias_untied": dict(model_type="qwen2", tie_word_embeddings=False,
                                  num_key_value_heads=1),
    "llama_all_biases_llama3_rope": dict(
        model_type="llama", tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}


def micro_weights(name: str, seed: int):
    return random_weights(ModelConfig.from_dict({**MICRO, **CONFIGS[name]}), seed=seed)


def rel_err(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


class ReferenceDecode:
    """The oracle driven like the peer: B sequences, one paged cache, one step at a time."""

    def __init__(self, weights, batch: int, max_len: int, block_size: int = 8):
        per_seq = -(-max_len // block_size)
        self.weights = weights
        self.pool = allocate_kv_pool(weights.config, batch * per_seq, block_size)
        self.tables = np.arange(batch * per_seq, dtype=np.int32).reshape(batch, per_seq)

    def step(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """tokens, positions (B, T) -> logits of each row's last token (B, V)."""
        B, T = tokens.shape
        last = np.arange(B) * T + T - 1
        return ref.forward(self.weights, self.pool, tokens.ravel(), positions.ravel(),
                           np.repeat(np.arange(B), T), self.tables, last)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_and_logits_match_the_reference(name, rng):
    weights = micro_weights(name, int(rng.integers(1 << 30)))
    B, P, steps = 3, int(rng.integers(4, 9)), 5
    prompts = rng.integers(3, weights.config.vocab_size, size=(B, P))
    model = peer.TorchLlama(weights, B, P + steps, dtype=torch.float32, device="cpu")
    oracle = ReferenceDecode(weights, B, P + steps)

    positions = np.broadcast_to(np.arange(P), (B, P))
    with torch.no_grad():
        got = model(torch.from_numpy(prompts), torch.from_numpy(positions.copy()))[:, -1].numpy()
    expected = oracle.step(prompts, positions)
    tokens = []
    for i in range(steps):
        assert rel_err(got, expected) < 1e-4, f"step {i}"
        next_tokens = expected.argmax(axis=-1)  # (B,)
        assert (got.argmax(axis=-1) == next_tokens).all(), f"step {i}"
        tokens.append(next_tokens)
        pos = np.full((B, 1), P + i)
        with torch.no_grad():
            got = model(torch.from_numpy(next_tokens[:, None]), torch.from_numpy(pos))[:, 0].numpy()
        expected = oracle.step(next_tokens[:, None], pos)

    greedy = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    assert np.array(tokens).T.tolist() == ref.generate(weights, prompts.tolist(), greedy)


def test_prefill_and_decode_step_are_the_greedy_loop(rng):
    weights = micro_weights("qwen2_qkv_bias_untied", int(rng.integers(1 << 30)))
    B, P, steps = 2, 6, 4
    prompts = rng.integers(3, weights.config.vocab_size, size=(B, P))
    model = peer.TorchLlama(weights, B, P + steps, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        tokens = model.prefill(torch.from_numpy(prompts))  # (B,)
        out = [tokens.clone()]  # (tokens is updated in place from here on)
        step = peer.feeding_back(model.decode_step)  # what the captured graph replays
        positions = torch.full((B,), P)
        for _ in range(steps - 1):
            out.append(step(tokens, positions).clone())
    assert positions.tolist() == [P + steps - 1] * B
    greedy = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    assert torch.stack(out, 1).tolist() == ref.generate(weights, prompts.tolist(), greedy)


def test_attention_without_enable_gqa_is_the_same(rng, monkeypatch):
    """The repeat_interleave path (torch < 2.5) computes what enable_gqa does."""
    q = torch.from_numpy(rng.standard_normal((2, 6, 3, 8)))  # (B, H, T, E)
    k, v = (torch.from_numpy(rng.standard_normal((2, 2, 5, 8))) for _ in range(2))  # (B, K, S, E)
    mask = torch.from_numpy(rng.random((2, 1, 3, 5)) < 0.7)
    mask[..., 0] = True  # every query sees at least one key
    monkeypatch.setattr(peer, "SDPA_GQA", False)
    repeated = peer.attend(q, k, v, mask)
    monkeypatch.setattr(peer, "SDPA_GQA", True)
    torch.testing.assert_close(peer.attend(q, k, v, mask), repeated)
    # and both are the reference's grouped attention: query head h reads kv head h // 3
    scores = torch.einsum("bhte,bhse->bhts", q, k.repeat_interleave(3, 1)) / np.sqrt(8)
    expected = scores.masked_fill(~mask, -torch.inf).softmax(-1) @ v.repeat_interleave(3, 1)
    torch.testing.assert_close(repeated, expected)


def test_the_decode_step_traces_as_one_graph(rng):
    """What torch.compile(fullgraph=True) needs on the GPU, checked here with Dynamo + AOT
    autograd and no code generation: no graph break anywhere in the step."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    weights = micro_weights("qwen2_qkv_bias_untied", int(rng.integers(1 << 30)))
    model = peer.TorchLlama(weights, 2, 12, dtype=torch.float32, device="cpu")
    traced = torch.compile(model.decode_step, backend="aot_eager", fullgraph=True, dynamic=False)
    prompts = torch.from_numpy(rng.integers(3, weights.config.vocab_size, size=(2, 5)))
    with torch.no_grad():
        tokens = model.prefill(prompts)
        eager = model.decode_step(tokens, torch.full((2,), 5))
        with sdpa_kernel(SDPBackend.MATH):
            assert torch.equal(traced(tokens, torch.full((2,), 5)), eager)


def test_bad_choices_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="reduce-overhead"):  # it would capture a graph itself
        peer.compiled(lambda x: x, "reduce-overhead", math_attention=False)
    with pytest.raises(ValueError, match="torch_eager.*peers: torch_graph, torch_compiled"):
        peer.peer_rows("unused", [1], peer.PeerSettings(), kinds=["torch_eager"])


# --- the child process runner: one row per measurement, always ----------------------------------
ITEMS = [{"task": "decode", "executor": "torch_graph", "batch": 1},
         {"task": "prefill", "executor": "torch_graph", "prefill_tokens": 8}]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error rows a machine without CUDA gives")
def test_a_failing_measurement_comes_back_as_a_row_with_the_reason(rng):
    weights = micro_weights("llama_gqa_tied", int(rng.integers(1 << 30)))
    rows = peer.run_in_child(weights, ITEMS, peer.PeerSettings(prompt_len=4, steps=2, timeout_s=120))
    assert [{k: r[k] for k in ITEMS[i]} for i, r in enumerate(rows)] == ITEMS
    for r in rows:  # each item was tried in the child and failed there, with its own reason
        assert "CUDA" in r["error"] and "traceback" in r


def test_a_child_that_runs_out_of_time_gives_a_row_for_every_item(tmp_path):
    settings = peer.PeerSettings(timeout_s=0.01)  # a child takes seconds only to import torch
    rows = peer.peer_rows(tmp_path / "no-model-here", [1, 8], settings)
    assert [(r["executor"], r["task"], r.get("batch")) for r in rows] == [
        (kind, task, b) for kind in peer.PEERS for task, b in
        (("decode", 1), ("decode", 8), ("prefill", None))]
    graph, compiled = rows[:3], rows[3:]
    assert "timed out after 0.01 s" in graph[0]["error"]
    assert all("not run: the child stopped at an earlier item (timed out" in r["error"] for r in graph[1:])
    assert "timed out" in compiled[0]["error"]  # each compiled item has its own child ...
    assert all("not run: an earlier torch_compiled measurement timed out" in r["error"]
               for r in compiled[1:])  # ... but after one timeout the others are not attempted
    status = peer.peer_status(rows)
    assert status["torch_graph"].startswith("did not run: batch 1: timed out")
    assert "prefill 512: not run" in status["torch_compiled"]


class DiesOnArrival:
    """Unpickled in the child (as the weights), it ends the child at once with exit code 3."""

    def __reduce__(self):
        return os._exit, (3,)


def test_a_child_that_dies_gives_a_row_for_every_item():
    rows = peer.run_in_child(DiesOnArrival(), ITEMS, peer.PeerSettings(timeout_s=120))
    assert rows[0]["error"] == "the child process ended (exit code 3) without a result"
    assert rows[1]["error"].startswith("not run: the child stopped at an earlier item (the child")
    assert [{k: r[k] for k in item} for item, r in zip(ITEMS, rows)] == ITEMS


# --- the summary keys --------------------------------------------------------------------------
def test_comparison_takes_our_best_executor_and_says_none_where_a_side_is_missing():
    rows = [{"executor": "eager", "batch": 1, "tpot_us": 400.0},
            {"executor": "graph", "batch": 1, "tpot_us": 100.0},
            {"executor": "graph", "batch": 8, "tpot_us": 300.0},
            {"executor": "hf_eager", "batch": 1, "tpot_us": 50.0},  # not ours: ignored
            {"executor": "torch_graph", "batch": 1, "tpot_us": 250.0},
            {"executor": "torch_compiled", "batch": 1, "tpot_us": 80.0},
            {"task": "decode", "executor": "torch_compiled", "batch": 8, "error": "timed out"},
            {"executor": "graph", "graphs_captured": 4}]
    s = peer.comparison("m", rows, [1, 8])
    assert s["tpot_us_m_b1"] == 100.0 and s["tpot_us_m_b8"] == 300.0
    assert s["ours_over_torch_graph_m_b1"] == 2.5  # 10000 tok/s against 4000
    assert s["ours_over_torch_compiled_m_b1"] == 0.8  # the peer is faster
    assert s["ours_over_torch_graph_m_b8"] is None and s["ours_over_torch_compiled_m_b8"] is None
    status = peer.peer_status(rows)
    assert status == {"torch_graph": "ran", "torch_compiled": "ran in part, failed: batch 8: timed out"}


def test_prefill_comparison_takes_our_best_prefill_of_that_length():
    rows = [{"executor": "graph", "prefill_tokens": 512, "prefill_ms": 2.0},
            {"executor": "eager", "prefill_tokens": 512, "prefill_ms": 9.0},
            {"executor": "graph", "prefill_tokens": 64, "prefill_ms": 0.5},  # another length
            {"executor": "torch_compiled", "prefill_tokens": 512, "prefill_ms": 1.0},
            {"task": "prefill", "executor": "torch_graph", "prefill_tokens": 512,
             "error": "timed out"},
            {"executor": "graph", "batch": 1, "tpot_us": 100.0}]
    s = peer.prefill_comparison("m", rows, 512)
    assert s == {"prefill_ms_m_512": 2.0, "ours_over_torch_graph_prefill_m_512": None,
                 "ours_over_torch_compiled_prefill_m_512": 0.5}  # the compiled peer is faster
    assert peer.prefill_comparison("m", rows[3:], 512)["prefill_ms_m_512"] is None


# --- on a GPU: the captured and compiled steps, and the runner ----------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", peer.PEERS)
def test_captured_steps_replay_the_reference_tokens(kind, rng):
    weights = micro_weights("qwen2_qkv_bias_untied", int(rng.integers(1 << 30)))
    B, P, steps = 2, 5, 6
    prompts = rng.integers(3, weights.config.vocab_size, size=(B, P))
    model = peer.TorchLlama(weights, B, peer.cache_length(P, steps), dtype=torch.float32)
    with torch.no_grad():
        tokens = model.prefill(torch.from_numpy(prompts).cuda())
        positions = torch.full((B,), P, device="cuda")
        step = (model.decode_step if kind == "torch_graph"
                else peer.compiled(model.decode_step, "default", math_attention=True))
        out = [tokens.clone()]
        call = peer.CapturedCall(peer.feeding_back(step), tokens, positions)  # runs WARMUP steps
        out += [tokens.clone()]  # (the warm-up steps' tokens are not kept: only the last)
        for _ in range(steps):
            out.append(call.replay().clone())
    greedy = SamplingParams(temperature=0, max_tokens=1 + peer.WARMUP + steps, ignore_eos=True)
    expected = np.array(ref.generate(weights, prompts.tolist(), greedy))  # (B, n)
    got = torch.stack(out, 1).cpu().numpy()
    assert (got[:, 0] == expected[:, 0]).all()
    assert (got[:, 1:] == expected[:, peer.WARMUP:]).all()  # after the warm-up, then each replay
    assert positions.tolist() == [P + peer.WARMUP + steps] * B


@pytest.mark.gpu
def test_the_runner_times_batches_1_and_2_for_both_peers(rng, tmp_path):
    weights = micro_weights("llama_gqa_tied", int(rng.integers(1 << 30)))
    settings = peer.PeerSettings(prompt_len=5, steps=8, prefill_tokens=32, timeout_s=300,
                                 cache_dir=str(tmp_path))
    rows = peer.peer_rows(weights, [1, 2], settings)
    assert [r.get("error") for r in rows] == [None] * 6
    for r in rows:
        if r["task"] == "decode":
            assert r["tpot_us"] > 0 and r["tokens_per_s"] == pytest.approx(r["batch"] / r["tpot_us"] * 1e6)
        else:
            assert r["prefill_tokens"] == 32 and r["prefill_ms"] > 0
    assert "torch.compile(mode='default'" in rows[-1]["mode"]
    assert any(tmp_path.iterdir())  # the compile cache went where it was told
    assert peer.peer_status(rows) == {"torch_graph": "ran", "torch_compiled": "ran"}
