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


def test_a_run_cut_short_still_leaves_its_measurements_in_decode_json(tmp_path):
    """The file is rewritten after every stage: a time limit that stops the run before the
    Hugging Face baselines keeps the executors' and peers' rows, marked incomplete."""
    import argparse
    import json

    from blink_edu.bench.decode import write_decode_results

    args = argparse.Namespace(batches="1,64", prefill_tokens=512, peers="torch_compiled",
                              out=str(tmp_path))
    rows = [{"executor": "graph", "batch": 1, "tpot_us": 250.0},
            {"executor": "graph", "batch": 64, "tpot_us": 550.0},
            {"executor": "graph", "prefill_tokens": 512, "prefill_ms": 1.6},
            {"executor": "torch_compiled", "batch": 1, "tpot_us": 270.0},
            {"executor": "torch_compiled", "prefill_tokens": 512, "prefill_ms": 0.34}]
    results = {"bundled": {"label": "bundled", "params": 7_000_000,
                           "weight_bytes_fp16": 14_000_000, "vocab_size": 100, "rows": rows}}
    path, summary = write_decode_results(results, args, bandwidth=4e12, complete=False)
    written = json.loads(path.read_text())
    assert written["summary"]["complete"] is False and summary["complete"] is False
    assert written["summary"]["tpot_us_bundled_b64"] == pytest.approx(550.0)
    assert written["summary"]["ours_over_torch_compiled_bundled_b1"] == pytest.approx(270 / 250)
    assert written["summary"]["prefill_ms_bundled_512"] == pytest.approx(1.6)
    assert written["raw"]["bundled"]["rows"] == rows


def test_the_executors_to_time_are_checked():
    from blink_edu.bench.decode import executor_classes
    from blink_edu.executors.kernel_executor import EagerExecutor, GraphExecutor

    assert executor_classes("eager,graph") == [EagerExecutor, GraphExecutor]
    assert executor_classes(" graph ") == [GraphExecutor]
    for bad in ("", "graph,persistent"):
        with pytest.raises(ValueError, match="eager and/or graph"):
            executor_classes(bad)
