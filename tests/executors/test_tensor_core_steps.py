"""Batched steps on tensor cores inside an executor: with float16 weights, a prefill and decode
steps of three sequences take ``matmul_tc_decode``'s qkv+RoPE kernel (``matmul_tc``'s tile with
RoPE in its epilogue beyond 128 tokens), its gate/up+SwiGLU or (more than 32 tokens) the tile
with SwiGLU in its epilogue, and the tile for the other layers (``linear.linear_path``). Their logits match the NumPy
reference's on the same fp16 weights within fp16 tolerance (the activations are rounded to fp16
on the way into the tensor cores). Simulator here; eager and graph on a GPU through
tools/run_gpu_tests.sh."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blink_edu.config import EngineConfig, ModelConfig, SamplingParams
from blink_edu.executors.forward_ops import ROPE_KV, SWIGLU, fused_into_linear
from blink_edu.executors.kernel_executor import EagerExecutor, GraphExecutor
from blink_edu.kernels.attention_tc import tc_attention_tiles
from blink_edu.kernels.linear import TC_DECODE_MAX_ROWS, TC_SWIGLU_HOST_MAX_ROWS, linear_path
from blink_edu.kernels.matmul_tc import takes_qkv_rope
from blink_edu.executors.step import pack_step
from blink_edu.kv.block_manager import BlockManager
from blink_edu.kv.pool import allocate_kv_pool
from blink_edu.model import reference as ref
from blink_edu.model.weights import random_weights

EXECUTORS = [EagerExecutor, pytest.param(GraphExecutor, marks=pytest.mark.gpu)]
FP16_TOL = 1e-2


def as_float32(weights):
    """The same weights, every array as float32: the reference's copy of fp16 weights."""
    def f32(a):
        return None if a is None else a.astype(np.float32)

    layers = [dataclasses.replace(lw, **{k: f32(v) for k, v in vars(lw).items()})
              for lw in weights.layers]
    return dataclasses.replace(weights, embed=f32(weights.embed), layers=layers,
                               final_norm=f32(weights.final_norm), lm_head=f32(weights.lm_head))


def steps_against_the_reference(rng, cfg, engine_cfg, executor_cls, lengths, num_steps):
    """A prefill of random prompts of ``lengths``, then decode steps, on ``executor_cls`` with fp16
    weights and on the reference with the same weights in float32; after each step yields
    (executor, batch, relative error of the greedy rows' logits)."""
    weights16 = random_weights(cfg, seed=int(rng.integers(1000)), dtype=np.float16)
    weights32 = as_float32(weights16)
    executor = executor_cls(weights16, engine_cfg, weight_dtype=np.float16)
    ref_kv = allocate_kv_pool(cfg, engine_cfg.num_kv_blocks, engine_cfg.block_size)  # the reference's
    blocks = BlockManager(engine_cfg.num_kv_blocks, engine_cfg.block_size)
    n = len(lengths)
    tokens = [rng.integers(0, cfg.vocab_size, int(k)).tolist() for k in lengths]
    cached = [0] * n
    params = [SamplingParams(temperature=0, logprobs=0)] * n  # greedy, logits kept
    for step in range(num_steps):
        chunks = []
        for s in range(n):
            blocks.grow(s, len(tokens[s]))
            chunks.append((tokens[s][cached[s]:], cached[s]))
        batch = pack_step(chunks, blocks.block_table_array(list(range(n))), params, [0] * n,
                          [step] * n)
        expected = ref.forward(weights32, ref_kv, batch.token_ids, batch.positions,
                               batch.seq_rows, batch.block_tables, batch.logit_rows)  # (S, V)
        executor.step(batch)
        got = executor.logits_out  # (S, V)
        yield executor, batch, np.linalg.norm(got - expected) / np.linalg.norm(expected)
        for s in range(n):  # the reference's greedy token goes on in both
            cached[s] = len(tokens[s])
            tokens[s].append(int(np.argmax(expected[s])))


@pytest.mark.parametrize("executor_cls", EXECUTORS)
def test_fp16_steps_on_tensor_cores_match_the_reference_logits(rng, executor_cls):
    cfg = ModelConfig.from_dict(dict(  # head_dim 16: RoPE pairs of 8, one column group
        model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    engine_cfg = EngineConfig(block_size=4, num_kv_blocks=16, max_num_seqs=4,
                              max_num_batched_tokens=48, max_model_len=64)
    # a prefill of 34 tokens (gate/up on the tile with SwiGLU in its epilogue), then a decode
    # step of 3 (on matmul_tc_decode's gate/up + SwiGLU)
    for step, (executor, batch, err) in enumerate(steps_against_the_reference(
            rng, cfg, engine_cfg, executor_cls, (17, 9, 8), 2)):
        T = batch.num_tokens
        assert (T > TC_SWIGLU_HOST_MAX_ROWS) == (step == 0)
        assert linear_path(T, executor.layers[0].w_o) == "tc_tile"  # the plain layers
        assert fused_into_linear(ROPE_KV, T, executor.tensor_cores)  # in matmul_tc_decode's qkv
        assert fused_into_linear(SWIGLU, T, executor.tensor_cores)
        assert err < FP16_TOL, (step, err)


@pytest.mark.parametrize("executor_cls", EXECUTORS)
def test_a_long_fp16_prefill_rotates_on_the_qkv_tile(rng, executor_cls):
    """A prefill of more than TC_DECODE_MAX_ROWS tokens: its qkv projection on ``matmul_tc``'s
    tile with RoPE and the KV write in the epilogue (no RoPE launch), then a decode step."""
    cfg = ModelConfig.from_dict(dict(  # head_dim 16: one group of 16 columns a head
        model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    engine_cfg = EngineConfig(block_size=8, num_kv_blocks=24, max_num_seqs=4,
                              max_num_batched_tokens=160, max_model_len=64)
    for step, (executor, batch, err) in enumerate(steps_against_the_reference(
            rng, cfg, engine_cfg, executor_cls, (60, 50, 30), 2)):
        assert (batch.num_tokens > TC_DECODE_MAX_ROWS) == (step == 0)
        assert takes_qkv_rope(executor.layers[0].w_qkv, cfg.head_dim)
        assert fused_into_linear(ROPE_KV, batch.num_tokens, executor.tensor_cores)
        assert err < FP16_TOL, (step, err)


@pytest.mark.gpu
@pytest.mark.parametrize("executor_cls", [EagerExecutor, GraphExecutor])
def test_fp16_prompts_take_the_attention_tile_and_match_the_reference(rng, executor_cls):
    """Head size 64 and three query heads a KV head (SmolLM2's): the prefill's prompt chunks take
    ``attention_tc``'s tile (a tile of 21 tokens), the seams between prompts and the decode
    steps the per-token path."""
    cfg = ModelConfig.from_dict(dict(
        model_type="llama", vocab_size=96, hidden_size=192, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1, head_dim=64,
        max_position_embeddings=256))
    assert tc_attention_tiles(100, 3, cfg.head_dim) > 0
    engine_cfg = EngineConfig(block_size=16, num_kv_blocks=24, max_num_seqs=4,
                              max_num_batched_tokens=128, max_model_len=256)
    for step, (_, _, err) in enumerate(steps_against_the_reference(
            rng, cfg, engine_cfg, executor_cls, (70, 41, 2), 3)):
        assert err < FP16_TOL, (step, err)
