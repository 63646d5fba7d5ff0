"""How far the engine's iterations drift from the fitted step model as load grows, and where each
iteration's time goes: inside the executor's step (the model) or around it (the host's loop,
scheduling, policy, rotation books). A diagnostic of ``bench.slo --real`` (docs/design.md §9).

Calibrates as ``bench.slo --real`` does (``bench.slo_real.Bench``), then replays Poisson streams
of the experiment's lengths under FCFS and LVF at 0.8x, 1.0x, 1.15x and 1.3x the rate the KV pool
sustains, and prints per run the mean iteration, the cost model's mean for the very same
iterations, and the mean model and host parts. ``--dump FILE`` writes every iteration (JSON) for
offline fits.

    python tools/iteration_drift.py [--executor graph] [--num-requests 200] [--dump F]
"""

from __future__ import annotations

import argparse
import json
import statistics

from blink_edu.bench import slo_plan
from blink_edu.bench.slo_real import (LENGTHS, RealRunConfig, calibrated_bench, diagnostic_parser,
                                      preset_for)
from blink_edu.sim.calibrate import Iteration, iteration_fit
from blink_edu.sim.workload import poisson_workload

FACTORS = (0.8, 1.0, 1.15, 1.3)  # of the rate the KV pool sustains


def parse_args(argv=None) -> argparse.Namespace:
    p = diagnostic_parser("python tools/iteration_drift.py", __doc__, transfer_budget=16,
                          decision_interval=4)
    p.add_argument("--dump", default=None, help="write every iteration of every run here (JSON)")
    return p.parse_args(argv)


def describe(factor: float, policy: str, its: list[Iteration], fit: dict) -> str:
    model = statistics.fmean(i.model_seconds for i in its)
    host = statistics.fmean(i.seconds - i.model_seconds for i in its)
    ratio = fit["mean_iteration_ms"] / fit["mean_iteration_model_ms"]
    return (f"{factor:4.2f}x {policy:4s} mean iteration {fit['mean_iteration_ms']:.3f} ms, cost "
            f"model {fit['mean_iteration_model_ms']:.3f} ms ({ratio:.3f}x); executor "
            f"{model * 1e3:.3f} ms + host {host * 1e3:.3f} ms; sequences/it "
            f"{statistics.fmean(i.seqs for i in its):.1f}, moves/it "
            f"{statistics.fmean(i.moved for i in its):.2f}; {len(its)} iterations")


def main(argv=None) -> int:
    args = parse_args(argv)
    run = RealRunConfig.from_args(args)
    bench, cal, config = calibrated_bench(run)
    cost = preset_for(bench.weights, run, cal, config).cost
    rate = slo_plan.sustained_rate(run.kv_blocks, run.max_num_seqs, cal.step_s, LENGTHS)
    print(f"fit: {cal.described()}; sustained {rate:.1f} req/s; B_xfer "
          f"{config.transfer_budget_blocks}, a decision every {config.decision_interval}",
          flush=True)
    dump = {"calibration": cal.__dict__, "fields": list(Iteration._fields), "runs": []}
    for factor in FACTORS:
        workload = poisson_workload(run.num_requests, factor * rate, LENGTHS, run.seed + 7)
        for policy in ("fcfs", "lvf"):
            its = bench.replay(policy, config, workload).iterations
            print(describe(factor, policy, its, iteration_fit(its, cost)), flush=True)
            dump["runs"].append({"factor": factor, "rate": factor * rate, "policy": policy,
                                 "iterations": [list(i) for i in its]})
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(dump, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
