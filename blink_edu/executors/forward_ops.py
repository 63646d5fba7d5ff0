"""The forward pass as a numbered list of ops: one device function, two ways to run it.

Blink §3 and §7 (the persistent scheduler *dispatches* each step's forward pass: inline, inside
its own kernel, or by launching the graph executor's graphs from the GPU) and docs/design.md §2. A step
of the model is always the same sequence of ops::

    k = 0                EMBED
    k = 1 .. 7 L         QKV, ROPE_KV, ATTENTION, O_PROJ, GATE_UP, SWIGLU, DOWN   (per layer)
    k = 7 L + 1, + 2     LM_HEAD, SAMPLE

``op_of(k, L)`` names the k-th op and its layer; ``forward_op`` runs one op over the step's
``T`` tokens and ``R`` sampled rows with the same device functions the eager executor launches
one by one (``kernels/``). Every op reads what the previous one wrote, from every block, so
between two ops there must be a barrier for the whole grid:

* **inline** (``forward``): the persistent kernel runs the ops itself, a grid barrier after each;
* **device graph** (``forward_op_kernel``): one kernel node per op in a CUDA graph, launched by the
  scheduler kernel from the GPU (``graph_dispatch.py``); the graph's edges are the barriers. The
  step's sizes are *read from device memory* (``sizes``: T, R), so one graph, captured once for
  the largest step of its bucket, serves every smaller step: no padding, no re-capture.
"""

from __future__ import annotations

from typing import NamedTuple

from ..kernels.attention import paged_attention
from ..kernels.elementwise import elementwise_items, embed_tokens, swiglu
from ..kernels.linear import GEMV_MAX_ROWS, linear_in_megakernel, linear_work_items
from ..kernels.reduce import cuda, grid_for
from ..kernels.rope import rope_and_write_kv, rope_work_items
from ..kernels.sampling import adjust_row_from_history, sample_rows

EMBED, QKV, ROPE_KV, ATTENTION, O_PROJ, GATE_UP, SWIGLU, DOWN, LM_HEAD, SAMPLE = range(10)
LANE_SLOT = 0  # lanes[lane, LANE_SLOT]: the ring slot a lane serves (persistent_kernel.L_SLOT)
OPS_PER_LAYER = 7  # QKV .. DOWN
OP_NAMES = ("embed", "norm+qkv", "rope+kv_write", "attention", "o_proj+residual",
            "norm+gate_up", "swiglu", "down+residual", "norm+lm_head", "sample")


def num_ops(num_layers: int) -> int:
    return OPS_PER_LAYER * num_layers + 3


def op_of(k, num_layers):
    """(op, layer) of the k-th op of a step (see the module docstring)."""
    if k == 0:
        return EMBED, 0
    if k <= OPS_PER_LAYER * num_layers:
        return QKV + (k - 1) % OPS_PER_LAYER, (k - 1) // OPS_PER_LAYER
    return LM_HEAD + (k - 1 - OPS_PER_LAYER * num_layers), 0


op_of_device = cuda.jit(device=True)(op_of)


class SamplingHistory(NamedTuple):
    """What the sampler needs, inside a kernel, to apply a request's presence and frequency
    penalties and its logit_bias (OpenAI's definitions: ``model/sampling.py``), passed as one
    group of device arrays. Per sampled row r: its lane ``row_lane`` (R,); per lane: its ring
    slot ``lanes[:, LANE_SLOT]``; per ring slot: ``presence_penalty``, ``frequency_penalty``
    (S,) f32, ``logit_bias_ids`` (S, B) i32 (-1 padded) and ``logit_bias_values`` (S, B) f32,
    ``output_tokens`` (S, O) i32, its generated tokens (``counters[r]`` of them so far)."""

    row_lane: object
    lanes: object
    presence_penalty: object
    frequency_penalty: object
    logit_bias_ids: object
    logit_bias_values: object
    output_tokens: object


