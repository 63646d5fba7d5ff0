"""Policies x request rates on one preset: the experiment behind SuperInfer §5's attainment curves.

One seeded workload per rate (the same requests at every rate, only spaced differently), replayed
for every policy (docs/design.md §9); a run stops ``preset.drain_s`` after its last arrival.
"""

from __future__ import annotations

from typing import Iterable

from ..sched.policies import POLICIES, make_policy
from ..sched.vlt import RotaSchedConfig
from .metrics import summarize
from .presets import Preset
from .simulator import simulate
from .workload import poisson_workload


def run_one(preset: Preset, policy_name: str, rate: float, *, num_requests: int | None = None,
            seed: int = 0, config: RotaSchedConfig | None = None, record_vlt: bool = False):
    """(summary dict, SimResult) of one policy at one rate."""
    config = config or preset.rotasched_config()
    workload = poisson_workload(num_requests or preset.num_requests, rate, preset.lengths, seed)
    result = simulate(preset, make_policy(policy_name, config), workload,
                      max_time_s=workload[-1].arrival_time + preset.drain_s, record_vlt=record_vlt)
    summary = summarize(result, config.ttft_slo_s, config.tbt_slo_s)
    summary["rate"] = rate
    return summary, result


def sweep(preset: Preset, rates: Iterable[float] | None = None,
          policies: Iterable[str] = tuple(POLICIES), *, num_requests: int | None = None,
          seed: int = 0, config: RotaSchedConfig | None = None, progress=None) -> dict:
    """{policy: {rate: summary}} for every policy and rate. ``progress``: a callable wrapping an
    iterable (e.g. ``tqdm``) to show progress."""
    pairs = [(p, r) for r in (rates or preset.rates) for p in policies]
    out: dict[str, dict[float, dict]] = {p: {} for p in policies}
    for policy_name, rate in (progress(pairs) if progress else pairs):
        summary, _ = run_one(preset, policy_name, rate, num_requests=num_requests, seed=seed,
                             config=config)
        out[policy_name][rate] = summary
    return out


def headline(results: dict, target_ttft_pts: float = 30.0, target_tbt_pts: float = 5.0) -> dict:
    """LVF minus FCFS attainment (points) at the most pressured rate where FCFS still completes
    (every request finished within the run's drain window), and the rates where the
    target (TTFT >= +30 points, TBT within 5 points) holds."""
    lvf, fcfs = results.get("lvf", {}), results.get("fcfs", {})
    common = sorted(set(lvf) & set(fcfs))
    completed = [r for r in common if fcfs[r]["completed"]]
    summary = {"headline_rate": None, "lvf_minus_fcfs_ttft_attainment_pts": None,
               "lvf_minus_fcfs_tbt_attainment_pts": None}
    if completed:
        rate = completed[-1]
        summary.update(headline_rate=rate, **_diffs(lvf[rate], fcfs[rate]))
    per_rate = {r: _diffs(lvf[r], fcfs[r]) for r in common}
    summary["lvf_minus_fcfs_by_rate"] = per_rate
    summary["rates_meeting_target"] = [
        r for r, d in per_rate.items()
        if d["lvf_minus_fcfs_ttft_attainment_pts"] >= target_ttft_pts
        and abs(d["lvf_minus_fcfs_tbt_attainment_pts"]) <= target_tbt_pts]
    return summary


def _diffs(lvf: dict, fcfs: dict) -> dict:
    return {"lvf_minus_fcfs_ttft_attainment_pts":
            lvf["ttft_attainment_pct"] - fcfs["ttft_attainment_pct"],
            "lvf_minus_fcfs_tbt_attainment_pts":
            lvf["tbt_attainment_pct"] - fcfs["tbt_attainment_pct"]}
