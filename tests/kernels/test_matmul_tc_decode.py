"""The decode-batch tensor-core kernels (``kernels/matmul_tc_decode.py``) against the NumPy
reference: the plain linear, gate/up with SwiGLU, qkv with RoPE and the KV write. In the
simulator the scalar form of ``mma`` on ragged shapes (rows not a multiple of 16 and more than
one 64-row group, I not a multiple of 16 or of 8, odd column counts); on a GPU the real one."""

from __future__ import annotations

import numpy as np
import pytest
from test_fused_gemv import EPS, check_qkv_with_rope, norm_and_bias, projected
from test_ops import dev, rel_err

from blink_edu.kernels.matmul_tc_decode import (
    ROWS, tc_decode_items, tc_decode_linear_kernel, tc_decode_qkv_rope_kernel,
    tc_decode_swiglu_kernel)
from blink_edu.kernels.reduce import THREADS, grid_for
from blink_edu.model import reference as ref

FP16_TOL = 1e-2


def operands(rng, R, I, O, wdtype=np.float16):
    """x (R + 3, I) with R of its rows picked in a random order, and w (O, I)."""
    x = (2 * rng.standard_normal((R + 3, I))).astype(np.float32)
    x_rows = rng.choice(R + 3, R, replace=False).astype(np.int32)
    w = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(wdtype)
    return x, x_rows, w


@pytest.mark.parametrize("R,I,O,norm_bias,accumulate", [
    (9, 40, 17, True, 1), (16, 64, 24, False, 0), (3, 36, 8, True, 0), (ROWS + 5, 32, 9, False, 1)])
def test_linear_matches_reference_on_ragged_shapes(rng, R, I, O, norm_bias, accumulate):
    x, x_rows, w = operands(rng, R, I, O)
    g, b = norm_and_bias(rng, I, O, norm_bias)
    start = rng.standard_normal((R, O)).astype(np.float32) if accumulate \
        else np.full((R, O), np.nan, np.float32)  # poisoned: every element must be written
    out = dev(start)
    tc_decode_linear_kernel[grid_for(tc_decode_items("linear", R, O)), THREADS](
        dev(x), dev(x_rows), dev(g), EPS, dev(w), dev(b), out, accumulate)
    got = out.copy_to_host() - (start if accumulate else 0)
    assert np.isfinite(got).all()
    assert rel_err(got, projected(x[x_rows], g, w, b)) < FP16_TOL


def test_float32_weights_are_rounded_to_fp16_not_refused(rng):
    x, x_rows, w = operands(rng, 10, 48, 16, np.float32)
    none = np.zeros(0, np.float32)
    out = dev(np.zeros((10, 16), np.float32))
    tc_decode_linear_kernel[grid_for(tc_decode_items("linear", 10, 16)), THREADS](
        dev(x), dev(x_rows), dev(none), EPS, dev(w), dev(none), out, 0)
    assert rel_err(out.copy_to_host(), x[x_rows] @ w.T) < FP16_TOL


@pytest.mark.parametrize("R,I,F,norm_bias", [(12, 40, 13, True), (ROWS + 2, 32, 8, False)])
def test_gate_up_with_swiglu(rng, R, I, F, norm_bias):
    x, x_rows, w = operands(rng, R, I, 2 * F)
    g, b = norm_and_bias(rng, I, 2 * F, norm_bias)
    gate_up = projected(x[x_rows], g, w, b)
    act = dev(np.full((R, F), np.nan, np.float32))
    tc_decode_swiglu_kernel[grid_for(tc_decode_items("swiglu", R, F)), THREADS](
        dev(x), dev(x_rows), dev(g), EPS, dev(w), dev(b), act)
    assert rel_err(act.copy_to_host(), ref.silu(gate_up[:, :F]) * gate_up[:, F:]) < FP16_TOL


# 1, 2, 3 and 4 query heads per KV head; half a head of 8 (one column group) and of 6 and 12
# (ragged groups)
@pytest.mark.parametrize("heads,kv_heads,head_dim,norm_bias", [
    (2, 2, 16, True), (4, 2, 12, False), (6, 2, 24, True), (4, 1, 16, True)])
def test_qkv_with_rope_and_kv_write(rng, heads, kv_heads, head_dim, norm_bias):
    def launch(T, heads, E, args):
        tc_decode_qkv_rope_kernel[grid_for(tc_decode_items("qkv_rope", T, heads, E // 2)),
                                  THREADS](*args)

    D = int(rng.integers(3, 7)) * 8
    check_qkv_with_rope(rng, launch, heads, kv_heads, head_dim, np.float16, FP16_TOL, norm_bias, 5,
                        D)


# The 135M model's shapes: hidden 576, intermediate 1536, 9 query and 3 KV heads of 64.
@pytest.mark.gpu
@pytest.mark.parametrize("R", [3, 8, 64, 77, 128])
@pytest.mark.parametrize("O,I", [(960, 576), (576, 576), (576, 1536), (49152, 576)])
def test_linear_at_the_135m_shapes_on_the_gpu(rng, R, O, I):
    """The real ``mma.sync`` fed straight from memory, 16-byte loads, four warps a block."""
    x, x_rows, w = operands(rng, R, I, O)
    g, b = norm_and_bias(rng, I, O, True)
    start = rng.standard_normal((R, O)).astype(np.float32)
    out = dev(start)
    tc_decode_linear_kernel[grid_for(tc_decode_items("linear", R, O)), THREADS](
        dev(x), dev(x_rows), dev(g), EPS, dev(w), dev(b), out, 1)
    assert rel_err(out.copy_to_host() - start, projected(x[x_rows], g, w, b)) < FP16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("R", [3, 64, 128])
def test_fused_kernels_at_the_135m_shapes_on_the_gpu(rng, R):
    x, x_rows, w = operands(rng, R, 576, 2 * 1536)
    g, b = norm_and_bias(rng, 576, 2 * 1536, False)
    gate_up = projected(x[x_rows], g, w, b)
    act = dev(np.full((R, 1536), np.nan, np.float32))
    tc_decode_swiglu_kernel[grid_for(tc_decode_items("swiglu", R, 1536)), THREADS](
        dev(x), dev(x_rows), dev(g), EPS, dev(w), dev(b), act)
    assert rel_err(act.copy_to_host(), ref.silu(gate_up[:, :1536]) * gate_up[:, 1536:]) < FP16_TOL

    def launch(T, heads, E, args):
        tc_decode_qkv_rope_kernel[grid_for(tc_decode_items("qkv_rope", T, heads, E // 2)),
                                  THREADS](*args)

    check_qkv_with_rope(rng, launch, 9, 3, 64, np.float16, FP16_TOL, True, R // 2 + 1, 576)
