"""The NumPy reference model: one forward pass over a flat batch of tokens, with a paged KV cache.

docs/design.md §2–3. This is the *oracle*: every GPU kernel is tested against it, and it is tested
against Hugging Face ``transformers``. It is also the compute path of the server on a machine
without a GPU. It is written for clarity: vectorised NumPy, float32, a shape comment on every
tensor. Letters: T tokens in the flat batch, D hidden, H query heads, K kv heads, E head dim,
G = H // K query heads per kv head, F FFN width, V vocab, B block size, C context length.

**The flat batch** is how continuous batching feeds a model (vLLM, Orca): the tokens of several
sequences are concatenated into one list, each with its sequence and position. A sequence may
contribute a whole prompt, a chunk of one (chunked prefill), or a single decode token — all in
the same step. Per token we have:

    token_ids[t]   which token                 (T,)
    positions[t]   its position in its sequence (T,)
    seq_rows[t]    which row of block_tables    (T,)

Every layer first *writes* the batch's keys and values into the paged cache (block
``block_tables[row, p // B]``, slot ``p % B``), then each token attends to every cached position
``<= p`` of its own sequence. Writing before reading makes prefill, chunked prefill and decode the
same code path.
"""

from __future__ import annotations


import numpy as np

from ..config import ModelConfig, rope_inverse_frequencies
from .weights import LayerWeights, ModelWeights


# --- the ops -----------------------------------------------------------------------------------
def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (T, D) -> x / sqrt(mean(x^2) + eps) * weight, (T, D)."""
    variance = np.mean(x * x, axis=-1, keepdims=True)  # (T, 1)
    return x / np.sqrt(variance + eps) * weight


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x (T, in) @ w.T (in, out) [+ b (out,)] -> (T, out). Hugging Face stores w as (out, in)."""
    y = x @ w.T
    return y if b is None else y + b


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), written with tanh so that large |x| never overflows."""
    return 0.5 * x * (1.0 + np.tanh(0.5 * x))


def rope_tables(config: ModelConfig, positions: np.ndarray, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (T, E/2) for each token's position (angles computed in float64)."""
    inv_freq = rope_inverse_frequencies(config)  # (E/2,) float64
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # (T, E/2)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (x[i], x[i + E/2]) by each token's angle (Llama's "rotate half" convention).
    x (T, heads, E), cos/sin (T, E/2) -> (T, heads, E)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (T, heads, E/2) each
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, E/2)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def write_kv(kv_pool: np.ndarray, layer: int, k: np.ndarray, v: np.ndarray,
             slot_blocks: np.ndarray, slot_offsets: np.ndarray) -> None:
    """Store each token's key and value in its paged slot.
    kv_pool (N, L, 2, B, K, E); k, v (T, K, E); slot_blocks, slot_offsets (T,)."""
    kv_pool[slot_blocks, layer, 0, slot_offsets] = k
    kv_pool[slot_blocks, layer, 1, slot_offsets] = v


