"""Lab 1 — kernels: fused RMSNorm + GEMV, and paged attention over a ragged batch.

Read first: ``notebooks/labs/lab1_kernels.ipynb`` (the story, with figures) and
``blink_edu/model/reference.py`` (``rms_norm``, ``linear``, ``paged_attention``: the NumPy oracle
your kernels must agree with). Check your work with::

    python -m blink_edu.labs check 1

Your kernels run inside the real engine: ``blink_edu.labs.plug.lab1.LabExecutor`` is the eager
executor with *your* kernels launched in place of the project's, and the tests generate tokens
with it and compare them with the NumPy reference model. Without a GPU everything runs in Numba's
CUDA simulator, where every CUDA thread is a Python thread: keep your kernels simple (one thread
per output element is perfect here), correctness first.

Launch geometry (the plug does it for you): a 1-D grid of ``ceil(n_items / THREADS)`` blocks of
``THREADS`` threads; ``i = cuda.grid(1)`` is your thread's global index, and a thread with
``i >= n_items`` must do nothing.

Shapes (letters as in ``model/reference.py``): T tokens in the flat batch, R rows to compute,
I in-features, O out-features, H query heads, K kv heads, E head dim, B block size,
N KV blocks, L layers.
"""

from __future__ import annotations

import math  # noqa: F401 - for your kernels

from numba import float32  # noqa: F401 - for your kernels

from ..kernels.reduce import cuda


# --- Lab 1.1 ------------------------------------------------------------------------------------
@cuda.jit(device=True)
def inv_rms(x, row, eps):
    """The RMSNorm scale of one row: ``1 / sqrt(mean(x[row, :] ** 2) + eps)``.

    x (T, I) float32; ``row`` an index into x; ``eps`` a small float32. Returns a float32.
    RMSNorm(x)[row] is ``x[row] * inv_rms(x, row, eps) * norm_weight``.
    Accumulate in float32: ``total = float32(0)``.
    """
    # TODO: Lab 1.1 — loop over the I columns of x[row], add up the squares, divide by I,
    # add eps and return 1 / sqrt(...) (math.sqrt works inside a kernel).
    raise NotImplementedError("Lab 1.1: inv_rms")


# --- Lab 1.2 ------------------------------------------------------------------------------------
@cuda.jit
def rmsnorm_gemv_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    """out[r, o] (+)= rms_norm?(x[x_rows[r]]) . w[o] + bias[o] — one thread per (r, o).

    x (T, I) float32: the input rows; x_rows (R,) int32: which rows of x to use;
    norm_w (I,) float32, or shape (0,) for "no norm"; eps float32;
    w (O, I) float32 or float16 (read each weight as ``float32(w[o, i])``);
    bias (O,) float32, or shape (0,) for "no bias";
    out (R, O) float32; accumulate 0 or 1.

    With a norm: ``y = inv_rms(x, x_rows[r], eps) * sum_i x[x_rows[r], i] * norm_w[i] * w[o, i]``;
    without one (``norm_w.shape[0] == 0``): ``y = sum_i x[x_rows[r], i] * w[o, i]``. Then add
    ``bias[o]`` if there is a bias, and if ``accumulate`` is 1 add onto what ``out[r, o]`` holds
    (the residual stream) instead of overwriting it.

    There are R * O work items: thread ``i = cuda.grid(1)`` owns ``r = i // O``, ``o = i % O``.
    """
    # TODO: Lab 1.2 — compute your (r, o), the dot product (using inv_rms from Lab 1.1 when
    # there is a norm), then the bias and the residual, and store out[r, o].
    raise NotImplementedError("Lab 1.2: rmsnorm_gemv_kernel")


# --- Lab 1.3 ------------------------------------------------------------------------------------
@cuda.jit
def paged_attention_kernel(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                           num_kv_heads, out):
    """Causal attention of every token over its own sequence's cached keys and values, through
    the block table — one thread per (token t, query head h).

    qkv (T, (H + 2K) * E) float32: the query of head h of token t is ``qkv[t, h*E:(h+1)*E]``
    (the keys and values of this step are already in the cache);
    positions (T,) int32: token t sits at position ``p = positions[t]`` of its sequence;
    seq_rows (T,) int32: its sequence's row in block_tables;
    block_tables (S, W) int32: position c of sequence row s lives in KV block
    ``block_tables[s, c // B]``, slot ``c % B``;
    kv_pool (N, L, 2, B, K, E) float32: ``kv_pool[blk, layer, 0, slot, kvh, :]`` is a key,
    ``kv_pool[blk, layer, 1, slot, kvh, :]`` a value;
    out (T, H * E) float32: write ``out[t, h*E:(h+1)*E]``.

    Token t attends to positions 0..p of its sequence (nothing later: that is the causal mask).
    Query head h reads kv head ``h // (H // K)`` (grouped-query attention).
    ``score_c = q . k_c / sqrt(E)``, ``weight_c = exp(score_c - max_score) / sum(...)``,
    ``out = sum_c weight_c * v_c``. Subtract the max before ``exp`` (or keep a running max, as
    in FlashAttention's online softmax): exp of a large score overflows.

    There are T * H work items: thread ``i = cuda.grid(1)`` owns ``t = i // H``, ``h = i % H``.
    """
    # TODO: Lab 1.3 — find your (t, h), its kv head, its context length p + 1; walk the context
    # (once for the max, once for the weights and the weighted sum of values, written into out).
    raise NotImplementedError("Lab 1.3: paged_attention_kernel")
