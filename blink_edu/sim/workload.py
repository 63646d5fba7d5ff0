"""Seeded simulator workloads: Poisson arrivals with ShareGPT-like log-normal lengths.

DESIGN.md §9 (one seeded workload replayed for every policy). The generators are
``blink_edu.bench.workloads``' — the same ones the serving benchmark uses — so a simulated and a
real run can share one workload. The simulator needs no text, only lengths and arrival times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bench.workloads import arrival_times, lognormal_lengths


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
