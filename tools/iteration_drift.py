"""How far the engine's iterations drift from the fitted step model as load grows (issue #8).

Calibrates as ``bench.slo --real`` does, then replays Poisson streams of the experiment's
lengths under FCFS and LVF at 0.8x, 1.0x and 1.15x the rate the KV pool sustains, each with
Python's garbage collector on and then off, and prints per run the mean iteration, the cost
model's mean for the very same iterations, and their ratio. Usage:
``python tools/iteration_drift.py [--executor graph] [--num-requests 200]``."""

import argparse
import gc

import numpy as np

from blink_edu.bench import slo_real as S
from blink_edu.engine.llm_engine import make_executor
from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.weights import load_weights

p = argparse.ArgumentParser()
p.add_argument("--executor", default="graph")
p.add_argument("--kv-blocks", type=int, default=96)
p.add_argument("--calibration-requests", type=int, default=24)
p.add_argument("--num-requests", type=int, default=200)
args = p.parse_args()
args.seed, args.transfer_budget, args.decision_interval, args.rates = 0, 16, 4, "auto"
weights = load_weights(resolve_model_dir())
executor = make_executor(args.executor, weights, S.engine_config(args, "fcfs", 0))
rng = np.random.default_rng(0)
S.warm_up(weights, args, executor, rng)
cal, config = S.calibrate(weights, args, executor, rng)
cost = S.preset_for(weights, args, cal, config).cost
rate = S.sustained_rate(args.kv_blocks, 16, cal.step_s)
print(f"fit: a={cal.a * 1e3:.3f} ms b={cal.b * 1e6:.2f} us/token c={cal.c * 1e9:.0f} ns/context "
      f"d={cal.d * 1e6:.0f} us/move e={cal.e * 1e6:.0f} us/decision f={cal.f * 1e6:.0f} us/mirror "
      f"g={cal.g * 1e6:.1f} us/request held; "
      f"sustained {rate:.1f} req/s")
for factor in (0.8, 1.0, 1.15):
    workload = S.poisson_workload(args.num_requests, factor * rate, S.LENGTHS, args.seed + 7)
    for policy in ("fcfs", "lvf"):
        for collect in (True, False):
            gc.collect()
            if not collect:
                gc.disable()
            run = S.replay(weights, args, executor, policy, config, workload, rng)
            gc.enable()
            fit = S.iteration_fit(run.iterations, cost)
            print(f"{factor:4.2f}x {policy:4s} gc {'on ' if collect else 'off'}  mean iteration "
                  f"{fit['mean_iteration_ms']:.3f} ms, model {fit['mean_iteration_model_ms']:.3f} "
                  f"ms ({fit['mean_iteration_ms'] / fit['mean_iteration_model_ms']:.3f}x), "
                  f"{len(run.iterations)} iterations", flush=True)
