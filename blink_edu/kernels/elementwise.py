"""Row-wise and element-wise ops: the embedding gather and SwiGLU.

Both are pure memory movement: no reduction, one thread per element, consecutive threads on
consecutive addresses. The elements of the whole batch are spread over every thread of the grid
(thread ``g`` of ``n_blocks * THREADS`` takes elements ``g, g + n_blocks * THREADS, ...``), so
one decode token's row is spread over many blocks instead of queueing on one.
"""

from __future__ import annotations

import math

from numba import float32

from .reduce import THREADS, cuda


@cuda.jit(device=True)
def embed_tokens(embed, token_ids, x, block, n_blocks):
    """x[t, :] = embed[token_ids[t], :]. embed (V, D) f32/f16; token_ids (T,); x (T, D) f32."""
    D = x.shape[1]
    for e in range(block * THREADS + cuda.threadIdx.x, token_ids.shape[0] * D, n_blocks * THREADS):
        t, d = e // D, e % D
        x[t, d] = float32(embed[token_ids[t], d])


@cuda.jit(device=True, inline=True)
def silu_times(g, u):
    """silu(g) * u = g * sigmoid(g) * u: SwiGLU for one element (also the gate/up GEMV's
    epilogue at decode, ``linear.py``)."""
    return g / (float32(1) + math.exp(-g)) * u


@cuda.jit(device=True)
def swiglu(gate_up, act, block, n_blocks):
    """act[t, f] = silu(gate[t, f]) * up[t, f], with gate_up (T, 2F) = [gate | up], act (T, F)."""
    F = act.shape[1]
    for e in range(block * THREADS + cuda.threadIdx.x, act.shape[0] * F, n_blocks * THREADS):
        t, f = e // F, e % F
        act[t, f] = silu_times(gate_up[t, f], gate_up[t, F + f])


def elementwise_items(num_elements: int) -> int:
    """Blocks that give every element of an element-wise op its own thread."""
    return -(-num_elements // THREADS)


@cuda.jit
def embed_tokens_kernel(embed, token_ids, x):
    embed_tokens(embed, token_ids, x, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit
def swiglu_kernel(gate_up, act):
    swiglu(gate_up, act, cuda.blockIdx.x, cuda.gridDim.x)
