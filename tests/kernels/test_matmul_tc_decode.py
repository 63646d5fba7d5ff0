"""The decode-batch tensor-core kernels (``kernels/matmul_tc_decode.py``) against the NumPy
reference: the plain linear, gate/up with SwiGLU, qkv with RoPE and the KV write. In the
simulator the scalar form of ``mma`` on ragged shapes (rows not a multiple of 16 and more than
one 64-row group, I not a multiple of 16 or of 8, odd column counts); on a GPU the real one."""

from __future__ import annotations

import numpy as np
import pytest
from test_fused_gemv import EPS, norm_and_bias, projected
from test_ops import dev, ragged_batch, rel_err, tiny_config

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
    cfg = tiny_config(rng, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    H, K, E, B, N = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 4, 24
    positions, seq_rows, tables = ragged_batch(rng, 5, B, N, 20)
    T = len(positions)
    D = int(rng.integers(3, 7)) * 8
    x = rng.standard_normal((T, D)).astype(np.float32)
    w = (rng.standard_normal(((H + 2 * K) * E, D)) / np.sqrt(D)).astype(np.float16)
    g, b = norm_and_bias(rng, D, w.shape[0], norm_bias)
    q, k, v = np.split(projected(x, g, w, b), [H * E, (H + K) * E], axis=1)
    q_ref = ref.apply_rope(q.reshape(T, H, E), *ref.rope_tables(cfg, positions))
    k_ref = ref.apply_rope(k.reshape(T, K, E), *ref.rope_tables(cfg, positions))
    pool = rng.standard_normal((N, 2, 2, B, K, E)).astype(np.float32)
    pool_ref = pool.copy()
    layer = int(rng.integers(2))
    ref.write_kv(pool_ref, layer, k_ref, v.reshape(T, K, E), tables[seq_rows, positions // B],
                 positions % B)
    cos, sin = ref.rope_tables(cfg, np.arange(64))
    qkv_d, pool_d = dev(np.full((T, w.shape[0]), np.nan, np.float32)), dev(pool)
    tc_decode_qkv_rope_kernel[grid_for(tc_decode_items("qkv_rope", T, H + 2 * K, E // 2)), THREADS](
        dev(x), dev(np.arange(T, dtype=np.int32)), dev(g), EPS, dev(w), dev(b), qkv_d,
        dev(positions), dev(seq_rows), dev(tables), dev(cos), dev(sin), pool_d, layer, H, K)
    assert rel_err(qkv_d.copy_to_host()[:, :H * E].reshape(T, H, E), q_ref) < FP16_TOL
    got = pool_d.copy_to_host()
    assert rel_err(got, pool_ref) < FP16_TOL
    untouched = np.ones(N, bool)
    untouched[tables[seq_rows, positions // B]] = False  # only this step's slots may change
    np.testing.assert_array_equal(got[untouched], pool[untouched])
