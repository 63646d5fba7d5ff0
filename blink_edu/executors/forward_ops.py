"""The forward pass as a numbered list of ops: one device function, two ways to run it.

Blink §3 and §7 (the persistent scheduler *dispatches* each step's forward pass: inline, inside
its own kernel, or by launching the graph executor's graphs from the GPU) and docs/design.md §2. A step
of the model is always the same sequence of ops::

    k = 0                EMBED
    k = 1 .. 7 L         QKV, ROPE_KV, ATTENTION, O_PROJ, GATE_UP, SWIGLU, DOWN   (per layer)
    k = 7 L + 1, + 2     LM_HEAD, SAMPLE

At batch 1, and for a batched step on tensor cores, ROPE_KV and SWIGLU ride in the epilogue of
the projection before them (``kernels/linear.py``: ``linear_qkv_rope``, ``linear_swiglu``;
``fuses_next_op`` says when) and are skipped: ``fused_into_linear(op, T, tensor_cores)`` says
so for the eager and graph executors (a prompt chunk's on the tensor-core tile), and
``fused_into_linear_device`` for the persistent kernel (up to TC_DECODE_MAX_ROWS tokens: it has
no tile) — five ops a layer instead of seven, so five launches or grid barriers.

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

from ..kernels.attention import attention_work_items, paged_attention
from ..kernels.elementwise import elementwise_items, embed_tokens, swiglu
from ..kernels.linear import (GEMV_MAX_ROWS, TC_DECODE_MAX_ROWS,
                              fuses_next_op, fuses_next_op_device, linear, linear_qkv_rope,
                              linear_swiglu, linear_work_items)
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


def fused_into_linear(op, num_tokens, tensor_cores):
    """Whether ``op`` has nothing to do in a host-launched step (eager, graph) of ``num_tokens``
    tokens, because the projection before it did it in its epilogue (``linear.fuses_next_op``):
    RoPE and the KV write, and SwiGLU, at any size on tensor cores
    (``linear.launch_linear_qkv_rope``, ``linear.launch_linear_swiglu``)."""
    return (op == ROPE_KV or op == SWIGLU) and fuses_next_op(num_tokens, tensor_cores,
                                                             num_tokens)


@cuda.jit(device=True)
def fused_into_linear_device(op, num_tokens, tensor_cores):
    """The same inside the persistent kernel, which has no split-K tile to take an unfused
    gate/up: both fusions up to TC_DECODE_MAX_ROWS tokens."""
    return (op == ROPE_KV or op == SWIGLU) and fuses_next_op_device(num_tokens, tensor_cores,
                                                                    TC_DECODE_MAX_ROWS)


class ModelArrays(NamedTuple):
    """The model on the device, as one argument group of a kernel that may run any op: every
    per-layer array stacked on a leading layer axis L (a kernel cannot take a Python list of
    per-layer arrays), in the eager executor's fused layouts (``kernel_executor.fused_layer``)."""

    embed: object  # (V, D) weight dtype
    attn_norm: object  # (L, D) f32
    w_qkv: object  # (L, (H + 2K) E, D)
    b_qkv: object  # (L, (H + 2K) E) f32, or (L, 0): no bias
    w_o: object  # (L, D, H E)
    b_o: object  # (L, D) or (L, 0)
    mlp_norm: object  # (L, D) f32
    w_gate_up: object  # (L, 2F, D) = [W_gate; W_up]
    b_gate_up: object  # (L, 2F) or (L, 0)
    w_down: object  # (L, D, F)
    b_down: object  # (L, D) or (L, 0)
    final_norm: object  # (D,) f32
    lm_head: object  # (V, D) (the embedding itself when the two are tied)
    no_norm: object  # (0,) f32: "no norm" for a linear op
    cos: object  # (P, E/2) f32 RoPE tables, by position
    sin: object  # (P, E/2) f32
    kv_pool: object  # (N, L, 2, B, K, E) f32 the paged KV cache
    eps: object  # float32 RMSNorm epsilon
    num_heads: object  # H (int)
    num_kv_heads: object  # K (int)
    tensor_cores: object  # bool: batched steps on tensor cores (``linear.uses_tensor_cores``)


