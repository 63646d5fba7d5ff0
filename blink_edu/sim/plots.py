"""Figures for the RotaSched chapter and ``bench.slo``: VLT curves, request timelines, attainment
against rate (SuperInfer §3 and §5). Matplotlib only; each function returns its figure."""

from __future__ import annotations

import numpy as np

from ..sched.vlt import ROTARY, RUNNING, WAITING, RotaSchedConfig, vlt_numpy
from .simulator import FINISHED, SimResult

STATE_COLORS = {WAITING: "tab:orange", RUNNING: "tab:green", ROTARY: "tab:purple",
                FINISHED: "white"}
POLICY_STYLES = {"lvf": "o-", "fcfs": "s--", "waiting-first": "^:", "swapped-first": "v-."}


def plot_vlt_by_state(config: RotaSchedConfig, horizon_s: float = 8.0, ax=None):
    """VLT against time for one request in each state, entered at t = 0."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    t = np.linspace(0, horizon_s, 400)  # (T,)
    zeros = np.zeros_like(t)
    for state, label in ((WAITING, "waiting (arrived at 0)"), (RUNNING, "running (since 0)"),
                         (ROTARY, "rotary (last token at 0)")):
        ax.plot(t, vlt_numpy(np.full(t.shape, state), t, zeros, zeros, zeros, config),
                color=STATE_COLORS[state], label=label)
    ax.axvline(config.waiting_grace_s, color="tab:orange", lw=0.7, ls=":")
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xlabel("seconds since the request entered the state")
    ax.set_ylabel("VLT (s)")
    ax.set_title(f"VLT: alpha={config.alpha:g}, beta_F={config.beta_f:g}, beta_B={config.beta_b:g}")
    ax.legend()
    return ax.figure


def plot_timeline(result: SimResult, request_ids=None, ax=None):
    """One row per request: its state over time (waiting / running / rotary)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    reqs = [r for r in result.requests if request_ids is None or r.request_id in set(request_ids)]
    ax = ax or plt.subplots(figsize=(9, 0.25 * len(reqs) + 1.5))[1]
    for row, r in enumerate(reqs):
        spans = list(zip(r.transitions, r.transitions[1:] + [(result.end_time, None)]))
        for (t0, state), (t1, _) in spans:
            if state != FINISHED:
                ax.broken_barh([(t0, t1 - t0)], (row - 0.4, 0.8), color=STATE_COLORS[state])
        if r.first_token_time is not None:
            ax.plot(r.first_token_time, row, "k|", ms=8)
    ax.set_yticks(range(len(reqs)), [str(r.request_id) for r in reqs], fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("request")
    ax.legend(handles=[Patch(color=STATE_COLORS[s], label=n) for s, n in
                       ((WAITING, "waiting"), (RUNNING, "running"), (ROTARY, "rotary"))]
              + [ax.plot([], [], "k|", label="first token")[0]], loc="upper left", fontsize=8)
    ax.set_title(f"{result.policy}: request states over time")
    return ax.figure


def plot_vlt_trace(result: SimResult, request_ids, ax=None):
    """VLT of chosen requests over a run (needs ``record_vlt=True``)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(9, 3.8))[1]
    for rid in request_ids:
        points = [(t, v[ids == rid][0]) for t, ids, _, v in result.vlt_trace if (ids == rid).any()]
        if points:
            t, v = np.array(points).T
            ax.plot(t, v, lw=1, label=f"request {rid}")
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("VLT (s)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{result.policy}: VLT of each request at every step")
    return ax.figure


def plot_attainment(results: dict, title: str = "", axes=None):
    """TTFT and TBT attainment against rate, one line per policy; ``results`` {policy: {rate:
    summary}} as ``sim.sweep.sweep`` returns it."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for policy, by_rate in results.items():
        rates = sorted(by_rate)
        for ax, metric in zip(axes, ("ttft_attainment_pct", "tbt_attainment_pct")):
            ax.plot(rates, [by_rate[r][metric] for r in rates], POLICY_STYLES.get(policy, "o-"),
                    label=policy)
    for ax, name in zip(axes, ("TTFT", "TBT")):
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{name} SLO attainment (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig = axes[0].figure
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
