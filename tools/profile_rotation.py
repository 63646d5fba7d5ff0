"""Where the host's time goes in a replay that rotates: calibrate as ``bench.slo --real`` does,
then replay one burst under FCFS and LVF with cProfile on, and print the scheduler / rotation /
transport functions by cumulative and own time, the moves per step and the fitted per-move cost.
A diagnostic of ``bench.slo --real`` (docs/design.md §9).

    python tools/profile_rotation.py [--executor graph] [--timers] [--out FOLDER]

``--timers``: no cProfile; wall time per iteration of each part of the engine's step instead
(the parts are wrapped in timers for the run: a profiling tool may reach into internals).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

from blink_edu.bench.replay import BatchRecorder
from blink_edu.bench.slo_real import Bench, RealRunConfig, burst, calibrated_bench, diagnostic_parser
from blink_edu.sched.policies import make_policy

POLICIES = ("fcfs", "lvf")


def parse_args(argv=None) -> argparse.Namespace:
    p = diagnostic_parser("python tools/profile_rotation.py", __doc__)
    p.add_argument("--calibration-requests", type=int, default=48,
                   help="requests of the calibration burst, and of the profiled one")
    p.add_argument("--out", default=None, help="write the profiles here instead of printing")
    p.add_argument("--timers", action="store_true",
                   help="no cProfile: wall time per iteration of each part of the engine's step")
    return p.parse_args(argv)


def timed_parts() -> dict:
    """Wrap the step's parts in wall-clock accumulators: {part: [seconds, calls]}."""
    from blink_edu.engine import llm_engine, policy_step, scheduler
    from blink_edu.kv import rotation, transfer

    totals = {}
    targets = [(llm_engine.LLMEngine, "step"), (scheduler.Scheduler, "schedule"),
               (scheduler.Scheduler, "postprocess"), (scheduler, "run_policy"),
               (policy_step, "describe"), (policy_step, "apply"),
               (policy_step, "preempt"), (policy_step, "admit"),
               (rotation.RotationEngine, "flush"), (rotation.RotationEngine, "_send"),
               (BatchRecorder, "step"), (transfer.Transport, "_issue")]
    targets += [(cls, "decide") for cls in {type(make_policy(p)) for p in POLICIES}]
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


def report_timers(bench: Bench, config, requests) -> None:
    totals = timed_parts()
    for policy in POLICIES:
        for acc in totals.values():
            acc[:] = [0.0, 0]
        run = bench.replay(policy, config if policy == "lvf" else None, requests)
        n = len(run.iterations)
        moved = sum(i.moved for i in run.iterations)
        median = statistics.median(i.seconds for i in run.iterations)
        print(f"== {policy}: {n} iterations, median {median * 1e3:.3f} ms, {moved / n:.2f} "
              f"moves/iteration; per iteration (us) and per call:")
        for key, (sec, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
            print(f"   {key:32s} {sec / n * 1e6:8.1f} us/it  {sec / max(calls, 1) * 1e6:8.1f} "
                  f"us/call  {calls} calls")


def report_profiles(bench: Bench, config, requests, out: str | None) -> None:
    for policy in POLICIES:
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        run = bench.replay(policy, config if policy == "lvf" else None, requests)
        prof.disable()
        its = run.iterations
        moved = sum(i.moved for i in its)
        print(f"\n== {policy}: {time.perf_counter() - t0:.2f} s, {len(its)} iterations, median "
              f"{statistics.median(i.seconds for i in its) * 1e3:.3f} ms, moves {moved} "
              f"({moved / len(its):.2f}/iteration), counts {run.counts}")
        s = io.StringIO()
        stats = pstats.Stats(prof, stream=s)
        stats.sort_stats("cumulative").print_stats(r"blink_edu/(engine|kv|sched|kernels)", 45)
        stats.sort_stats("tottime").print_stats(25)
        if out:
            Path(out, f"profile_{policy}.txt").write_text(s.getvalue())
        else:
            print("\n".join(line for line in s.getvalue().splitlines() if line.strip()))


def main(argv=None) -> int:
    args = parse_args(argv)
    run = RealRunConfig.from_args(args)
    bench, cal, config = calibrated_bench(run)
    fit = (f"fit: a={cal.a * 1e3:.3f} ms b={cal.b * 1e6:.2f} us/tok c={cal.c * 1e9:.1f} ns/ctx "
           f"d={cal.d * 1e6:.1f} us/move step={cal.step_s * 1e3:.3f} ms  "
           f"B_xfer={config.transfer_budget_blocks}")
    print(fit)
    requests = burst(run.calibration_requests, 1)
    if args.timers:
        report_timers(bench, config, requests)
    else:
        report_profiles(bench, config, requests, args.out)
    print(fit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
