"""Row-wise and element-wise ops: the embedding gather and SwiGLU.

Both are pure memory movement: no reduction, one thread per element, consecutive threads on
consecutive addresses. A work item is one token's row.
"""

from __future__ import annotations

import math

from numba import float32

from .reduce import THREADS, cuda


@cuda.jit(device=True)
def embed_tokens(embed, token_ids, x, block, n_blocks):
    """x[t, :] = embed[token_ids[t], :]. embed (V, D) f32/f16; token_ids (T,); x (T, D) f32."""
    for t in range(block, token_ids.shape[0], n_blocks):
        row = token_ids[t]
        for d in range(cuda.threadIdx.x, x.shape[1], THREADS):
            x[t, d] = float32(embed[row, d])


@cuda.jit(device=True)
def swiglu(gate_up, act, block, n_blocks):
    """act[t, f] = silu(gate[t, f]) * up[t, f], with gate_up (T, 2F) = [gate | up], act (T, F)."""
    F = act.shape[1]
    for t in range(block, act.shape[0], n_blocks):
        for f in range(cuda.threadIdx.x, F, THREADS):
            g = gate_up[t, f]
            act[t, f] = g / (float32(1) + math.exp(-g)) * gate_up[t, F + f]


@cuda.jit
def embed_tokens_kernel(embed, token_ids, x):
    embed_tokens(embed, token_ids, x, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def swiglu_kernel(gate_up, act):
    swiglu(gate_up, act, cuda.blockIdx.x, cuda.gridDim.x)
