"""Lab 1 reference solution (instructors only): one thread per output element, no barriers."""

from __future__ import annotations

import math

from numba import float32

from ...kernels.reduce import cuda


@cuda.jit(device=True)
def inv_rms(x, row, eps):
    n_cols = x.shape[1]
    sum_sq = float32(0)
    for col in range(n_cols):
        sum_sq += x[row, col] * x[row, col]
    return float32(1) / math.sqrt(sum_sq / n_cols + eps)


@cuda.jit
def rmsnorm_gemv_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    item = cuda.grid(1)
    n_out, n_in = w.shape
    if item >= x_rows.shape[0] * n_out:
        return
    r_out, o_out = item // n_out, item % n_out
    src = x_rows[r_out]
    has_norm = norm_w.shape[0] > 0
    acc = float32(0)
    for col in range(n_in):
        weight = float32(w[o_out, col])
        if has_norm:
            weight *= norm_w[col]
        acc += x[src, col] * weight
    if has_norm:
        acc *= inv_rms(x, src, eps)
    if bias.shape[0] > 0:
        acc += bias[o_out]
    if accumulate:
        acc += out[r_out, o_out]
    out[r_out, o_out] = acc


@cuda.jit
def paged_attention_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                           num_kv_heads, out):
    item = cuda.grid(1)
    if item >= qkv.shape[0] * num_heads:
        return
    tok, head = item // num_heads, item % num_heads
    blk_size, dim = kv_pool.shape[3], kv_pool.shape[5]
    kv_head = head // (num_heads // num_kv_heads)
    seq = seq_rows[tok]
    n_ctx = positions[tok] + 1
    q0 = head * dim
    inv_sqrt = float32(1) / math.sqrt(float32(dim))
    # pass 1: the largest score
    best = float32(-math.inf)
    for c in range(n_ctx):
        blk = block_tables[seq, c // blk_size]
        dot = float32(0)
        for e in range(dim):
            dot += qkv[tok, q0 + e] * kv_pool[blk, layer, 0, c % blk_size, kv_head, e]
        best = max(best, dot * inv_sqrt)
    # pass 2: softmax weights and the weighted sum of values, accumulated in out
    for e in range(dim):
        out[tok, q0 + e] = float32(0)
    denom = float32(0)
    for c in range(n_ctx):
        blk = block_tables[seq, c // blk_size]
        dot = float32(0)
        for e in range(dim):
            dot += qkv[tok, q0 + e] * kv_pool[blk, layer, 0, c % blk_size, kv_head, e]
        p = math.exp(dot * inv_sqrt - best)
        denom += p
        for e in range(dim):
            out[tok, q0 + e] += p * kv_pool[blk, layer, 1, c % blk_size, kv_head, e]
    for e in range(dim):
        out[tok, q0 + e] /= denom
