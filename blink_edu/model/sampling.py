"""Sampling the next token: greedy, temperature, top-k, top-p — with a counter-based RNG.

The reference that the GPU sampling kernel must reproduce token for token (issue: kernels).

Reproducibility across backends needs randomness that is a pure *function* rather than a
stateful generator: the ``n``-th token of a request with seed ``s`` uses ``u = uniform(s, n)``, a
hash of the two integers. Any backend, any batch composition, any order of requests gives the same
``u`` — so a seed reproduces its tokens in NumPy, in the simulator and on the GPU. The hash is
Chris Wellons' ``lowbias32`` on 32-bit unsigned integers, cheap on a GPU.

The draw itself is an inverse CDF over the candidates sorted by probability (ties: lower id
first): keep the ``top_k`` most likely, then the shortest prefix whose probability reaches
``top_p``, renormalise, and take the first candidate whose cumulative probability exceeds ``u``.
"""

from __future__ import annotations

import numpy as np

from ..config import SamplingParams

MASK32 = 0xFFFFFFFF


def lowbias32(x: int) -> int:
    """A 32-bit integer hash with good avalanche (Wellons, 2018)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    x ^= x >> 16
    return x


def uniform(seed: int, counter: int) -> float:
    """A float in [0, 1) from (seed, counter): 24 random bits, exact in float32."""
    h = lowbias32(lowbias32(seed & MASK32) ^ ((counter * 0x9E3779B9) & MASK32))
    return (h >> 8) / float(1 << 24)


def sample(logits: np.ndarray, params: SamplingParams, seed: int, counter: int) -> int:
    """Pick one token id from ``logits`` (V,) for the ``counter``-th generated token."""
    if params.greedy:
        return int(np.argmax(logits))  # first maximum = lowest id on ties
    scaled = logits.astype(np.float64) / params.temperature  # (V,)
    order = np.argsort(-scaled, kind="stable")  # (V,) most likely first, ties by id
    if params.top_k > 0:
        order = order[: params.top_k]
    probs = np.exp(scaled[order] - scaled[order[0]])  # (C,) unnormalised, candidates only
    probs /= probs.sum()
    if params.top_p < 1.0:
        cumulative = np.cumsum(probs)
        keep = int(np.searchsorted(cumulative, params.top_p)) + 1  # shortest prefix >= top_p
        order, probs = order[:keep], probs[:keep] / cumulative[keep - 1]
    cdf = np.cumsum(probs)
    pick = int(np.searchsorted(cdf, uniform(seed, counter) * cdf[-1], side="right"))
    return int(order[min(pick, len(order) - 1)])
