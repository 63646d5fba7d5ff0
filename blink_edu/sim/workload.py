"""Seeded workloads: who arrives when, with how long a prompt, asking for how many tokens.

docs/design.md §9 (one seeded workload replayed for every policy or executor) and the load model
of vLLM's ``benchmark_serving.py``. The simulator, the replay on the real engine
(``bench.slo_real``) and the serving benchmark (``bench.serve``) all draw from these, so a
simulated and a real run can share one workload:

* **arrivals** — a Poisson process at ``rate`` requests/s (exponential gaps), or a Gamma process
  with the same mean rate and shape ``burstiness`` (1 = Poisson; < 1 burstier; > 1 more even);
  ``rate = inf`` sends every request at once;
* **lengths** — ShareGPT-like log-normal prompt and output lengths (long right tail), clipped so
  that prompt + output fits the model's context; or fixed lengths.

No text here: the simulator needs only lengths and times (``bench.prompts`` makes the text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def lognormal_lengths(rng: np.random.Generator, n: int, *, input_mean: float, input_sigma: float,
                      output_mean: float, output_sigma: float, max_model_len: int,
                      min_input: int = 4, min_output: int = 2) -> list[tuple[int, int]]:
    """``n`` (prompt_len, output_len) pairs, each log-normal with the given *mean* (in tokens)
    and log-space ``sigma``; clipped so that ``min_input <= prompt``, ``min_output <= output``
    and ``prompt + output <= max_model_len``. (The mean is the unclipped distribution's:
    ``mu = ln(mean) - sigma**2 / 2``.)"""
    if min_input + min_output > max_model_len:
        raise ValueError(f"the context ({max_model_len}) cannot hold {min_input} + {min_output}")

    def draw(mean, sigma):
        mu = math.log(mean) - sigma ** 2 / 2
        return np.rint(rng.lognormal(mu, sigma, size=n)).astype(int)

    inputs, outputs = draw(input_mean, input_sigma), draw(output_mean, output_sigma)
    pairs = []
    for p, o in zip(inputs, outputs):
        p = int(np.clip(p, min_input, max_model_len - min_output))
        o = int(np.clip(o, min_output, max_model_len - p))
        pairs.append((p, o))
    return pairs


def fixed_lengths(n: int, input_len: int, output_len: int, max_model_len: int) -> list[tuple[int, int]]:
    if input_len < 1 or output_len < 1 or input_len + output_len > max_model_len:
        raise ValueError(f"--input-len {input_len} + --output-len {output_len} must fit the "
                         f"{max_model_len}-token context (each at least 1)")
    return [(input_len, output_len)] * n


def arrival_times(rng: np.random.Generator, n: int, rate: float, burstiness: float = 1.0) -> list[float]:
    """Send times in seconds from the start: the first at 0, then Gamma(shape=burstiness,
    scale=1/(rate*burstiness)) gaps — mean gap 1/rate; burstiness 1 is a Poisson process.
    ``rate = inf``: everything at 0."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be positive")
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: when it arrives and how long it is (tokens)."""

    request_id: int
    arrival_time: float  # seconds from the start
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class LengthModel:
    """ShareGPT-like log-normal prompt and output lengths (means in tokens, log-space sigmas)."""

    input_mean: float
    input_sigma: float
    output_mean: float
    output_sigma: float
    max_model_len: int


def poisson_workload(n: int, rate: float, lengths: LengthModel, seed: int,
                     burstiness: float = 1.0) -> list[RequestSpec]:
    """``n`` requests at ``rate`` req/s. Lengths come from ``seed`` alone and arrivals from
    ``(seed, 1)``, so two rates of one seed share the same requests, only spaced differently."""
    pairs = lognormal_lengths(np.random.default_rng(seed), n, input_mean=lengths.input_mean,
                              input_sigma=lengths.input_sigma, output_mean=lengths.output_mean,
                              output_sigma=lengths.output_sigma,
                              max_model_len=lengths.max_model_len)
    times = arrival_times(np.random.default_rng([seed, 1]), n, rate, burstiness)
    return [RequestSpec(i, t, p, o) for i, (t, (p, o)) in enumerate(zip(times, pairs))]
