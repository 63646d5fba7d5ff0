"""``python -m blink_edu.bench.slo``: TTFT / TBT SLO attainment, P99 TTFT and P99 TBT against
request rate for every scheduling policy (SuperInfer §5, Figures of attainment vs rate).

    python -m blink_edu.bench.slo --sim                                  # paper scale, simulated
    python -m blink_edu.bench.slo --sim --preset qwen2.5-32b-h200-pcie --rates 4,6,8
    python -m blink_edu.bench.slo --real                  # the engine here, beside the simulator
    python -m blink_edu.bench.slo --real --kv-blocks 96 --max-num-seqs 16   # minutes on a CPU

``--sim`` runs ``blink_edu.sim`` (the same policy objects as the engine, against a cost model)
for every policy over the preset's rates, one seeded workload per rate replayed for every policy
(docs/design.md §9), prints a table, plots attainment against rate (``slo_attainment.png``) and writes
``slo.json`` (in the results folder, ``--out``) whose ``summary`` holds ``lvf_minus_fcfs_ttft_attainment_pts`` and
``lvf_minus_fcfs_tbt_attainment_pts`` at the most pressured rate where FCFS still completes (every
request done within ``drain_s`` of the last arrival; see ``sim.sweep.headline``).

``--real`` runs the policies on the real engine (``slo_real.py``: the bundled model, a KV
pool small enough to force rotation, the step-time model calibrated on this machine) and the
simulator's prediction of the same run beside it; it adds ``raw["real"]`` and
``sim_vs_real_error`` to ``slo.json``, keeping the simulator part already there. Each part keeps
the machine and commit it was measured at (``sections``; ``results.py``). On a GPU,
``--executor graph,persistent`` also replays the same workload, on the same plan, through a ring to
the persistent kernel, whose RotaSched decisions and rotations happen on the GPU, and ``--hog``
replays LVF again on every executor beside a CPU hog (``slo_ring.py``: ``raw["real_executors"]``,
``persistent_lvf_minus_fcfs_*``, ``*_lvf_hog_*_loss_pts``, ``host_cpu_us_per_token_*``):

    python -m blink_edu.bench.slo --real --executor graph,persistent --hog --rates auto
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..sched.policies import POLICIES
from ..sim.presets import PRESETS, get_preset
from ..sim.sweep import headline, sweep
from .cli import bench_parser
from .results import (print_table, provenance, read_results, results_dir,
                      section_provenance, write_results)

COLUMNS = ["rate", "policy", "ttft_attainment_pct", "tbt_attainment_pct", "p99_ttft_ms",
           "p99_tbt_ms", "median_tpot_ms", "preemptions", "finished", "completed"]


#: summary keys of the real-engine part besides ``real_*``: slo_ring.summary's
RING_KEY_PREFIXES = ("persistent", "graph_", "eager_", "reference_", "host_cpu_us_per_token_")


def is_real_key(key: str) -> bool:
    """Whether ``slo.json``'s summary ``key`` belongs to the real-engine part (``--real``
    writes them all anew; ``--sim`` keeps them)."""
    return (key.startswith(("real_", "sim_vs_real", *RING_KEY_PREFIXES))
            or key == "iteration_model_error")


def is_real_part(key: str) -> bool:
    """Whether ``slo.json``'s raw ``key`` is the real-engine part's ("real", "real_executors")."""
    return key.startswith("real")


def run_real(args) -> dict:
    from .slo_real import run_real_experiment

    cfg, raw, summary = run_real_experiment(args.real_run)
    previous = read_results("slo", args.out)
    config = {**previous.get("config", {}), "real": cfg}
    merged_raw = {**{k: v for k, v in previous.get("raw", {}).items() if not is_real_part(k)},
                  **raw}
    kept = {k: v for k, v in previous.get("summary", {}).items() if not is_real_key(k)}
    sections = {"real": provenance()}
    if "sim" in previous.get("raw", {}):  # the simulator's part, measured by an earlier run
        sections["sim"] = section_provenance(previous, "sim")
    path = write_results("slo", config, merged_raw, {**kept, **summary}, args.out, sections)
    print(f"sim_vs_real_error (largest relative error of mean TTFT / TPOT): "
          f"{summary['sim_vs_real_error']:.1%}; wrote {path}")
    return {**kept, **summary}


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
    out_dir = results_dir(args.out)
    previous = read_results("slo", out_dir)
    # keep a real-engine part measured earlier (--real), with its own provenance
    summary.update({k: v for k, v in previous.get("summary", {}).items() if is_real_key(k)})
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_plot:
        summary["plot"] = plot(results, preset.name, out_dir, config.ttft_slo_s,
                               config.tbt_slo_s).name
    cfg = {"mode": "sim", "preset": preset.as_dict(), "rotasched": config.__dict__,
           "rates": rates, "policies": policies, "seed": args.seed,
           "num_requests": args.num_requests or preset.num_requests}
    raw = {"sim": {p: {str(r): s for r, s in d.items()} for p, d in results.items()}}
    sections = {"sim": provenance()}
    if "real" in previous.get("raw", {}):
        raw.update({k: v for k, v in previous["raw"].items() if is_real_part(k)})
        cfg["real"] = previous["config"].get("real")
        sections["real"] = section_provenance(previous, "real")
    path = write_results("slo", cfg, raw, summary, out_dir, sections)
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
    ap = bench_parser("slo", __doc__)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sim", action="store_true", help="the simulator at the preset's scale")
    mode.add_argument("--real", action="store_true",
                      help="the engine on this machine, beside the simulator's prediction")
    ap.add_argument("--preset", default="qwen2.5-32b-gh200", choices=list(PRESETS),
                    help="--sim: the simulated model and machine")
    ap.add_argument("--rates", type=parse_rates, default=None,
                    help="req/s, comma-separated; with --real also 'auto' (the simulator picks) "
                         "(default: the preset's; --real: 12,24)")
    ap.add_argument("--policies", type=lambda s: s.split(","), default=None,
                    help=f"comma-separated, from {', '.join(POLICIES)} (default: all; --real: "
                         f"fcfs,lvf)")
    ap.add_argument("--num-requests", type=positive_int, default=None,
                    help="requests per rate (default: the preset's; --real: 40)")
    ap.add_argument("--seed", type=int, default=0, help="the workload's seed")
    ap.add_argument("--no-plot", action="store_true", help="no slo_attainment.png")
    ap.add_argument("--executor", default=None,
                    help="--real: reference (CPU) or graph (GPU), default: the backend's; on a "
                         "GPU also persistent and persistent-graph, comma-separated (e.g. "
                         "graph,persistent): the persistent kernels replay the same workload "
                         "through a ring, on the plan calibrated on the host-driven executor")
    ap.add_argument("--hog", action="store_true", default=None,
                    help="--real: replay LVF again on every executor beside a CPU hog on every "
                         "core but the frontend's")
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
                         "simulator, calibrated on this machine, picks it with the rates "
                         "(default: auto)")
    ap.add_argument("--decision-interval", type=parse_budget, default=None,
                    help="--real: RotaSched policies decide every N iterations, or 'auto': the "
                         "simulator picks N with the budget and the rates (default: auto)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    for name in args.policies or ():
        if name not in POLICIES:
            ap.error(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    if args.sim and args.rates == "auto":
        ap.error("--rates auto is for --real (the simulator picks the real run's rates)")
    if args.sim and args.transfer_budget is not None:
        ap.error("--transfer-budget is for --real (--sim runs the preset's B_xfer)")
    if args.sim and args.hog:
        ap.error("--hog is for --real")
    if args.sim and args.decision_interval is not None:
        ap.error("--decision-interval is for --real (--sim decides every iteration, as the "
                 "paper)")
    if args.real:
        from .slo_real import RealRunConfig

        try:
            args.real_run = RealRunConfig.from_args(args)
        except ValueError as err:
            ap.error(str(err))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    run_real(args) if args.real else run_sim(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
