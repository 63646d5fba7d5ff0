"""What a latency figure means: TTFT, TPOT, ITL, the SLO tests and the percentile summary.

One home for the definitions, so that a measured serving run (``bench.serve``), a replay on the
engine (``bench.slo_real``) and a simulated run (``sim.metrics``) are scored alike. They follow
vLLM's ``benchmark_serving.py``; SuperInfer §5 reports the same two attainments:

    TTFT     first token time - arrival (or request sent)                     (per request)
    TPOT     (last token time - first token time) / (output tokens - 1): decode time per
             token, the first token excluded; None for a one-token answer      (per request)
    ITL/TBT  every gap between two successive tokens (or streamed chunks) of a request

    TTFT SLO met   the request got its first token, within S_F of its arrival
    TBT SLO met    the request finished with TPOT <= S_B (a one-token answer has no TPOT and
                   meets it trivially, as in vLLM's goodput)

Percentiles are NumPy's linear interpolation (as vLLM's). Plain floats in, plain floats out:
this module knows no request class, so every caller keeps its own record of a request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def tpot(first_token_s: float, last_token_s: float, num_tokens: int) -> float | None:
    """(last - first) / (n - 1): seconds per output token after the first; None for n < 2."""
    if num_tokens < 2:
        return None
    return (last_token_s - first_token_s) / (num_tokens - 1)


def gaps(times: Sequence[float]) -> list[float]:
    """Inter-token latencies: each gap between successive token (or chunk) times."""
    return [b - a for a, b in zip(times, times[1:])]


def meets_ttft(ttft_s: float | None, ttft_slo_s: float) -> bool:
    """The TTFT SLO: a first token came, within ``ttft_slo_s``."""
    return ttft_s is not None and ttft_s <= ttft_slo_s


def meets_tpot(tpot_s: float | None, finished: bool, tpot_slo_s: float) -> bool:
    """The TBT (TPOT) SLO: finished, and either one token only or TPOT <= ``tpot_slo_s``."""
    return finished and (tpot_s is None or tpot_s <= tpot_slo_s)


def stats_ms(values: Sequence[float]) -> dict:
    """mean / median / p99 of seconds, in milliseconds (None where there is nothing to
    measure)."""
    if not len(values):
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(values, dtype=float) * 1e3
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "p99": float(np.percentile(a, 99))}


def attainment_pct(met: Sequence[bool]) -> float:
    """Share of ALL requests that met an SLO, in percent (0 for no requests)."""
    return 100.0 * sum(met) / max(len(met), 1)