@cuda.jit(device=True)
def adjust_sampled_rows(logits, counters, history, blk, nb):
    """Penalties and logit_bias on this block's rows of ``logits`` (R, V), before ``sample_rows``
    (which gives each block the same rows). Rows whose request asks for none are left alone."""
    h = history
    for r in range(blk, logits.shape[0], nb):
        slot = h.lanes[h.row_lane[r], LANE_SLOT]
        if (h.presence_penalty[slot] != 0 or h.frequency_penalty[slot] != 0
                or h.logit_bias_ids[slot, 0] >= 0):  # the same for the whole block
            adjust_row_from_history(logits, r, h.output_tokens[slot], counters[r],
                                    h.presence_penalty[slot], h.frequency_penalty[slot],
                                    h.logit_bias_ids[slot], h.logit_bias_values[slot])


@cuda.jit(device=True)
def forward_op(op, i, T, R, embed, attn_norm, w_qkv, b_qkv, w_o, b_o, mlp_norm, w_gate_up,
               b_gate_up, w_down, b_down, final_norm, lm_head, no_norm, eps, cos, sin, kv_pool,
               num_heads, num_kv_heads, x, qkv, attn, gate_up, act, logits, all_rows, token_ids,
               positions, seq_rows, block_tables, logit_rows, step_temperature, step_top_p,
               step_top_k, step_seeds, counters, tokens, history, blk, nb):
    """Op ``op`` (of layer ``i``) over T tokens and R rows, this block's share of it.
    x (T, D), qkv (T, (H + 2K) E), attn (T, H E), gate_up (T, 2F), act (T, F) f32 activations;
    token_ids, positions, seq_rows (T,); logit_rows and the sampling parameters (R,)."""
    rows = all_rows[:T]
    if op == EMBED:
        embed_tokens(embed, token_ids[:T], x[:T], blk, nb)
    elif op == QKV:
        linear_in_megakernel(x[:T], rows, attn_norm[i], eps, w_qkv[i], b_qkv[i], qkv[:T], 0, blk, nb)
    elif op == ROPE_KV:
        rope_and_write_kv(qkv[:T], positions[:T], seq_rows[:T], block_tables, cos, sin, kv_pool,
                          i, num_heads, num_kv_heads, blk, nb)
    elif op == ATTENTION:
        paged_attention(qkv[:T], positions[:T], seq_rows[:T], block_tables, kv_pool, i,
                        num_heads, num_kv_heads, attn[:T], blk, nb)
    elif op == O_PROJ:
        linear_in_megakernel(attn[:T], rows, no_norm, eps, w_o[i], b_o[i], x[:T], 1, blk, nb)
    elif op == GATE_UP:
        linear_in_megakernel(x[:T], rows, mlp_norm[i], eps, w_gate_up[i], b_gate_up[i], gate_up[:T], 0, blk, nb)
    elif op == SWIGLU:
        swiglu(gate_up[:T], act[:T], blk, nb)
    elif op == DOWN:
        linear_in_megakernel(act[:T], rows, no_norm, eps, w_down[i], b_down[i], x[:T], 1, blk, nb)
    elif op == LM_HEAD:
        linear_in_megakernel(x[:T], logit_rows[:R], final_norm, eps, lm_head, no_norm, logits[:R], 0, blk, nb)
    else:
        adjust_sampled_rows(logits[:R], counters[:R], history, blk, nb)
        sample_rows(logits[:R], step_temperature[:R], step_top_p[:R], step_top_k[:R],
                    step_seeds[:R], counters[:R], tokens[:R], blk, nb)


