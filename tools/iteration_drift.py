"""How far the engine's iterations drift from the fitted step model as load grows (issue #8),
and where each iteration's time goes: inside the executor's step (the model) or around it (the
host's loop, scheduling, policy, rotation books).

Calibrates as ``bench.slo --real`` does, then replays Poisson streams of the experiment's
lengths under FCFS and LVF at 0.8x, 1.0x, 1.15x and 1.3x the rate the KV pool sustains, and
prints per run the mean iteration, the cost model's mean for the very same iterations, and the
mean model and host parts. ``--dump FILE`` writes every iteration (JSON) for offline fits.
Usage: ``python tools/iteration_drift.py [--executor graph] [--num-requests 200] [--dump F]``."""

import argparse
import json
import statistics

import numpy as np

from blink_edu.bench import slo_real as S
from blink_edu.engine.llm_engine import make_executor
from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.weights import load_weights

p = argparse.ArgumentParser()
p.add_argument("--executor", default="graph")
p.add_argument("--kv-blocks", type=int, default=384)
p.add_argument("--max-num-seqs", type=int, default=64)
p.add_argument("--calibration-requests", type=int, default=None)
p.add_argument("--num-requests", type=int, default=200)
p.add_argument("--transfer-budget", type=int, default=16)
p.add_argument("--decision-interval", type=int, default=4)
p.add_argument("--dump", default=None, help="write every iteration of every run here (JSON)")
args = p.parse_args()
args.seed, args.rates, args.policies = 0, "auto", ["fcfs", "lvf"]
args.calibration_requests = (args.calibration_requests
                             or S.calibration_burst_size(args.kv_blocks, args.max_num_seqs))
weights = load_weights(resolve_model_dir())
executor = make_executor(args.executor, weights, S.engine_config(args, "fcfs", 0))
rng = np.random.default_rng(0)
S.warm_up(weights, args, executor, rng)
cal, config = S.calibrate(weights, args, executor, rng)
cost = S.preset_for(weights, args, cal, config).cost
rate = S.sustained_rate(args.kv_blocks, args.max_num_seqs, cal.step_s)
print(f"fit: {cal.described()}; sustained {rate:.1f} req/s; B_xfer "
      f"{config.transfer_budget_blocks}, a decision every {config.decision_interval}", flush=True)
dump = {"calibration": cal.__dict__, "fields": list(S.Iteration._fields), "runs": []}
for factor in (0.8, 1.0, 1.15, 1.3):
    workload = S.poisson_workload(args.num_requests, factor * rate, S.LENGTHS, args.seed + 7)
    for policy in ("fcfs", "lvf"):
        run = S.replay(weights, args, executor, policy, config, workload, rng)
        its = run.iterations
        fit = S.iteration_fit(its, cost)
        model = statistics.fmean(i.model_seconds for i in its)
        host = statistics.fmean(i.seconds - i.model_seconds for i in its)
        print(f"{factor:4.2f}x {policy:4s} mean iteration {fit['mean_iteration_ms']:.3f} ms, cost "
              f"model {fit['mean_iteration_model_ms']:.3f} ms ({fit['mean_iteration_ms'] / fit['mean_iteration_model_ms']:.3f}x); "
              f"executor {model * 1e3:.3f} ms + host {host * 1e3:.3f} ms; sequences/it "
              f"{statistics.fmean(i.seqs for i in its):.1f}, moves/it "
              f"{statistics.fmean(i.moved for i in its):.2f}; {len(its)} iterations", flush=True)
        dump["runs"].append({"factor": factor, "rate": factor * rate, "policy": policy,
                             "iterations": [list(i) for i in its]})
if args.dump:
    with open(args.dump, "w") as f:
        json.dump(dump, f)
