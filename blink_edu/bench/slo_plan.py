"""Where to measure: the simulator, calibrated on this machine, picks the real run's plan.

SuperInfer §5 sizes its transfer budget B_xfer to what its hardware moves in an iteration and
decides every iteration; our engine's costs differ (on the GPU every request moved costs the
host tens of microseconds against a ~3 ms step), so ``bench.slo --real`` lets the simulator pick
B_xfer, the decision interval and the request rates (``choose_plan``): over a grid of rates
around what the KV pool sustains, times each candidate budget and interval, it predicts LVF -
FCFS attainment gaps (one process per core) and chooses where the target -- LVF's TTFT
attainment 30+ points above FCFS's, TBT within 5 -- is predicted with the widest margin (the
prediction a measurement is least likely to overturn), or, where it is predicted nowhere, the
nearest miss. The real run then tests the simulator's prediction where it matters.

Plain numbers in, plain numbers out: the driver (``slo_real.py``) passes its settings.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

from ..sched.policies import make_policy
from ..sched.vlt import RotaSchedConfig
from ..sim.metrics import score
from ..sim.presets import Preset, qwen_gh200
from ..sim.simulator import simulate
from ..sim.workload import LengthModel, poisson_workload

#: The target: LVF's TTFT attainment this many points above FCFS's ...
TARGET_TTFT_PTS = 30
#: ... with its TBT attainment at most this many points below.
TARGET_TBT_PTS = -5


def transfer_budget_blocks(num_gpu_blocks: int) -> int:
    """SuperInfer's B_xfer (2400 blocks per iteration against its GH200's KV pool), scaled to a
    pool of ``num_gpu_blocks`` by the same ratio."""
    paper = qwen_gh200()
    return max(1, round(num_gpu_blocks * paper.transfer_budget_blocks / paper.num_gpu_blocks))


def budget_candidates(num_gpu_blocks: int) -> list[int]:
    """B_xfer values ``--transfer-budget auto`` tries: powers of two from 4 blocks (one short
    request) up to the paper's budget scaled to the pool, and that one."""
    scaled = transfer_budget_blocks(num_gpu_blocks)
    return sorted({b for b in (4, 8, 16, 32, 64) if b < scaled} | {scaled})


def interval_candidates(decision_interval: int | str) -> list[int]:
    """Decision intervals (iterations) ``--decision-interval auto`` tries: the paper's every
    iteration, and up to 16 (the TBT SLO is 5 steps: a request rotated out waits at least
    until the next decision); a fixed interval is the only candidate."""
    return [1, 2, 4, 8, 16] if decision_interval == "auto" else [decision_interval]


