"""Sampling the next token: logit adjustments, greedy, temperature, top-k, top-p — with a
counter-based RNG.

The reference that the GPU sampling kernel reproduces token for token.

**Log-probabilities** (``token_logprobs``, for a request's ``logprobs``) are those of the
distribution the sampler starts from: the model's logits after the logit adjustments, before
temperature, top-k and top-p (as vLLM reports them), computed on the host from the step's logits.

**Logit adjustments first** (OpenAI's definitions). For a token ``t`` generated ``c[t]`` times
so far by this request::

    logit[t] += logit_bias[t] - frequency_penalty * c[t] - presence_penalty * (c[t] > 0)

Only the tokens named in ``logit_bias`` or already generated change, so the adjustment travels
as a short list of ``(token, delta)`` pairs (``logit_adjustments``): the engine builds one per
sequence from its generated tokens, and every executor adds the deltas to its logits the same
way (``add_adjustments`` here, ``adjust_logits_kernel`` on the GPU) before sampling.

**Randomness as a function.** Reproducibility across backends needs randomness that is a pure
function rather than a stateful generator: the ``n``-th token of a request with seed ``s`` uses
``u = uniform(s, n)``, a hash of the two integers. Any backend, any batch composition, any order of
requests gives the same ``u`` — so a seed reproduces its tokens in NumPy, in the simulator and on
the GPU. The hash is Chris Wellons' ``lowbias32`` on 32-bit unsigned integers, cheap on a GPU.

**Filters as thresholds** (no sort, so a GPU block can do it with reductions). On the scaled
logits ``z[i] = (logit[i] - max) / temperature`` (float32, ``max z = 0``):

1. top-k keeps ``z[i] >= t_k``, where ``t_k`` is the k-th largest ``z`` (ties at the edge stay).
2. top-p keeps ``z[i] >= t_p``, where ``t_p`` is the *largest* value whose kept mass
   ``sum(exp(z[j]) for z[j] >= t_p)`` reaches ``top_p`` of the mass left after top-k: the
   smallest nucleus.
3. The draw walks the kept tokens in id order and returns the first whose running sum of
   ``exp(z)`` exceeds ``u * kept_mass`` (an inverse CDF).

A GPU finds ``t_k`` and ``t_p`` by bisection (each probe one block-wide count or sum), and the
draw with a block-wide prefix sum.
"""

from __future__ import annotations

from typing import NamedTuple

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


def logit_adjustments(params: SamplingParams,
                      output_token_ids) -> tuple[np.ndarray, np.ndarray]:
    """(ids, deltas): the tokens whose logit changes, each once, ascending (int32), and by how
    much (float32) -- bias minus penalties, from the tokens generated so far. Empty when the
    request asks for no adjustment."""
    delta = dict(params.logit_bias)
    if params.presence_penalty or params.frequency_penalty:
        tokens, counts = np.unique(np.asarray(output_token_ids, np.int64), return_counts=True)
        for token, count in zip(tokens.tolist(), counts.tolist()):
            delta[token] = (delta.get(token, 0.0) - params.frequency_penalty * count
                            - params.presence_penalty)
    ids = np.array(sorted(delta), np.int32)  # (P,)
    return ids, np.array([delta[t] for t in ids.tolist()], np.float32)  # (P,)


def add_adjustments(logits: np.ndarray, ids: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """``logits`` (V,) float32 with ``deltas`` added at ``ids`` (a copy)."""
    out = logits.astype(np.float32)  # (V,)
    out[ids] += deltas
    return out


def filtered_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Unnormalised probabilities (V,) float32 after temperature, top-k and top-p; 0 = dropped."""
    logits = logits.astype(np.float32)
    z = (logits - logits.max()) / np.float32(params.temperature)  # (V,) scaled logits, max 0
    keep = np.ones(z.shape, dtype=bool)
    if 0 < params.top_k < z.size:
        t_k = np.partition(z, z.size - params.top_k)[z.size - params.top_k]  # k-th largest
        keep &= z >= t_k
    if params.top_p < 1.0:
        desc = np.sort(z[keep])[::-1]  # kept scaled logits, largest first
        mass = np.cumsum(np.exp(desc), dtype=np.float64)  # (kept,)
        j = int(np.searchsorted(mass, params.top_p * mass[-1]))  # first prefix reaching top_p
        keep &= z >= desc[min(j, desc.size - 1)]
    return np.where(keep, np.exp(z), np.float32(0))


def sample(logits: np.ndarray, params: SamplingParams, seed: int, counter: int,
           output_token_ids=()) -> int:
    """Pick one token id from ``logits`` (V,) for the ``counter``-th generated token;
    ``output_token_ids``: the tokens generated so far (for the penalties)."""
    if params.adjusts_logits:
        logits = add_adjustments(logits, *logit_adjustments(params, output_token_ids))
    if params.greedy:
        return int(np.argmax(logits))  # first maximum = lowest id on ties
    p = filtered_probs(logits, params)  # (V,)
    running = np.cumsum(p, dtype=np.float64)  # (V,) inverse CDF in token-id order
    target = uniform(seed, counter) * running[-1]
    pick = int(np.searchsorted(running, target, side="right"))
    return min(pick, int(np.flatnonzero(p)[-1]))


class TokenLogprobs(NamedTuple):
    """The chosen token's log-probability and the ``n`` most likely ``(token, logprob)`` pairs,
    most likely first (ties: lowest id first)."""

    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprobs(logits: np.ndarray, token: int, top_n: int) -> TokenLogprobs:
    """Log-softmax of ``logits`` (V,): ``token``'s entry and the ``top_n`` largest."""
    z = logits.astype(np.float64)  # (V,)
    z = z - z.max()
    logp = z - np.log(np.exp(z).sum())  # (V,)
    best = np.lexsort((np.arange(logp.size), -logp))[:top_n]  # (top_n,) by logprob, then id
    return TokenLogprobs(float(logp[token]), tuple((int(t), float(logp[t])) for t in best))
