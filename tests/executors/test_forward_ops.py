"""The forward pass as an op list (executors/forward_ops.py) and the device-graph dispatcher's host
side (executors/graph_dispatch.py): the order every dispatcher runs, the grids a graph is captured
with, the token buckets. (The ops themselves run against the reference in test_persistent.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.config import ModelConfig
from blink_edu.executors import forward_ops as fo
from blink_edu.executors.graph_dispatch import token_buckets
from blink_edu.kernels.linear import (FUSED_GEMV_MAX_ROWS, GEMV_MAX_ROWS, TC_DECODE_MAX_ROWS,
                                      TC_SWIGLU_HOST_MAX_ROWS, linear_path, linear_work_items)


@pytest.mark.parametrize("num_layers", [1, 2, 8])
def test_op_list_is_embed_then_seven_per_layer_then_head_and_sample(num_layers):
    ops = [fo.op_of(k, num_layers) for k in range(fo.num_ops(num_layers))]
    layer_ops = [fo.QKV, fo.ROPE_KV, fo.ATTENTION, fo.O_PROJ, fo.GATE_UP, fo.SWIGLU, fo.DOWN]
    expected = ([(fo.EMBED, 0)] + [(op, i) for i in range(num_layers) for op in layer_ops]
                + [(fo.LM_HEAD, 0), (fo.SAMPLE, 0)])
    assert ops == expected
    assert len(fo.OP_NAMES) == fo.SAMPLE + 1


def test_a_graph_has_blocks_for_the_largest_step_of_its_bucket_on_either_linear_path():
    # 64 tokens take the tiled path, a 1-token decode the GEMV path: a graph captured for 64
    # tokens serves both, so it must have enough blocks for whichever needs more
    cfg = ModelConfig.from_dict(dict(model_type="llama", vocab_size=300, hidden_size=64,
                                     intermediate_size=96, num_hidden_layers=1,
                                     num_attention_heads=8, num_key_value_heads=4))
    O, I = fo.linear_shape(fo.QKV, cfg)
    assert (O, I) == ((8 + 2 * 4) * 8, 64)
    grid = fo.op_grid(fo.QKV, max_tokens=64, max_rows=16, config=cfg)
    assert grid >= min(1024, max(linear_work_items(64, O), linear_work_items(1, O))) or grid == 1
    assert fo.op_grid(fo.SAMPLE, 64, 16, cfg) >= 1


@pytest.mark.parametrize("budget, expected", [(1, [1]), (8, [1, 2, 4, 8]), (48, [1, 2, 4, 8, 16, 32, 48]),
                                              (256, [1, 2, 4, 8, 16, 32, 64, 128, 256])])
def test_token_buckets_cover_every_step_size(budget, expected):
    buckets = token_buckets(budget)
    assert buckets == expected
    for t in range(1, budget + 1):  # the kernel takes the first bucket >= T
        assert any(b >= t for b in buckets)


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_rope_and_swiglu_ride_in_the_projection_at_batch_1_and_on_tensor_cores(tensor_cores):
    all_ops = range(fo.SAMPLE + 1)

    def fused(T):
        return {op for op in all_ops if fo.fused_into_linear(op, T, tensor_cores)}

    assert fused(1) == fused(FUSED_GEMV_MAX_ROWS) == {fo.ROPE_KV, fo.SWIGLU}
    assert fused(FUSED_GEMV_MAX_ROWS + 1) == fused(GEMV_MAX_ROWS) == set()  # the plain GEMV
    # on tensor cores: matmul_tc_decode's epilogues; a host's gate/up of more tokens than
    # TC_SWIGLU_HOST_MAX_ROWS, and its qkv of more than TC_DECODE_MAX_ROWS (a prompt chunk), on
    # the tile with SwiGLU or RoPE in its epilogue: at any size
    for T in (GEMV_MAX_ROWS + 1, TC_SWIGLU_HOST_MAX_ROWS, TC_SWIGLU_HOST_MAX_ROWS + 1, 64,
              TC_DECODE_MAX_ROWS, TC_DECODE_MAX_ROWS + 1, 512):
        assert fused(T) == ({fo.ROPE_KV, fo.SWIGLU} if tensor_cores else set())


def test_linear_path_is_chosen_from_the_rows_and_the_weights():
    f16, f32 = np.zeros((4, 6), np.float16), np.zeros((4, 6), np.float32)
    assert linear_path(1, f16) == linear_path(GEMV_MAX_ROWS, f32) == "gemv"
    assert linear_path(GEMV_MAX_ROWS + 1, f16) == linear_path(512, f16) == "tc_tile"
    assert linear_path(GEMV_MAX_ROWS + 1, np.zeros((4, 7), np.float16)) == "tc_decode"  # odd I
    assert linear_path(GEMV_MAX_ROWS + 1, f32) == linear_path(512, f32) == "fma_tile"
