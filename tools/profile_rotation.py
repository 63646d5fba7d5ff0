"""Where the host's time goes in a replay that rotates (issue #8): calibrate as
``bench.slo --real`` does, then replay one burst under LVF with cProfile on, and print the
scheduler / rotation / transport functions by cumulative and own time, the moves per step and
the fitted per-move cost. Usage: ``python tools/profile_rotation.py [--executor graph]``."""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import numpy as np

from blink_edu.bench import slo_real as S
from blink_edu.engine.llm_engine import make_executor
from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.weights import load_weights

p = argparse.ArgumentParser()
p.add_argument("--executor", default="graph")
p.add_argument("--kv-blocks", type=int, default=384)
p.add_argument("--max-num-seqs", type=int, default=64)
p.add_argument("--calibration-requests", type=int, default=48)
p.add_argument("--transfer-budget", type=lambda t: t if t == "auto" else int(t), default="auto",
               help="B_xfer of the LVF runs ('auto': the paper's scaled to the pool)")
p.add_argument("--decision-interval", type=int, default=1,
               help="LVF decides every N iterations (Policy.decides_at)")
p.add_argument("--num-requests", type=int, default=200,
               help="size the host arena as bench.slo --real does for this many requests")
p.add_argument("--out", default=None)
p.add_argument("--timers", action="store_true",
               help="no cProfile: wall time per iteration of each part of the engine's step")
args = p.parse_args()
args.seed, args.policies = 0, ["fcfs", "lvf"]
w = load_weights(resolve_model_dir())
ex = make_executor(args.executor, w, S.engine_config(args, "fcfs", 0))
rng = np.random.default_rng(0)
S.warm_up(w, args, ex, rng)
cal, cfg = S.calibrate(w, args, ex, rng)
fit = (f"fit: a={cal.a*1e3:.3f} ms b={cal.b*1e6:.2f} us/tok c={cal.c*1e9:.1f} ns/ctx "
       f"d={cal.d*1e6:.1f} us/move step={cal.step_s*1e3:.3f} ms  B_xfer={cfg.transfer_budget_blocks}")
print(fit)
req = S.burst(args.calibration_requests, 1)


def timed_parts():
    """Wrap the step's parts in wall-clock accumulators: {part: [seconds, calls]}."""
    from blink_edu.engine import llm_engine, policy_step, scheduler
    from blink_edu.kv import rotation, transfer

    totals = {}
    targets = [(llm_engine.LLMEngine, "step"), (scheduler.Scheduler, "schedule"),
               (scheduler.Scheduler, "postprocess"), (scheduler, "run_policy"),
               (policy_step, "describe"), (policy_step, "apply"),
               (policy_step, "preempt"), (policy_step, "admit"),
               (rotation.RotationEngine, "flush"), (rotation.RotationEngine, "_send"),
               (S.BatchRecorder, "step"), (transfer.Transport, "_issue")]
    for policy_cls in {type(S.make_policy(p)) for p in ("lvf", "fcfs")}:
        targets.append((policy_cls, "decide"))
    for owner, name in targets:
        inner = getattr(owner, name)
        key = f"{getattr(owner, '__name__', owner)}.{name}"

        def wrapper(*a, _inner=inner, _key=key, **k):
            t = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                acc = totals.setdefault(_key, [0.0, 0])
                acc[0] += time.perf_counter() - t
                acc[1] += 1
        setattr(owner, name, wrapper)
    return totals


if args.timers:
    totals = timed_parts()
    for policy in ("fcfs", "lvf"):
        for acc in totals.values():
            acc[:] = [0.0, 0]
        run = S.replay(w, args, ex, policy, cfg if policy == "lvf" else None, req, rng)
        n = len(run.iterations)
        moved = sum(i.moved for i in run.iterations)
        print(f"== {policy}: {n} iterations, median {statistics.median(i.seconds for i in run.iterations)*1e3:.3f} ms, "
              f"{moved/n:.2f} moves/iteration; per iteration (us) and per call:")
        for key, (sec, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
            print(f"   {key:32s} {sec/n*1e6:8.1f} us/it  {sec/max(calls,1)*1e6:8.1f} us/call  {calls} calls")
    print(fit)
    raise SystemExit(0)

for policy in ("fcfs", "lvf"):
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    run = S.replay(w, args, ex, policy, cfg if policy == "lvf" else None, req, rng)
    prof.disable()
    wall = time.perf_counter() - t0
    its = run.iterations
    moved = sum(i.moved for i in its)
    print(f"\n== {policy}: {wall:.2f} s, {len(its)} iterations, median "
          f"{statistics.median(i.seconds for i in its)*1e3:.3f} ms, moves {moved} "
          f"({moved/len(its):.2f}/iteration), counts {run.counts}")
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("cumulative").print_stats(r"blink_edu/(engine|kv|sched|kernels)", 45)
    st.sort_stats("tottime").print_stats(25)
    text = s.getvalue()
    if args.out:
        open(f"{args.out}/profile_{policy}.txt", "w").write(text)
    else:
        print("\n".join(line for line in text.splitlines() if line.strip()))
print(fit)
