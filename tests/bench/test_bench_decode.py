"""``bench.decode``'s arithmetic that needs no GPU: the achieved TFLOP/s of a step's matmuls."""

from __future__ import annotations

import pytest

from blink_edu.bench.decode import SMOLLM2_135M, matmul_tflops
from blink_edu.config import ModelConfig

LINEAR_OPS = ("norm+qkv", "o_proj+residual", "norm+gate_up", "down+residual", "norm+lm_head")


def test_matmul_tflops_counts_every_linear_layer_of_the_step():
    cfg = ModelConfig.from_dict(SMOLLM2_135M)
    D, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    E, H, K = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    per_layer = D * (H + 2 * K) * E + H * E * D + D * 2 * F + F * D  # qkv, o, gate/up, down
    op_us = dict.fromkeys(LINEAR_OPS, 100.0)
    op_us["attention"] = 1e9  # not a matmul: ignored
    expected = 2 * 64 * (L * per_layer + V * D) / 500e-6 / 1e12
    assert matmul_tflops(cfg, 64, op_us) == pytest.approx(expected)
    del op_us["norm+lm_head"]
    assert matmul_tflops(cfg, 64, op_us) is None  # a linear op without a time: no figure
