"""SLO attainment and latency percentiles of a run, simulated or replayed on the engine.

The definitions are ``blink_edu.latency``'s (vLLM's ``benchmark_serving.py``), so a simulated run,
a replay on the real engine (``bench.slo_real``) and a measured serving run are scored alike;
SuperInfer §5 reports the same two attainments:

    TTFT attainment   share of ALL requests whose TTFT <= S_F (a request that never got its first
                      token within the run counts as a miss)
    TBT attainment    share of ALL requests that finished with TPOT <= S_B (a finished one-token
                      answer meets it trivially; unfinished requests count as misses)
    P99 TTFT          over the requests that got a first token
    P99 TBT           over every inter-token gap of every request (NumPy's linear percentile)

A request here is anything with ``spec.arrival_time``, ``first_token_time``, ``token_times`` and
``finish_time`` (seconds from the run's start): the simulator's ``SimRequest`` and the replay's
``MeasuredRequest`` both are.
"""

from __future__ import annotations

import statistics

from .. import latency
from .simulator import SimResult


def ttft(r) -> float | None:
    return None if r.first_token_time is None else r.first_token_time - r.spec.arrival_time


def tpot(r) -> float | None:
    """``latency.tpot`` of the request's token times (E2E ending at the last token)."""
    if not r.token_times:
        return None
    return latency.tpot(r.token_times[0], r.token_times[-1], len(r.token_times))


def meets_ttft(r, ttft_slo_s: float) -> bool:
    return latency.meets_ttft(ttft(r), ttft_slo_s)


def meets_tbt(r, tbt_slo_s: float) -> bool:
    return latency.meets_tpot(tpot(r), r.finish_time is not None, tbt_slo_s)


def score(requests, ttft_slo_s: float, tbt_slo_s: float) -> dict:
    """Attainments (%) and the TTFT / TPOT figures (ms) that a simulated and a measured run are
    compared on (``bench.slo_real``)."""
    ttfts = [t for t in map(ttft, requests) if t is not None]
    tpots = [t for t in map(tpot, requests) if t is not None]
    return {"ttft_attainment_pct": latency.attainment_pct([meets_ttft(r, ttft_slo_s)
                                                           for r in requests]),
            "tbt_attainment_pct": latency.attainment_pct([meets_tbt(r, tbt_slo_s)
                                                          for r in requests]),
            "mean_ttft_ms": statistics.fmean(ttfts) * 1e3 if ttfts else None,
            "mean_tpot_ms": statistics.fmean(tpots) * 1e3 if tpots else None,
            "median_ttft_ms": statistics.median(ttfts) * 1e3 if ttfts else None,
            "median_tpot_ms": statistics.median(tpots) * 1e3 if tpots else None,
            "p99_ttft_ms": latency.stats_ms(ttfts)["p99"]}


def summarize(result: SimResult, ttft_slo_s: float, tbt_slo_s: float) -> dict:
    """Attainments (%), percentiles (ms) and totals of one simulated run."""
    reqs = result.requests
    ttfts = [t for t in map(ttft, reqs) if t is not None]
    itls = [g for r in reqs for g in latency.gaps(r.token_times)]
    tpots = [t for t in map(tpot, reqs) if t is not None]
    finished = [r for r in reqs if r.finish_time is not None]
    out_tokens = sum(len(r.token_times) for r in reqs)
    summary = {
        "policy": result.policy, "preset": result.preset, "requests": len(reqs),
        "finished": len(finished), "completed": result.completed, "duration_s": result.end_time,
        "ttft_attainment_pct": latency.attainment_pct([meets_ttft(r, ttft_slo_s) for r in reqs]),
        "tbt_attainment_pct": latency.attainment_pct([meets_tbt(r, tbt_slo_s) for r in reqs]),
        "output_token_throughput": out_tokens / max(result.end_time, 1e-9),
        "preemptions": sum(r.num_preemptions for r in reqs),
        "blocks_in": result.blocks_in, "blocks_out": result.blocks_out, "steps": result.steps,
        "mean_step_ms": float(result.step_times.mean() * 1e3) if result.steps else None,
    }
    for name, values in (("ttft", ttfts), ("tbt", itls), ("tpot", tpots)):
        for k, v in latency.stats_ms(values).items():
            summary[f"{k}_{name}_ms"] = v
    return summary