class StepBuffers(NamedTuple):
    """One step's arrays, as one argument group: the flat batch (written by whoever planned the
    step), the activations the ops pass along, and the sampled tokens. Sized for the largest step
    (T tokens, S sampled rows); a step of T' <= T tokens and R <= S rows uses the leading rows."""

    x: object  # (T, D) f32 the residual stream
    qkv: object  # (T, (H + 2K) E) f32
    attn: object  # (T, H E) f32
    gate_up: object  # (T, 2F) f32
    act: object  # (T, F) f32
    logits: object  # (S, V) f32
    all_rows: object  # (T,) i32 0, 1, ..., T - 1
    token_ids: object  # (T,) i32
    positions: object  # (T,) i32
    seq_rows: object  # (T,) i32 each token's row of block_tables
    block_tables: object  # (S', W) i32 KV block ids per sequence
    logit_rows: object  # (S,) i32 the token each sampled row samples after
    step_temperature: object  # (S,) f32, and the rest of the sampling parameters per row
    step_top_p: object  # (S,) f32
    step_top_k: object  # (S,) i32
    step_seeds: object  # (S,) u32
    counters: object  # (S,) i32 tokens the row's request has generated (its random stream)
    tokens: object  # (S,) i32 the sampled tokens
    attn_partials: object  # (P, E + 2) f32 and (P,) i32: what attention's splits exchange
    attn_arrivals: object  # (``attention.attention_scratch``)


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
def forward_op(op, i, T, R, model, step, history, blk, nb):
    """Op ``op`` (of layer ``i``) over T tokens and R sampled rows, this block's share of it.
    ``model``: ModelArrays; ``step``: StepBuffers; ``history``: SamplingHistory."""
    m, s = model, step
    H, K, tc = m.num_heads, m.num_kv_heads, m.tensor_cores
    rows = s.all_rows[:T]
    x, qkv, positions, seq_rows = s.x[:T], s.qkv[:T], s.positions[:T], s.seq_rows[:T]
    if op == EMBED:
        embed_tokens(m.embed, s.token_ids[:T], x, blk, nb)
    elif fused_into_linear_device(op, T, tc):
        pass  # done in the epilogue of the projection before it
    elif op == QKV and fused_into_linear_device(ROPE_KV, T, tc):
        linear_qkv_rope(x, rows, m.attn_norm[i], m.eps, m.w_qkv[i], m.b_qkv[i], qkv, positions,
                        seq_rows, s.block_tables, m.cos, m.sin, m.kv_pool, i, H, K, blk, nb)
    elif op == QKV:
        linear(x, rows, m.attn_norm[i], m.eps, m.w_qkv[i], m.b_qkv[i], qkv, 0, tc, blk, nb)
    elif op == ROPE_KV:
        rope_and_write_kv(qkv, positions, seq_rows, s.block_tables, m.cos, m.sin, m.kv_pool, i,
                          H, K, blk, nb)
    elif op == ATTENTION:
        paged_attention(qkv, positions, seq_rows, s.block_tables, m.kv_pool, i, H, K, s.attn[:T],
                        s.attn_partials, s.attn_arrivals, tc, blk, nb)
    elif op == O_PROJ:
        linear(s.attn[:T], rows, m.no_norm, m.eps, m.w_o[i], m.b_o[i], x, 1, tc, blk, nb)
    elif op == GATE_UP and fused_into_linear_device(SWIGLU, T, tc):
        linear_swiglu(x, rows, m.mlp_norm[i], m.eps, m.w_gate_up[i], m.b_gate_up[i], s.act[:T],
                      blk, nb)
    elif op == GATE_UP:
        linear(x, rows, m.mlp_norm[i], m.eps, m.w_gate_up[i], m.b_gate_up[i], s.gate_up[:T], 0,
               tc, blk, nb)
    elif op == SWIGLU:
        swiglu(s.gate_up[:T], s.act[:T], blk, nb)
    elif op == DOWN:
        linear(s.act[:T], rows, m.no_norm, m.eps, m.w_down[i], m.b_down[i], x, 1, tc, blk, nb)
    elif op == LM_HEAD:
        linear(x, s.logit_rows[:R], m.final_norm, m.eps, m.lm_head, m.no_norm, s.logits[:R], 0,
               tc, blk, nb)
    else:
        adjust_sampled_rows(s.logits[:R], s.counters[:R], history, blk, nb)
        sample_rows(s.logits[:R], s.step_temperature[:R], s.step_top_p[:R], s.step_top_k[:R],
                    s.step_seeds[:R], s.counters[:R], s.tokens[:R], blk, nb)


