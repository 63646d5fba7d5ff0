"""``python -m blink_edu.bench.slo``: TTFT / TBT SLO attainment, P99 TTFT and P99 TBT against
request rate for every scheduling policy (SuperInfer §5, Figures of attainment vs rate).

    python -m blink_edu.bench.slo --sim                                  # paper scale, simulated
    python -m blink_edu.bench.slo --sim --preset qwen2.5-32b-h200-pcie --rates 4,6,8
    python -m blink_edu.bench.slo --real                  # the engine here, beside the simulator
    python -m blink_edu.bench.slo --real --kv-blocks 96 --max-num-seqs 16   # minutes on a CPU

``--sim`` runs ``blink_edu.sim`` (the same policy objects as the engine, against a cost model)
for every policy over the preset's rates, one seeded workload per rate replayed for every policy
(DESIGN.md §9), prints a table, plots attainment against rate (``slo_attainment.png``) and writes
``bench/results/slo.json`` whose ``summary`` holds ``lvf_minus_fcfs_ttft_attainment_pts`` and
``lvf_minus_fcfs_tbt_attainment_pts`` at the most pressured rate where FCFS still completes (every
request done within ``drain_s`` of the last arrival; see ``sim.sweep.headline``).

``--real`` runs the policies on the real engine (``bench/slo_real.py``: the bundled model, a KV
pool small enough to force rotation, the step-time model calibrated on this machine) and the
simulator's prediction of the same run beside it; it adds ``raw["real"]`` and
``sim_vs_real_error`` to ``slo.json``, keeping the simulator part already there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..sched.policies import POLICIES
from ..sim.presets import PRESETS, get_preset
from ..sim.sweep import headline, sweep
from .results import RESULTS_DIR, print_table, write_results

COLUMNS = ["rate", "policy", "ttft_attainment_pct", "tbt_attainment_pct", "p99_ttft_ms",
           "p99_tbt_ms", "median_tpot_ms", "preemptions", "finished", "completed"]


def is_real_key(key: str) -> bool:
    """Whether ``slo.json``'s summary ``key`` belongs to the real-engine part (``--real``
    writes them all anew; ``--sim`` keeps them)."""
    return key.startswith(("real_", "sim_vs_real")) or key == "iteration_model_error"


def run_real(args) -> dict:
    from .slo_real import run_real_experiment

    cfg, raw, summary = run_real_experiment(args)
    out_dir = Path(args.out or RESULTS_DIR)
    path = out_dir / "slo.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    config = {**previous.get("config", {}), "real": cfg}
    merged_raw = {**previous.get("raw", {}), "real": raw}
    kept = {k: v for k, v in previous.get("summary", {}).items() if not is_real_key(k)}
    merged_summary = {**kept, **summary}
    path = write_results("slo", config, merged_raw, merged_summary, out_dir=out_dir)
    print(f"sim_vs_real_error (largest relative error of mean TTFT / TPOT): "
          f"{summary['sim_vs_real_error']:.1%}; wrote {path}")
    return merged_summary


def plot(results: dict, preset_name: str, out_dir: Path, ttft_slo_s: float,
         tbt_slo_s: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..sim.plots import plot_attainment

    fig = plot_attainment(results, title=f"{preset_name}: SLO attainment "
                                         f"(TTFT <= {ttft_slo_s:g} s, TPOT <= {tbt_slo_s * 1e3:g} ms)")
    path = out_dir / "slo_attainment.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_sim(args) -> dict:
    from tqdm import tqdm

    preset = get_preset(args.preset)
    config = preset.rotasched_config()
    rates = args.rates or list(preset.rates)
    policies = args.policies or list(POLICIES)
    bar = lambda pairs: tqdm(pairs, desc=f"slo {preset.name}", unit="run",  # noqa: E731
                             disable=args.no_progress)
    results = sweep(preset, rates, policies, num_requests=args.num_requests, seed=args.seed,
                    config=config, progress=bar)
    rows = [results[p][r] for r in rates for p in policies]
    print_table(rows, COLUMNS)
    summary = headline(results) if {"lvf", "fcfs"} <= set(policies) else {}
    summary["sim_vs_real_error"] = None  # until a real run (--real) is recorded
    out_dir = Path(args.out or RESULTS_DIR)
    previous = out_dir / "slo.json"
    if previous.exists():  # keep a real-engine part measured earlier (--real)
        old = json.loads(previous.read_text())
        summary.update({k: v for k, v in old.get("summary", {}).items() if is_real_key(k)})
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_plot:
        summary["plot"] = plot(results, preset.name, out_dir, config.ttft_slo_s,
                               config.tbt_slo_s).name
    cfg = {"mode": "sim", "preset": preset.as_dict(), "rotasched": config.__dict__,
           "rates": rates, "policies": policies, "seed": args.seed,
           "num_requests": args.num_requests or preset.num_requests}
    raw = {"sim": {p: {str(r): s for r, s in d.items()} for p, d in results.items()}}
    if previous.exists() and "real" in old.get("raw", {}):
        raw["real"], cfg["real"] = old["raw"]["real"], old["config"].get("real")
    path = write_results("slo", cfg, raw, summary, out_dir=out_dir)
    print(f"headline (rate {summary.get('headline_rate')}): LVF - FCFS TTFT attainment "
          f"{_pts(summary.get('lvf_minus_fcfs_ttft_attainment_pts'))}, TBT attainment "
          f"{_pts(summary.get('lvf_minus_fcfs_tbt_attainment_pts'))}; rates meeting the "
          f"target: {summary.get('rates_meeting_target')}")
    print(f"wrote {path}")
    return summary


def _pts(v) -> str:
    return "-" if v is None else f"{v:+.1f} pts"


def parse_rates(text: str):
    if text == "auto":  # --real: the simulator chooses (slo_real.choose_rates)
        return text
    rates = [float(x) for x in text.split(",") if x.strip()]
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError(f"rates must be positive requests/s, got {text!r}")
    return rates


def parse_budget(text: str):
    """--transfer-budget (blocks per iteration) and --decision-interval (iterations): a
    positive integer, or 'auto' (--real: the simulator picks)."""
    return text if text == "auto" else positive_int(text)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m blink_edu.bench.slo",
                                 description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sim", action="store_true", help="the simulator at the preset's scale")
    mode.add_argument("--real", action="store_true",
                      help="the engine on this machine, beside the simulator's prediction")
    ap.add_argument("--preset", default="qwen2.5-32b-gh200", choices=list(PRESETS))
    ap.add_argument("--rates", type=parse_rates, default=None,
                    help="req/s, comma-separated; with --real also 'auto' (the simulator picks)")
    ap.add_argument("--policies", type=lambda s: s.split(","), default=None,
                    help=f"comma-separated, from {', '.join(POLICIES)}")
    ap.add_argument("--num-requests", type=positive_int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--executor", default=None,
                    help="--real: reference (CPU) or graph (GPU); default: the backend's")
    ap.add_argument("--kv-blocks", type=positive_int, default=384,
                    help="--real: the engine's KV pool (16-token blocks; 384 hold ~27 requests "
                         "of mean length)")
    ap.add_argument("--max-num-seqs", type=positive_int, default=64,
                    help="--real: the engine's batch limit (sequences per step; above what "
                         "the pool holds, so that memory, not this limit, is what presses)")
    ap.add_argument("--calibration-requests", type=positive_int, default=None,
                    help="--real: requests in the calibration burst (default: 3.5x what the "
                         "KV pool holds at once, at least 24)")
    ap.add_argument("--transfer-budget", type=parse_budget, default=None,
                    help="--real: RotaSched's B_xfer in blocks per iteration, or 'auto': the "
                         "simulator, calibrated on this machine, picks it with the rates")
    ap.add_argument("--decision-interval", type=parse_budget, default=None,
                    help="--real: RotaSched policies decide every N iterations, or 'auto': the "
                         "simulator picks N with the budget and the rates")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    for name in args.policies or ():
        if name not in POLICIES:
            ap.error(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    if args.sim and args.rates == "auto":
        ap.error("--rates auto is for --real (the simulator picks the real run's rates)")
    if args.sim and args.transfer_budget is not None:
        ap.error("--transfer-budget is for --real (--sim runs the preset's B_xfer)")
    if args.sim and args.decision_interval is not None:
        ap.error("--decision-interval is for --real (--sim decides every iteration, as the "
                 "paper)")
    if args.real:
        from ..engine.llm_engine import default_executor
        from .slo_real import blocks_for_longest_request, calibration_burst_size

        if args.kv_blocks < blocks_for_longest_request():
            ap.error(f"--kv-blocks {args.kv_blocks}: the workload's longest request needs "
                     f"{blocks_for_longest_request()} blocks of 16 tokens")

        args.executor = args.executor or default_executor()
        args.rates = args.rates or [12.0, 24.0]
        args.policies = args.policies or ["fcfs", "lvf"]
        args.num_requests = args.num_requests or 40
        args.calibration_requests = (args.calibration_requests
                                     or calibration_burst_size(args.kv_blocks, args.max_num_seqs))
        args.transfer_budget = args.transfer_budget or "auto"
        args.decision_interval = args.decision_interval or "auto"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    run_real(args) if args.real else run_sim(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
