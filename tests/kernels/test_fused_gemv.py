"""The decode GEMVs with the next op in their epilogue, against the NumPy reference: gate/up with
SwiGLU, and qkv with RoPE and the paged KV write (``kernels/linear.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from test_ops import dev, ragged_batch, rel_err, tiny_config

from blink_edu.kernels.linear import (GEMV_MAX_ROWS, gemv_qkv_rope_kernel, gemv_swiglu_kernel,
                                      gemv_work_items)
from blink_edu.kernels.reduce import THREADS, grid_for
from blink_edu.model import reference as ref

EPS = np.float32(1e-5)


def norm_and_bias(rng, I, O, with_them):
    """A norm weight (I,) and a bias (O,), or empty arrays (no norm, no bias)."""
    if not with_them:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return ((1 + 0.2 * rng.standard_normal(I)).astype(np.float32),
            rng.standard_normal(O).astype(np.float32))


def projected(x, g, w, b):
    """rms_norm?(x) @ w.T + b? in float32 (the reference's linear)."""
    h = ref.rms_norm(x, g, float(EPS)) if g.shape[0] else x
    return ref.linear(h, w.astype(np.float32), b if b.shape[0] else None)


@pytest.mark.parametrize("rows", [1, 3, GEMV_MAX_ROWS])
@pytest.mark.parametrize("wdtype,tol", [(np.float32, 1e-4), (np.float16, 1e-2)])
@pytest.mark.parametrize("width", ["any", "wide"])  # wide: I % 8 == 0, the 16-byte-load path
@pytest.mark.parametrize("norm_bias", [False, True])
def test_gate_up_gemv_with_swiglu(rng, rows, wdtype, tol, width, norm_bias):
    I = 8 * int(rng.integers(3, 9)) if width == "wide" else int(rng.integers(20, 70))
    F = int(rng.integers(5, 40))  # odd and even
    x = rng.standard_normal((rows + 2, I)).astype(np.float32)
    x_rows = rng.choice(rows + 2, rows, replace=False).astype(np.int32)
    w = (rng.standard_normal((2 * F, I)) / np.sqrt(I)).astype(wdtype)
    g, b = norm_and_bias(rng, I, 2 * F, norm_bias)
    gate_up = projected(x[x_rows], g, w, b)
    expected = ref.silu(gate_up[:, :F]) * gate_up[:, F:]
    act = dev(np.full((rows, F), np.nan, np.float32))  # poisoned: every element must be written
    gemv_swiglu_kernel[grid_for(gemv_work_items(F)), THREADS](dev(x), dev(x_rows), dev(g), EPS,
                                                              dev(w), dev(b), act)
    assert rel_err(act.copy_to_host(), expected) < tol


def check_qkv_with_rope(rng, launch, heads, kv_heads, head_dim, wdtype, tol, norm_bias, n_seqs,
                        D):
    """A qkv projection with RoPE and the KV write in its epilogue against the reference, on a
    ragged batch of ``n_seqs`` sequences (1..3 new tokens each) and hidden size D. ``launch(T,
    heads, E, args)`` runs the kernel under test over T tokens of ``heads`` = H + 2K heads of E
    on ``args`` (``gemv_qkv_rope``'s arguments)."""
    cfg = tiny_config(rng, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    H, K, E, B, N = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 4, 6 * n_seqs
    positions, seq_rows, tables = ragged_batch(rng, n_seqs, B, N, 20)
    T = len(positions)  # each token its own x row
    x = rng.standard_normal((T, D)).astype(np.float32)
    w = (rng.standard_normal(((H + 2 * K) * E, D)) / np.sqrt(D)).astype(wdtype)
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
    launch(T, H + 2 * K, E, (dev(x), dev(np.arange(T, dtype=np.int32)), dev(g), EPS, dev(w),
                             dev(b), qkv_d, dev(positions), dev(seq_rows), dev(tables), dev(cos),
                             dev(sin), pool_d, layer, H, K))
    assert rel_err(qkv_d.copy_to_host()[:, :H * E].reshape(T, H, E), q_ref) < tol
    got = pool_d.copy_to_host()
    assert rel_err(got, pool_ref) < tol
    untouched = np.ones(N, bool)
    untouched[tables[seq_rows, positions // B]] = False  # only this step's slots may change
    np.testing.assert_array_equal(got[untouched], pool[untouched])


# 1, 2, 3 and 4 query heads per KV head; a head dim that is a multiple of 8 (wide loads) and not
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(2, 2, 16), (4, 2, 16), (6, 2, 12),
                                                      (4, 1, 8)])
@pytest.mark.parametrize("wdtype,tol", [(np.float32, 1e-5), (np.float16, 1e-2)])
@pytest.mark.parametrize("norm_bias", [False, True])
def test_qkv_gemv_with_rope_and_kv_write(rng, heads, kv_heads, head_dim, wdtype, tol, norm_bias):
    def launch(T, heads, E, args):
        gemv_qkv_rope_kernel[grid_for(gemv_work_items(heads * E // 2)), THREADS](*args)

    D = int(rng.integers(3, 7)) * 8 + (0 if head_dim % 8 == 0 else 3)
    check_qkv_with_rope(rng, launch, heads, kv_heads, head_dim, wdtype, tol, norm_bias, 2, D)
