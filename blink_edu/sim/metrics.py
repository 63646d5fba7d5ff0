"""SLO attainment and latency percentiles of a simulated run.

The definitions follow ``blink_edu.bench.serve`` (vLLM's ``benchmark_serving.py``), so that a
simulated and a measured run are scored alike; SuperInfer §5 reports the same two attainments:

    TTFT     first token time - arrival                                     (per request)
    TPOT     (last token time - first token time) / (output tokens - 1)     (per request; the
             serving benchmark's definition; None for a one-token answer)
    ITL/TBT  every gap between two successive tokens of a request

    TTFT attainment   share of ALL requests whose TTFT <= S_F (a request that never got its first
                      token within the run counts as a miss)
    TBT attainment    share of ALL requests that finished with TPOT <= S_B (a finished one-token
                      answer meets it trivially, as in ``bench.serve.meets_slo``; unfinished
                      requests count as misses)
    P99 TTFT          over the requests that got a first token
    P99 TBT           over every inter-token gap of every request (NumPy's linear percentile)
"""

from __future__ import annotations

import numpy as np

from ..bench.serve import gaps, stats_ms
from .simulator import SimRequest, SimResult


def ttft(r: SimRequest) -> float | None:
    return None if r.first_token_time is None else r.first_token_time - r.spec.arrival_time


def tpot(r: SimRequest) -> float | None:
    """(E2E - TTFT) / (n - 1) with E2E ending at the last token, as ``bench.serve.tpot``."""
    if len(r.token_times) < 2:
        return None
    return (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)


def meets_ttft(r: SimRequest, ttft_slo_s: float) -> bool:
    t = ttft(r)
    return t is not None and t <= ttft_slo_s


def meets_tbt(r: SimRequest, tbt_slo_s: float) -> bool:
    if r.finish_time is None:
        return False
    t = tpot(r)
    return t is None or t <= tbt_slo_s


def summarize(result: SimResult, ttft_slo_s: float, tbt_slo_s: float) -> dict:
    """Attainments (%), percentiles (ms) and totals of one run."""
    reqs = result.requests
    n = max(len(reqs), 1)
    ttfts = [t for t in map(ttft, reqs) if t is not None]
    itls = [g for r in reqs for g in gaps(r.token_times)]
    tpots = [t for t in map(tpot, reqs) if t is not None]
    finished = [r for r in reqs if r.finish_time is not None]
    out_tokens = sum(len(r.token_times) for r in reqs)
    summary = {
        "policy": result.policy, "preset": result.preset, "requests": len(reqs),
        "finished": len(finished), "completed": result.completed, "duration_s": result.end_time,
        "ttft_attainment_pct": 100.0 * sum(meets_ttft(r, ttft_slo_s) for r in reqs) / n,
        "tbt_attainment_pct": 100.0 * sum(meets_tbt(r, tbt_slo_s) for r in reqs) / n,
        "output_token_throughput": out_tokens / max(result.end_time, 1e-9),
        "preemptions": sum(r.num_preemptions for r in reqs),
        "blocks_in": result.blocks_in, "blocks_out": result.blocks_out, "steps": result.steps,
        "mean_step_ms": float(result.step_times.mean() * 1e3) if result.steps else None,
    }
    for name, values in (("ttft", ttfts), ("tbt", itls), ("tpot", tpots)):
        for k, v in stats_ms(values).items():
            summary[f"{k}_{name}_ms"] = v
    return summary


def state_timeline(r: SimRequest, end_time: float) -> list[tuple[float, float, int]]:
    """[(start, end, state), ...] of one request, for timeline plots."""
    spans = []
    for (t0, state), (t1, _) in zip(r.transitions, r.transitions[1:] + [(end_time, None)]):
        if t1 > t0 or state != 3:
            spans.append((t0, max(t1, t0), state))
    return spans


def attainment_of(results: dict, metric: str) -> np.ndarray:
    """(R,) one metric of per-rate summaries ``{rate: summary}`` in rate order."""
    return np.array([results[k][metric] for k in sorted(results)], dtype=float)