def gather_context(kv_pool: np.ndarray, layer: int, block_table: np.ndarray,
                   context_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``context_len`` cached keys and values of one sequence, in order.
    block_table (blocks,) -> keys, values (C, K, E)."""
    B = kv_pool.shape[3]
    blocks = block_table[: -(-context_len // B)]  # (nb,)
    k = kv_pool[blocks, layer, 0].reshape(-1, *kv_pool.shape[4:])[:context_len]  # (C, K, E)
    v = kv_pool[blocks, layer, 1].reshape(-1, *kv_pool.shape[4:])[:context_len]  # (C, K, E)
    return k, v


def paged_attention(q: np.ndarray, positions: np.ndarray, seq_rows: np.ndarray,
                    kv_pool: np.ndarray, layer: int, block_tables: np.ndarray) -> np.ndarray:
    """Causal attention of every token over its own sequence's cached keys and values.
    q (T, H, E); positions, seq_rows (T,); block_tables (S, max_blocks) -> (T, H, E)."""
    T, H, E = q.shape
    K = kv_pool.shape[4]
    G = H // K
    out = np.empty_like(q)  # (T, H, E)
    for row in np.unique(seq_rows):
        idx = np.nonzero(seq_rows == row)[0]  # this sequence's tokens in the batch
        pos = positions[idx]  # (n,)
        keys, values = gather_context(kv_pool, layer, block_tables[row], int(pos.max()) + 1)
        qg = q[idx].reshape(len(idx), K, G, E)  # (n, K, G, E)
        scores = np.einsum("nkge,cke->nkgc", qg, keys) / np.sqrt(E)  # (n, K, G, C)
        future = np.arange(keys.shape[0])[None, :] > pos[:, None]  # (n, C)
        scores[np.broadcast_to(future[:, None, None, :], scores.shape)] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)  # (n, K, G, C)
        out[idx] = np.einsum("nkgc,cke->nkge", weights, values).reshape(len(idx), H, E)
    return out


def attention_block(x: np.ndarray, lw: LayerWeights, config: ModelConfig, layer: int,
                    cos: np.ndarray, sin: np.ndarray, positions: np.ndarray, seq_rows: np.ndarray,
                    kv_pool: np.ndarray, block_tables: np.ndarray,
                    slot_blocks: np.ndarray, slot_offsets: np.ndarray) -> np.ndarray:
    """x (T, D) -> attention output (T, D), after writing this layer's K and V to the cache."""
    T = x.shape[0]
    H, K, E = config.num_heads, config.num_kv_heads, config.head_dim
    h = rms_norm(x, lw.attn_norm, config.rms_norm_eps)  # (T, D)
    q = linear(h, lw.wq, lw.bq).reshape(T, H, E)  # (T, H, E)
    k = linear(h, lw.wk, lw.bk).reshape(T, K, E)  # (T, K, E)
    v = linear(h, lw.wv, lw.bv).reshape(T, K, E)  # (T, K, E)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    write_kv(kv_pool, layer, k, v, slot_blocks, slot_offsets)
    attn = paged_attention(q, positions, seq_rows, kv_pool, layer, block_tables)  # (T, H, E)
    return linear(attn.reshape(T, H * E), lw.wo, lw.bo)  # (T, D)


def mlp_block(x: np.ndarray, lw: LayerWeights, config: ModelConfig) -> np.ndarray:
    """SwiGLU: down(silu(gate(h)) * up(h)), h = rms_norm(x). (T, D) -> (T, D)."""
    h = rms_norm(x, lw.mlp_norm, config.rms_norm_eps)  # (T, D)
    gate = linear(h, lw.w_gate, lw.b_gate)  # (T, F)
    up = linear(h, lw.w_up, lw.b_up)  # (T, F)
    return linear(silu(gate) * up, lw.w_down, lw.b_down)  # (T, D)


def forward(weights: ModelWeights, kv_pool: np.ndarray, token_ids: np.ndarray,
            positions: np.ndarray, seq_rows: np.ndarray, block_tables: np.ndarray,
            logit_rows: np.ndarray | None = None) -> np.ndarray:
    """One step of the model over a flat batch; returns logits (R, V) for the tokens listed in
    ``logit_rows`` (all T tokens if None). Writes the batch's K/V into ``kv_pool`` as it goes.

    token_ids, positions, seq_rows (T,) int; block_tables (S, max_blocks) int32;
    kv_pool (N, L, 2, B, K, E). Computes in the weights' dtype (float32; float64 for tests
    that must not depend on rounding).
    """
    config = weights.config
    B = kv_pool.shape[3]
    slot_blocks = block_tables[seq_rows, positions // B]  # (T,) which block each token goes to
    slot_offsets = positions % B  # (T,) and where in it
    if (slot_blocks < 0).any():
        raise ValueError("a token's position lies beyond its sequence's block table")
    x = weights.embed[token_ids]  # (T, D)
    cos, sin = rope_tables(config, positions, x.dtype)  # (T, E/2)
    for layer, lw in enumerate(weights.layers):
        x = x + attention_block(x, lw, config, layer, cos, sin, positions, seq_rows,
                                kv_pool, block_tables, slot_blocks, slot_offsets)
        x = x + mlp_block(x, lw, config)
    if logit_rows is not None:
        x = x[logit_rows]  # (R, D) only the rows whose next token we need
    x = rms_norm(x, weights.final_norm, config.rms_norm_eps)
    return x @ weights.lm_head.T  # (R, V)


# --- the oracle generation loop ---------------------------------------------------------------
def generate(weights: ModelWeights, prompts: list[list[int]], params, *, block_size: int = 16,
             prefill_chunk: int = 0, on_token=None) -> list[list[int]]:
    """Generate for several prompts at once, continuously batched, over the paged cache.

    Each step builds one flat batch: every unfinished sequence contributes its next prompt chunk
    (``prefill_chunk`` tokens at most; 0 = the whole prompt) or, once prefilled, its one decode
    token. Stops a sequence at ``params.max_tokens``, at an EOS id (unless ``ignore_eos``) or at
    one of ``params.stop_token_ids``. ``params`` is one ``SamplingParams`` for all prompts or a
    list with one per prompt (a request's ``seed`` fixes its samples whatever else is batched with
    it; ``seed=None`` draws a fresh one). ``on_token(i, token_id)`` is called for each new token.
    The oracle that engine and kernels are compared with; small and sequential on purpose.
    """
    from ..kv.block_manager import BlockManager, blocks_needed
    from ..kv.pool import allocate_kv_pool
    from .sampling import sample

    config = weights.config
    per_seq = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    if len(per_seq) != len(prompts):
        raise ValueError(f"{len(per_seq)} SamplingParams for {len(prompts)} prompts")
    fresh = np.random.default_rng()  # only for requests without a seed
    seeds = [p.seed if p.seed is not None else int(fresh.integers(2**31)) for p in per_seq]
    stops = [set(p.stop_token_ids) | (set() if p.ignore_eos else set(config.eos_token_ids))
             for p in per_seq]
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty")
        if max(prompt) >= config.vocab_size or min(prompt) < 0:
            raise ValueError(f"prompt {i} has a token id outside [0, {config.vocab_size})")
    total = sum(blocks_needed(len(p) + q.max_tokens, block_size) for p, q in zip(prompts, per_seq))
    blocks = BlockManager(total, block_size)
    kv_pool = allocate_kv_pool(config, total, block_size, dtype=weights.embed.dtype)
    tokens = [list(p) for p in prompts]  # prompt + generated, per sequence
    done_prefill = [0] * len(prompts)  # how many prompt tokens are in the cache
    outputs: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))
    while live:
        ids, pos, rows, last = [], [], [], []
        for s in live:
            n_cached = done_prefill[s] if done_prefill[s] < len(prompts[s]) else len(tokens[s]) - 1
            n_new = len(tokens[s]) - n_cached
            if prefill_chunk and n_cached < len(prompts[s]):
                n_new = min(n_new, prefill_chunk)
            blocks.grow(s, n_cached + n_new)
            ids += tokens[s][n_cached:n_cached + n_new]
            pos += range(n_cached, n_cached + n_new)
            rows += [s] * n_new
            last.append(len(ids) - 1)
            done_prefill[s] = max(done_prefill[s], min(n_cached + n_new, len(prompts[s])))
        table = blocks.block_table_array(live)  # (S, max_blocks)
        row_of = {s: r for r, s in enumerate(live)}
        logits = forward(weights, kv_pool, np.array(ids), np.array(pos),
                         np.array([row_of[s] for s in rows]), table, np.array(last))  # (S, V)
        still = []
        for r, s in enumerate(live):
            if done_prefill[s] < len(prompts[s]):  # mid-prompt chunk: no token yet
                still.append(s)
                continue
            blocks.mark_written(s, len(tokens[s]))
            token = sample(logits[r], per_seq[s], seed=seeds[s], counter=len(outputs[s]),
                           output_token_ids=outputs[s])
            tokens[s].append(token)
            outputs[s].append(token)
            if on_token:
                on_token(s, token)
            if token in stops[s] or len(outputs[s]) >= per_seq[s].max_tokens:
                blocks.free(s)
            else:
                still.append(s)
        live = still
    blocks.check()
    return outputs