def resident_requests(num_gpu_blocks: int, max_num_seqs: int, lengths: LengthModel) -> float:
    """Requests of mean length a KV pool of ``num_gpu_blocks`` (16-token blocks) holds at once
    (at most ``max_num_seqs``)."""
    blocks_each = -(-(lengths.input_mean + lengths.output_mean) // 16)
    return min(max_num_seqs, num_gpu_blocks / blocks_each)


def sustained_rate(num_gpu_blocks: int, max_num_seqs: int, step_s: float,
                   lengths: LengthModel) -> float:
    """Requests/s a KV pool of ``num_gpu_blocks`` sustains, roughly: as many requests of mean
    length as it holds, each done in mean-output-length steps."""
    return (resident_requests(num_gpu_blocks, max_num_seqs, lengths)
            / (lengths.output_mean * step_s))


def calibration_burst_size(num_gpu_blocks: int, max_num_seqs: int, lengths: LengthModel) -> int:
    """Requests in the calibration burst (``--calibration-requests``' default): 3.5x what the
    pool holds at once, at least 24, so that the pool stays full and the burst's median
    iteration -- the step the SLOs are multiples of -- is a loaded one, as SuperInfer's 100 ms
    TBT SLO is 5x its step under load."""
    return max(24, math.ceil(3.5 * resident_requests(num_gpu_blocks, max_num_seqs, lengths)))


def predict(job: tuple) -> dict:
    """The simulator's LVF - FCFS attainment gaps for one (preset, config, rate): a process-pool
    task (module level, plain arguments)."""
    preset, config, rate, num_requests, seed, lengths = job
    workload = poisson_workload(num_requests, rate, lengths, seed)
    got = {p: score(simulate(preset, make_policy(p, config), workload).requests,
                    config.ttft_slo_s, config.tbt_slo_s) for p in ("fcfs", "lvf")}
    return {"budget": config.transfer_budget_blocks, "interval": config.decision_interval,
            "rate": rate,
            "ttft_pts": got["lvf"]["ttft_attainment_pct"] - got["fcfs"]["ttft_attainment_pct"],
            "tbt_pts": got["lvf"]["tbt_attainment_pct"] - got["fcfs"]["tbt_attainment_pct"],
            "fcfs_ttft_pct": got["fcfs"]["ttft_attainment_pct"]}


def meets_target(gaps: dict) -> bool:
    """Whether LVF - FCFS gaps (``{"ttft_pts", "tbt_pts"}``) meet the target."""
    return gaps["ttft_pts"] >= TARGET_TTFT_PTS and gaps["tbt_pts"] >= TARGET_TBT_PTS


def nearest_to_target(predictions: list[dict]) -> dict:
    """The prediction, among those where FCFS misses TTFT SLOs (all if none does), with the
    widest margin on both counts of the target -- ``min(TTFT gain - 30, TBT gain + 5)``, which
    is >= 0 exactly where the target is met; on a tie, the shorter decision interval (the
    paper decides every iteration)."""
    pressured = [p for p in predictions if p["fcfs_ttft_pct"] < 100] or predictions
    return max(pressured, key=lambda p: (min(p["ttft_pts"] - TARGET_TTFT_PTS,
                                             p["tbt_pts"] - TARGET_TBT_PTS), -p["interval"]))


def choose_plan(preset: Preset, config: RotaSchedConfig, step_s: float, *,
                rates: list[float] | str, budgets: list[int], intervals: list[int],
                num_requests: int, seed: int, lengths: LengthModel
                ) -> tuple[RotaSchedConfig, list[float], list[dict], bool]:
    """Predict every (budget, interval, rate) and choose (see the module docstring).
    ``rates``: "auto" for a grid around what the KV pool sustains (the chosen rate and the grid
    rate below it are returned), or the rates to measure. Returns (config with the chosen
    budget and interval, rates, every prediction, whether any prediction met the target)."""
    capacity = sustained_rate(preset.num_gpu_blocks, preset.max_num_seqs, step_s, lengths)
    grid = ([round(capacity * f, 1) for f in np.geomspace(0.5, 3.0, 28)]  # the window is narrow
            if rates == "auto" else list(rates))
    jobs = [(replace(preset, transfer_budget_blocks=b),
             config.replace(transfer_budget_blocks=b, decision_interval=k),
             rate, num_requests, seed, lengths)
            for b in budgets for k in intervals for rate in grid]
    with ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        predictions = list(pool.map(predict, jobs))
    for p in predictions:
        print(f"  sim: B_xfer {p['budget']:3d}  every {p['interval']:2d}  {p['rate']:7.1f} req/s  "
              f"LVF - FCFS TTFT {p['ttft_pts']:+5.1f} pts, TBT {p['tbt_pts']:+5.1f} pts", flush=True)
    best = nearest_to_target(predictions)
    below = [r for r in grid if r < best["rate"]]
    chosen_rates = below[-1:] + [best["rate"]] if rates == "auto" else grid
    met = any(meets_target(p) for p in predictions)
    chosen = config.replace(transfer_budget_blocks=best["budget"], decision_interval=best["interval"])
    return chosen, chosen_rates, predictions, met