@cuda.jit(device=True)
def forward(T, R, embed, attn_norm, w_qkv, b_qkv, w_o, b_o, mlp_norm, w_gate_up, b_gate_up,
            w_down, b_down, final_norm, lm_head, no_norm, eps, cos, sin, kv_pool, num_heads,
            num_kv_heads, x, qkv, attn, gate_up, act, logits, all_rows, token_ids, positions,
            seq_rows, block_tables, logit_rows, step_temperature, step_top_p, step_top_k,
            step_seeds, counters, tokens, history):
    """Inline dispatch: every op of the step in this (cooperative) kernel, a grid barrier after
    each but the last (the caller's barrier follows it)."""
    blk, nb = cuda.blockIdx.x, cuda.gridDim.x
    n = OPS_PER_LAYER * w_qkv.shape[0] + 3
    for k in range(n):
        op, i = op_of_device(k, w_qkv.shape[0])
        forward_op(op, i, T, R, embed, attn_norm, w_qkv, b_qkv, w_o, b_o, mlp_norm, w_gate_up,
                   b_gate_up, w_down, b_down, final_norm, lm_head, no_norm, eps, cos, sin,
                   kv_pool, num_heads, num_kv_heads, x, qkv, attn, gate_up, act, logits,
                   all_rows, token_ids, positions, seq_rows, block_tables, logit_rows,
                   step_temperature, step_top_p, step_top_k, step_seeds, counters, tokens, history,
                   blk, nb)
        if k + 1 < n:
            cuda.cg.this_grid().sync()


@cuda.jit
def forward_op_kernel(op, i, sizes, embed, attn_norm, w_qkv, b_qkv, w_o, b_o, mlp_norm,
                      w_gate_up, b_gate_up, w_down, b_down, final_norm, lm_head, no_norm, eps,
                      cos, sin, kv_pool, num_heads, num_kv_heads, x, qkv, attn, gate_up, act,
                      logits, all_rows, token_ids, positions, seq_rows, block_tables, logit_rows,
                      step_temperature, step_top_p, step_top_k, step_seeds, counters, tokens,
                      history):
    """One op as one kernel (a node of a device-launched graph); T = sizes[0], R = sizes[1],
    written by the scheduler kernel before it launched the graph."""
    forward_op(op, i, sizes[0], sizes[1], embed, attn_norm, w_qkv, b_qkv, w_o, b_o, mlp_norm,
               w_gate_up, b_gate_up, w_down, b_down, final_norm, lm_head, no_norm, eps, cos, sin,
               kv_pool, num_heads, num_kv_heads, x, qkv, attn, gate_up, act, logits, all_rows,
               token_ids, positions, seq_rows, block_tables, logit_rows, step_temperature,
               step_top_p, step_top_k, step_seeds, counters, tokens, history, cuda.blockIdx.x,
               cuda.gridDim.x)


def linear_shape(op: int, config) -> tuple[int, int]:
    """(out_features O, in_features I) of a linear op's weight matrix (the fused layouts)."""
    H, K, E = config.num_heads, config.num_kv_heads, config.head_dim
    D, F = config.hidden_size, config.intermediate_size
    return {QKV: ((H + 2 * K) * E, D), O_PROJ: (D, H * E), GATE_UP: (2 * F, D), DOWN: (D, F),
            LM_HEAD: (config.vocab_size, D)}[op]


def op_grid(op: int, max_tokens: int, max_rows: int, config) -> int:
    """Blocks for ``op`` in a step of up to ``max_tokens`` tokens and ``max_rows`` sampled rows of
    the model ``config`` (a ``ModelConfig``): what every executor launches. A linear op may take
    its GEMV path (T <= GEMV_MAX_ROWS) at run time in a captured graph: enough blocks for both."""
    if op in (QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD):
        O, _ = linear_shape(op, config)
        rows = max_rows if op == LM_HEAD else max_tokens
        return grid_for(max(linear_work_items(rows, O),
                            linear_work_items(min(rows, GEMV_MAX_ROWS), O)))
    if op == ATTENTION:
        return grid_for(max_tokens * config.num_heads)
    if op == ROPE_KV:
        return grid_for(rope_work_items(max_tokens, config.num_heads, config.num_kv_heads,
                                        config.head_dim))
    if op == SWIGLU:
        return grid_for(elementwise_items(max_tokens * config.intermediate_size))
    if op == SAMPLE:
        return grid_for(max_rows)
    return grid_for(elementwise_items(max_tokens * config.hidden_size))  # EMBED