@cuda.jit(device=True)
def forward(T, R, model, step, history):
    """Inline dispatch: every op of the step in this (cooperative) kernel, a grid barrier after
    each but the last (the caller's barrier follows it); an op fused into its GEMV is skipped,
    barrier and all."""
    blk, nb = cuda.blockIdx.x, cuda.gridDim.x
    L = model.w_qkv.shape[0]
    n = OPS_PER_LAYER * L + 3
    for k in range(n):
        op, i = op_of_device(k, L)
        if fused_into_linear_device(op, T, model.tensor_cores):
            continue
        forward_op(op, i, T, R, model, step, history, blk, nb)
        if k + 1 < n:
            cuda.cg.this_grid().sync()


@cuda.jit
def forward_op_kernel(op, i, sizes, model, step, history):
    """One op as one kernel (a node of a device-launched graph); T = sizes[0], R = sizes[1],
    written by the scheduler kernel before it launched the graph."""
    forward_op(op, i, sizes[0], sizes[1], model, step, history, cuda.blockIdx.x, cuda.gridDim.x)


def linear_shape(op: int, config) -> tuple[int, int]:
    """(out_features O, in_features I) of a linear op's weight matrix (the fused layouts)."""
    H, K, E = config.num_heads, config.num_kv_heads, config.head_dim
    D, F = config.hidden_size, config.intermediate_size
    return {QKV: ((H + 2 * K) * E, D), O_PROJ: (D, H * E), GATE_UP: (2 * F, D), DOWN: (D, F),
            LM_HEAD: (config.vocab_size, D)}[op]


# Blocks enough for the element-wise ops (RoPE, SwiGLU, the embedding) to give each element a
# thread of its own up to 2M elements (a 1365-token prompt's SwiGLU). With fewer threads than
# elements a thread loops, and its next loads cannot start before its last store (the compiler
# cannot tell that they touch other addresses): with 1024 blocks a 512-token prompt's SwiGLU
# took six memory round trips a thread, one after another.
ONE_THREAD_AN_ITEM = 16384


def op_grid(op: int, max_tokens: int, max_rows: int, config, tensor_cores: bool = False) -> int:
    """Blocks for ``op`` in a step of up to ``max_tokens`` tokens and ``max_rows`` sampled rows of
    the model ``config`` (a ``ModelConfig``): what every executor launches. A linear op may take
    its GEMV path (T <= GEMV_MAX_ROWS) at run time in a captured graph: enough blocks for both.
    ``tensor_cores``: the batched path is ``matmul_tc_decode`` (``linear.uses_tensor_cores``) and
    attention has its prompt tiles (``attention_tc.py``) beside its (token, head) pairs."""
    if op in (QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD):
        O, _ = linear_shape(op, config)
        rows = max_rows if op == LM_HEAD else max_tokens
        return grid_for(max(linear_work_items(rows, O, tensor_cores),
                            linear_work_items(min(rows, GEMV_MAX_ROWS), O)))
    if op == ATTENTION:
        return grid_for(attention_work_items(max_tokens, config.num_heads, config.num_kv_heads,
                                             config.head_dim, tensor_cores))
    if op == ROPE_KV:
        return grid_for(rope_work_items(max_tokens, config.num_heads, config.num_kv_heads,
                                        config.head_dim), ONE_THREAD_AN_ITEM)
    if op == SWIGLU:
        return grid_for(elementwise_items(max_tokens * config.intermediate_size),
                        ONE_THREAD_AN_ITEM)
    if op == SAMPLE:
        return grid_for(max_rows)
    return grid_for(elementwise_items(max_tokens * config.hidden_size), ONE_THREAD_AN_ITEM)
