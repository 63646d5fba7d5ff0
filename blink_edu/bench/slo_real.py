"""``python -m blink_edu.bench.slo --real``: the policies on the real engine, and the simulator's
prediction of that very run beside it (SuperInfer §5; docs/design.md §9).

This module is the experiment's driver; its parts live beside it: the replay on the engine
(``replay.py``), the cost-model fit (``sim/calibrate.py``), the plan search (``slo_plan.py``)
and the command line (``slo.py``; ``python -m blink_edu.bench.slo_real`` is the same as
``bench.slo --real``). Its settings are one frozen ``RealRunConfig``.

The real engine is ``LLMEngine`` with the bundled model and a KV pool small enough to force
preemption: by default 384 blocks of 16 tokens, about 27 requests of mean length, with room for
64 in a batch, so that memory, not the batch limit, is what presses. (A pool of 96 blocks and
16 sequences holds ~7 requests: every rotation is a seventh of the batch, and a batch of young
requests pays the step's per-sequence cost; there LVF gave up TBT wherever it gained TTFT, on
the H200 and in the simulator alike -- chapter 06 shows both regimes.) On this machine it runs
the NumPy reference executor on the CPU; on a GPU the graph executor (``--executor``). Each
policy runs as the simulator runs it: FCFS preempts by recompute (vLLM v1, SuperInfer's
baseline), the RotaSched policies rotate through DuplexKV (``preemption="rotate"``, with a host
arena that never refuses a rotation, as the simulator's host never does), and they get the same
SLOs and transfer budget as the simulator's copy.
The experiment:

1. **calibrate** the simulator's step-time model on this machine and executor: replay a burst
   (every request at t=0) under FCFS and under LVF with the very loop that the measured runs use
   (``bench.replay``), and fit ``iteration = a + b * batched tokens + s * sequences + c * context
   tokens + d * requests moved + e * decided + f * mirrored`` (tokens and sequences padded to
   the captured shape the kernel executors run, ``config.padded_step_shape``; decided: the engine
   described its requests to a RotaSched policy and it decided; mirrored: a rotating policy's
   DuplexKV kept its host mirror): a, b, s, c on the FCFS iterations that moved nobody, d, e and
   f on what every other iteration took beyond that (``calibrate``, ``sim.calibrate``). An iteration is everything
   the loop does from one model step to the next (arrivals, scheduling, policy, rotations, the
   model, handing tokens out), which is what the simulator charges for a step;
2. build a preset from it (the same KV pool, block size, batch limits; SLOs scaled to the step as
   the paper's are: S_B = 5 x the median iteration, S_F = 50 S_B);
   ``--transfer-budget auto`` (the default) lets the simulator pick B_xfer, the blocks RotaSched
   may rotate in per iteration, with the rates (``slo_plan.choose_plan``): on the GPU every request moved
   costs the host tens of microseconds against a ~3 ms step, so the paper's budget scaled to
   our pool (230 blocks: sixteen requests per step) could spend the TBT SLO on bookkeeping -- as
   SuperInfer sizes B_xfer to what its hardware moves in an iteration, we size it to ours.
   ``--decision-interval auto`` (the default) likewise lets it pick how often the policy
   decides (every 1, 2, 4, 8 or 16 iterations; ``Policy.decides_at``): SuperInfer's decision
   is a sliver of its ~20 ms iteration, ours (describe every request, rank them) takes
   ~0.2 ms of a ~3 ms step;
3. for each rate and policy, replay one seeded Poisson workload with ShareGPT-like log-normal
   lengths (``sim.workload``) on the engine in real time -- requests are added when their arrival
   time comes, token times are taken as the engine returns them -- and in the simulator;
4. score both with the same definitions (``sim.metrics``) and report the relative error of the
   simulator's mean TTFT and mean TPOT against the measurement (``sim_vs_real_error``: the
   largest of them over every policy and rate). The mean, not the median: past the knee TPOTs
   spread from one step to dozens, and a median sitting on that slope moves by half when a
   schedule shifts a tenth of the requests across it; the medians' error is reported beside it
   (``sim_vs_real_median_error``), and so is the largest gap in attainment points.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..config import PERSISTENT_EXECUTORS, EngineConfig, resolve_executor
from ..executors.protocol import Executor
from ..engine.llm_engine import LLMEngine, make_executor
from ..kv.block_manager import blocks_needed
from ..kv.pool import block_nbytes
from ..model.bundled import resolve_model_dir
from ..model.weights import ModelWeights, load_weights
from ..sched.policies import POLICIES, make_policy
from ..sched.vlt import RotaSchedConfig
from ..sim.calibrate import Calibration, decision_cost, fit_rotation, fit_step, iteration_fit
from ..sim.costs import BandwidthCurve
from ..sim.metrics import score
from ..sim.presets import PCIE_H200, Preset, qwen_gh200
from ..sim.simulator import simulate
from ..sim.workload import LengthModel, RequestSpec, poisson_workload
from . import slo_plan, slo_ring
from .replay import BatchRecorder, Replay, replay

#: Long enough outputs for rotation to pay (a request rotated out keeps its KV, one recomputed
#: redoes it all); at most 512 tokens: the bundled model's max_position_embeddings.
LENGTHS = LengthModel(input_mean=64, input_sigma=0.6, output_mean=160, output_sigma=0.6,
                      max_model_len=512)
#: Host-to-host copies of the CPU path's "rotation" (NumPy, one core): a flat, fast curve.
HOST_MEMCPY = BandwidthCurve(sizes_bytes=(64 * 1024, 8 * 1024 * 1024), gbps=(5.0, 8.0),
                             duplex_total_gbps=8.0)
BLOCK_SIZE = 16  # tokens per KV block, as the simulator's presets
MAX_BATCHED_TOKENS = 256  # the engine's per-step token budget, and the simulator's


@dataclass(frozen=True)
class RealRunConfig:
    """The experiment's settings (``bench.slo --real``'s flags). ``rates``,
    ``transfer_budget`` and ``decision_interval`` may be "auto": the simulator picks them
    (``slo_plan``); ``calibration_requests`` None: ``slo_plan.calibration_burst_size``."""

    executor: str  # reference | eager | graph (never auto: resolved by from_args)
    # the persistent kernels measured beside it on the same plan (slo_ring.py): persistent,
    # persistent-graph
    ring_executors: tuple[str, ...] = ()
    hog: bool = False  # LVF replayed again beside a CPU hog, on every executor (slo_ring.py)
    kv_blocks: int = 384
    max_num_seqs: int = 64
    rates: tuple[float, ...] | str = (12.0, 24.0)
    policies: tuple[str, ...] = ("fcfs", "lvf")
    num_requests: int = 40
    seed: int = 0
    calibration_requests: int | None = None
    transfer_budget: int | str = "auto"
    decision_interval: int | str = "auto"

    def __post_init__(self):
        if self.kv_blocks < blocks_for_longest_request():
            raise ValueError(f"--kv-blocks {self.kv_blocks}: the workload's longest request "
                             f"needs {blocks_for_longest_request()} blocks of {BLOCK_SIZE} tokens")
        if self.executor in PERSISTENT_EXECUTORS or any(
                name not in PERSISTENT_EXECUTORS for name in self.ring_executors):
            raise ValueError(f"executor {self.executor!r} with {list(self.ring_executors)}: the "
                             f"host-driven one calibrates, the persistent ones "
                             f"({', '.join(PERSISTENT_EXECUTORS)}) are measured beside it")
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
        if self.calibration_requests is None:
            object.__setattr__(self, "calibration_requests", slo_plan.calibration_burst_size(
                self.kv_blocks, self.max_num_seqs, LENGTHS))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RealRunConfig:
        """From ``bench.slo``'s flags (or a diagnostic's); a flag left out, or None, keeps the
        default above. ``--executor`` is a comma-separated list: at most one host-driven
        executor (reference, eager, graph, auto), and persistent kernels -- which need a GPU and
        a host-driven executor to calibrate on (the graph one when none is named)."""
        given = {name: getattr(args, name, None) for name in (
            "kv_blocks", "max_num_seqs", "num_requests", "seed", "calibration_requests",
            "transfer_budget", "decision_interval", "rates", "policies", "hog")}
        given = {name: value for name, value in given.items() if value is not None}
        for name in ("rates", "policies"):
            if name in given and given[name] != "auto":
                given[name] = tuple(given[name])
        names = (getattr(args, "executor", None) or "auto").split(",")
        ring = tuple(name for name in names if name in PERSISTENT_EXECUTORS)
        host = [name for name in names if name not in PERSISTENT_EXECUTORS]
        if len(host) > 1:
            raise ValueError(f"--executor {','.join(names)}: one host-driven executor at most")
        slo_ring.host_cores(bool(given.get("hog")))  # --hog on one core: refused now, not later
        if ring:
            from ..backend import get_backend

            if get_backend().is_simulator:
                raise ValueError(f"--executor {','.join(ring)} needs a GPU: Numba's simulator "
                                 f"runs the persistent kernel for tests, far too slowly for "
                                 f"this experiment")
        return cls(executor=resolve_executor(host[0] if host else "graph" if ring else "auto"),
                   ring_executors=ring, **given)

    @property
    def auto_plan(self) -> bool:
        """Whether the simulator picks any of rates, budget and interval."""
        return "auto" in (self.rates, self.transfer_budget, self.decision_interval)


def blocks_for_longest_request() -> int:
    """KV blocks of the workload's longest request: the pool must hold one."""
    return blocks_needed(LENGTHS.max_model_len, BLOCK_SIZE)


def engine_config(run: RealRunConfig, policy: str, num_requests: int) -> EngineConfig:
    """The engine for ``policy`` serving ``num_requests`` requests, preempting as the
    simulator's policy of that name does. The simulator's host memory has no bound, so the
    engine's host arena is made big enough never to refuse a rotation (which would fall back to
    a recompute): a mirror of every GPU block, plus every request's longest KV at once."""
    rotary = POLICIES[policy].preemption == "rotary"
    return EngineConfig(executor=run.executor, block_size=BLOCK_SIZE,
                        num_kv_blocks=run.kv_blocks, max_num_seqs=run.max_num_seqs,
                        max_num_batched_tokens=MAX_BATCHED_TOKENS,
                        preemption="rotate" if rotary else "recompute",
                        num_host_kv_blocks=run.kv_blocks + num_requests * blocks_for_longest_request(),
                        policy=policy)


def rotasched_config(run: RealRunConfig, step_s: float) -> RotaSchedConfig:
    """The RotaSched parameters of this experiment, for the engine and the simulator alike: the
    paper's alpha and betas; its SLOs as multiples of the step (S_B = 5 steps, S_F = 50 S_B: its
    100 ms and 5 s against a ~20 ms step); ``transfer_budget``, or (auto, until the plan picks
    one) the paper's budget scaled to our pool; ``decision_interval``, or (auto, until then)
    the paper's every iteration."""
    tbt = 5 * step_s
    budget, interval = run.transfer_budget, run.decision_interval
    return RotaSchedConfig(ttft_slo_s=50 * tbt, tbt_slo_s=tbt, transfer_budget_blocks=(
        slo_plan.transfer_budget_blocks(run.kv_blocks) if budget == "auto" else budget),
        decision_interval=1 if interval == "auto" else interval)


class Bench:
    """One executor (warmed up once), a fresh engine over it for every replay."""

    def __init__(self, run: RealRunConfig, weights: ModelWeights, executor: Executor,
                 rng: np.random.Generator):
        self.run, self.weights, self.executor, self.rng = run, weights, executor, rng

    def replay(self, policy: str, rotasched: RotaSchedConfig | None,
               workload: list[RequestSpec]) -> Replay:
        """``workload`` on a fresh engine for ``policy``; a RotaSched policy decides with
        ``rotasched`` (the engine's own default is the paper's absolute SLOs). Its host arena is
        sized for the measured runs' ``num_requests`` at least, so that the calibration replays
        keep the host books the measured runs keep (the allocator's scans grow with the
        arena)."""
        recorder = BatchRecorder(self.executor)
        config = engine_config(self.run, policy, max(len(workload), self.run.num_requests))
        engine = LLMEngine(self.weights, config, executor=recorder)
        if policy != "fcfs":
            engine.scheduler.policy = make_policy(policy, rotasched)
        return replay(engine, recorder, workload, self.rng)

    def warm_up(self) -> None:
        """Capture the graph executor's CUDA graph of every batch shape (otherwise it captures
        one the first time it meets a shape: hundreds of ms in the middle of a measured run),
        then run a burst under LVF with the paper's defaults (it rotates plenty), unmeasured,
        so that the kernels -- the copy engines' too -- are compiled. The NumPy reference has
        nothing to compile or capture."""
        if self.executor.name == "reference":
            return
        if self.executor.name == "graph":  # GraphExecutor: the one executor that captures
            self.executor.capture_all()
        self.replay("lvf", RotaSchedConfig(), burst(16, self.run.seed + 2))

    def calibrate(self) -> tuple[Calibration, RotaSchedConfig]:
        """A burst under FCFS sets the SLOs (its median plain iteration is the step); then a
        Poisson stream at about the rate the pool sustains, seeded apart from the measured runs
        but like them (a burst has few iterations mixing decodes with a prompt chunk, and its
        rotations come in waves), is replayed three times. FCFS iterations that moved nobody, of
        the burst and of the stream (between them, the range of batches and contexts the
        measured runs meet), give the step (``sim.calibrate.fit_step``); every other iteration
        of the stream -- FCFS's recomputes and all of LVF's, which rotates -- gives the costs of
        moves, decisions and the mirror (``fit_rotation``). LVF runs twice: with the scaled
        transfer budget, deciding every iteration, and with a small one, deciding every fourth,
        so that moves, decisions and steps vary apart. Every other RotaSched policy of the run
        then replays the stream once for its own cost per decision."""
        run = self.run
        plain = [i for i in self.replay("fcfs", None, burst(run.calibration_requests,
                                                             run.seed + 1)).iterations
                 if i.moved == 0]
        step_s = statistics.median(i.seconds for i in plain)
        rotasched = rotasched_config(run, step_s)
        stream = poisson_workload(4 * run.calibration_requests, slo_plan.sustained_rate(
            run.kv_blocks, run.max_num_seqs, step_s, LENGTHS), LENGTHS, run.seed + 3)
        fcfs = self.replay("fcfs", None, stream).iterations
        plain += [i for i in fcfs if i.moved == 0]
        small_budget = min(slo_plan.budget_candidates(run.kv_blocks))
        lvf = [i for budget, interval in ((rotasched.transfer_budget_blocks, 1), (small_budget, 4))
               for i in self.replay("lvf", rotasched.replace(transfer_budget_blocks=budget,
                                                             decision_interval=interval),
                                    stream).iterations]
        # the kernel executors run each step at a captured power-of-two shape (their
        # BucketTable); the NumPy reference runs the batch as it is
        padded = self.executor.buckets is not None
        step = fit_step(plain, padded)  # [a, b, s, c]
        d, e, f = fit_rotation([i for i in fcfs if i.moved] + lvf, step, padded)
        costs = {"lvf": e}
        for policy in run.policies:  # the other RotaSched policies: their decisions
            if policy in costs or not make_policy(policy).described:
                continue
            its = self.replay(policy, rotasched, stream).iterations
            costs[policy] = decision_cost(its, step, d, f, padded)
        return Calibration(*step, d, costs, f, step_s, padded), rotasched


def burst(n: int, seed: int) -> list[RequestSpec]:
    """``n`` requests of the experiment's lengths, all arriving at t=0."""
    return poisson_workload(n, float("inf"), LENGTHS, seed)


def link_for(executor: str) -> BandwidthCurve:
    """The copy curve the real engine's rotations ride on: host memcpy for the CPU path, the
    H200's measured PCIe link for the kernel executors (DuplexKV's device transport)."""
    return HOST_MEMCPY if executor == "reference" else PCIE_H200


def preset_for(weights: ModelWeights, run: RealRunConfig, cal: Calibration,
               rotasched: RotaSchedConfig, target_predicted: bool = True) -> Preset:
    """The simulator's copy of this machine; ``target_predicted``: False when the plan search
    predicted the target nowhere and chose its nearest miss (its sources say so)."""
    block_bytes = block_nbytes(weights.config, BLOCK_SIZE, itemsize=4)
    return Preset(
        name=f"bundled-{run.executor}-measured",
        description="the bundled model on this machine, step time fitted just now",
        cost=cal.cost_model(block_bytes, link_for(run.executor)),
        num_gpu_blocks=run.kv_blocks, max_num_seqs=run.max_num_seqs,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        transfer_budget_blocks=rotasched.transfer_budget_blocks, lengths=LENGTHS,
        rates=() if run.rates == "auto" else tuple(run.rates),
        num_requests=run.num_requests, ttft_slo_s=rotasched.ttft_slo_s,
        tbt_slo_s=rotasched.tbt_slo_s,
        sources={"step_time": f"fitted on this machine: {cal.described()}",
                 "slos": f"S_B = 5 x the median FCFS iteration ({cal.step_s * 1e3:.2f} ms), "
                         f"S_F = 50 S_B (the paper's ratios to its step time)",
                 "transfer_budget": budget_source(run, rotasched.transfer_budget_blocks,
                                                  target_predicted),
                 "decision_interval": interval_source(run, rotasched.decision_interval,
                                                      target_predicted)})


def budget_source(run: RealRunConfig, budget: int, met: bool) -> str:
    paper = qwen_gh200()
    scaled = (f"SuperInfer's B_xfer scaled to this pool: {run.kv_blocks} x "
              f"{paper.transfer_budget_blocks} / {paper.num_gpu_blocks} (qwen2.5-32b-gh200's KV "
              f"blocks) = {slo_plan.transfer_budget_blocks(run.kv_blocks)}")
    if run.transfer_budget != "auto":
        return f"--transfer-budget {budget} blocks ({scaled})"
    return (f"{budget} blocks: chosen by the simulator calibrated on this machine among "
            f"{slo_plan.budget_candidates(run.kv_blocks)}, {plan_outcome(met)} ({scaled})")


def interval_source(run: RealRunConfig, interval: int, met: bool) -> str:
    if run.decision_interval != "auto":
        return f"--decision-interval {interval}"
    return (f"every {interval} iteration(s): chosen by the simulator calibrated on this machine "
            f"among {slo_plan.interval_candidates('auto')}, {plan_outcome(met)} (the paper "
            f"decides every iteration)")


def plan_outcome(met: bool) -> str:
    return ("the target predicted with the widest margin" if met else
            "the nearest miss (the target predicted nowhere)")


#: what ``sim_vs_real_error`` compares: the simulator's mean TTFT and TPOT against the measured
PREDICTED = ("mean_ttft_ms", "mean_tpot_ms")
MEDIANS = ("median_ttft_ms", "median_tpot_ms")
ATTAINMENTS = ("ttft_attainment_pct", "tbt_attainment_pct")


def lvf_minus_fcfs(raw: dict, rate: float) -> dict:
    """The measured LVF - FCFS attainment gaps (points) at ``rate``."""
    lvf, fcfs = raw["lvf"][str(rate)]["real"], raw["fcfs"][str(rate)]["real"]
    return {"ttft_attainment_pts": lvf["ttft_attainment_pct"] - fcfs["ttft_attainment_pct"],
            "tbt_attainment_pts": lvf["tbt_attainment_pct"] - fcfs["tbt_attainment_pct"]}


def relative_error(sim, real):
    return None if sim is None or not real else abs(sim - real) / real


def plan(bench: Bench, preset: Preset, cal: Calibration,
         config: RotaSchedConfig) -> tuple[RealRunConfig, RotaSchedConfig, Preset, list[dict]]:
    """Let the simulator pick what ``bench.run`` left "auto" (``slo_plan.choose_plan``): the
    run with its rates, the RotaSched config, the preset, every prediction."""
    run = bench.run
    budgets = (slo_plan.budget_candidates(run.kv_blocks) if run.transfer_budget == "auto"
               else [config.transfer_budget_blocks])
    config, rates, predictions, met = slo_plan.choose_plan(
        preset, config, cal.step_s, rates=run.rates, budgets=budgets,
        intervals=slo_plan.interval_candidates(run.decision_interval),
        num_requests=run.num_requests, seed=run.seed, lengths=LENGTHS)
    run = replace(run, rates=tuple(rates))
    return run, config, preset_for(bench.weights, run, cal, config, target_predicted=met), predictions


def measure(bench: Bench, preset: Preset, cal: Calibration, config: RotaSchedConfig,
            rate: float, policy: str, workload: list[RequestSpec],
            cores: slo_ring.Cores | None = None) -> dict:
    """One policy at one rate: replayed on the engine (its loop on ``cores.others`` when
    placed: ``slo_ring.replay_host_loop``) and simulated, scored alike."""
    priced = cal.priced(preset, policy)
    real = measured(slo_ring.replay_host_loop(bench, policy, config, workload, cores, False),
                    config, priced.cost)
    sim_result = simulate(priced, make_policy(policy, config), workload)
    sim = {**score(sim_result.requests, config.ttft_slo_s, config.tbt_slo_s),
           "preemptions": sum(r.num_preemptions for r in sim_result.requests),
           "steps": sim_result.steps}
    err = {k: relative_error(sim[k], real[k]) for k in PREDICTED + MEDIANS}
    return {"real": real, "sim": sim, "sim_rel_error": err}


def measured(run: Replay, config: RotaSchedConfig, cost) -> dict:
    """A replay on the host-driven engine, scored, with its counts and its iterations against
    the cost model ``cost``."""
    return {**score(run.requests, config.ttft_slo_s, config.tbt_slo_s), **run.counts,
            **iteration_fit(run.iterations, cost)}


def measure_beside(bench: Bench, cal: Calibration, preset: Preset, config: RotaSchedConfig,
                   rate: float, policy: str, workload: list[RequestSpec],
                   cores: slo_ring.Cores | None, executors: dict, started: float) -> None:
    """The rows of ``slo_ring.py`` at one rate and policy, into ``executors`` (executor ->
    "quiet"/"hog" -> policy -> rate -> row): LVF on the host-driven engine beside the hog
    (its quiet row is ``measure``'s); every persistent kernel quiet, and LVF again beside the
    hog."""
    run = bench.run
    hogged = run.hog and policy in slo_ring.HOG_POLICIES
    if hogged:
        row = measured(slo_ring.replay_host_loop(bench, policy, config, workload, cores, True),
                       config, cal.priced(preset, policy).cost)
        executors[run.executor]["hog"].setdefault(policy, {})[str(rate)] = row
        slo_ring.print_row(time.perf_counter() - started, rate, run.executor, policy, True, row)
    engine = engine_config(run, policy, max(len(workload), run.num_requests))
    for name in run.ring_executors:
        for hog in (False, True) if hogged else (False,):
            row = slo_ring.replay_persistent(bench, name, engine, config, workload, cores, hog)
            executors[name]["hog" if hog else "quiet"].setdefault(policy, {})[str(rate)] = row
            slo_ring.print_row(time.perf_counter() - started, rate, name, policy, hog, row)


def calibrated_bench(run: RealRunConfig) -> tuple[Bench, Calibration, RotaSchedConfig]:
    """The bundled model on one executor for every replay (a fresh engine over it each time),
    warmed up once, and the cost model calibrated on it: the experiment's first half, and the
    start of every diagnostic of it (``tools/iteration_drift.py``, ``tools/profile_rotation.py``).
    The executor owns the KV pool, not the host arena: no requests to size that for."""
    weights = load_weights(resolve_model_dir())
    executor = make_executor(run.executor, weights, engine_config(run, "fcfs", num_requests=0))
    bench = Bench(run, weights, executor, np.random.default_rng(run.seed))
    bench.warm_up()
    cal, config = bench.calibrate()
    return bench, cal, config


def diagnostic_parser(prog: str, doc: str, **defaults) -> argparse.ArgumentParser:
    """The command line of a diagnostic of this experiment (``tools/``): the engine's flags of
    ``bench.slo --real``, with the diagnostic's ``defaults`` (flag name -> value)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--executor", default=defaults.get("executor", "graph"),
                   help="reference, eager or graph")
    p.add_argument("--kv-blocks", type=int, default=defaults.get("kv_blocks", 384),
                   help="the engine's KV pool")
    p.add_argument("--max-num-seqs", type=int, default=defaults.get("max_num_seqs", 64),
                   help="the engine's batch limit")
    p.add_argument("--num-requests", type=int, default=defaults.get("num_requests", 200),
                   help="requests per run (and what the host arena is sized for)")
    p.add_argument("--transfer-budget", type=lambda t: t if t == "auto" else int(t),
                   default=defaults.get("transfer_budget", "auto"),
                   help="LVF's B_xfer in blocks ('auto': the paper's, scaled to the pool)")
    p.add_argument("--decision-interval", type=int, default=defaults.get("decision_interval", 1),
                   help="LVF decides every N iterations")
    return p


def run_real_experiment(run: RealRunConfig) -> tuple[dict, dict, dict]:
    """(config, raw, summary) of the real-engine experiment; ``raw["real"]``: policy -> rate
    -> the host engine's row beside the simulator's; ``raw["real_executors"]``: executor ->
    "quiet"/"hog" -> policy -> rate -> measured row, for every executor (``slo_ring.py``)."""
    started = time.perf_counter()
    bench, cal, config = calibrated_bench(run)
    weights = bench.weights
    preset = preset_for(weights, run, cal, config)
    print(f"[{time.perf_counter() - started:.0f} s] calibrated on this machine ({run.executor}): "
          f"{cal.described()}; SLOs TTFT {config.ttft_slo_s * 1e3:.0f} ms, TPOT "
          f"{config.tbt_slo_s * 1e3:.1f} ms; transfer budget {config.transfer_budget_blocks} "
          f"blocks", flush=True)
    predictions = []
    if run.auto_plan:
        run, config, preset, predictions = plan(bench, preset, cal, config)
        bench.run = run
        print(f"[{time.perf_counter() - started:.0f} s] chosen by the simulator: B_xfer "
              f"{config.transfer_budget_blocks} blocks, a decision every "
              f"{config.decision_interval} iterations, rates {list(run.rates)}", flush=True)
    cores = slo_ring.host_cores(run.hog)
    for name in run.ring_executors:
        slo_ring.warm_up_persistent(bench, name, engine_config(run, "lvf", run.num_requests),
                                    burst(16, run.seed + 2))
        print(f"[{time.perf_counter() - started:.0f} s] {name}: compiled, warmed up", flush=True)
    raw, drifts = {}, []
    executors = {name: {"quiet": {}, "hog": {}} for name in (run.executor, *run.ring_executors)}
    errors = {"mean": [], "median": [], "attainment": []}
    for rate in run.rates:
        workload = poisson_workload(run.num_requests, rate, LENGTHS, run.seed)
        for policy in run.policies:
            row = measure(bench, preset, cal, config, rate, policy, workload, cores)
            executors[run.executor]["quiet"].setdefault(policy, {})[str(rate)] = row["real"]
            real, sim, err = row["real"], row["sim"], row["sim_rel_error"]
            for kind, keys in (("mean", PREDICTED), ("median", MEDIANS)):
                errors[kind] += [err[k] for k in keys if err[k] is not None]
            errors["attainment"] += [abs(sim[k] - real[k]) for k in ATTAINMENTS]
            raw.setdefault(policy, {})[str(rate)] = row
            print_row(time.perf_counter() - started, rate, policy, row)
            drifts.append(abs(real["mean_iteration_ms"] / real["mean_iteration_model_ms"] - 1))
            measure_beside(bench, cal, preset, config, rate, policy, workload, cores, executors,
                           started)
    summary = {"sim_vs_real_error": max(errors["mean"], default=None),
               "sim_vs_real_median_error": max(errors["median"], default=None),
               "sim_vs_real_attainment_error_pts": max(errors["attainment"], default=None),
               # the cost model's own error: how far a run's mean iteration is from the model's
               # mean for the same iterations (the largest over every policy and rate)
               "iteration_model_error": max(drifts) if drifts else None}
    if {"lvf", "fcfs"} <= set(run.policies):
        summary.update(headline(raw, list(run.rates)))
    summary.update(slo_ring.summary(executors, list(run.rates)))
    cfg = {"mode": "real", "preset": preset.as_dict(), "rotasched": config.__dict__,
           **asdict(run), "rates": list(run.rates), "policies": list(run.policies),
           "ring_executors": list(run.ring_executors), "plan_predictions": predictions,
           "cores": cores and {"frontend": cores.frontend, "others": list(cores.others)}}
    return cfg, {"real": raw, "real_executors": executors}, summary


def headline(raw: dict, rates: list[float]) -> dict:
    """The measured LVF - FCFS gaps: at the last rate, by rate, and the rates meeting the
    target."""
    gaps = {str(rate): lvf_minus_fcfs(raw, rate) for rate in rates}
    last = gaps[str(rates[-1])]
    return {"real_lvf_minus_fcfs_ttft_attainment_pts": last["ttft_attainment_pts"],
            "real_lvf_minus_fcfs_tbt_attainment_pts": last["tbt_attainment_pts"],
            "real_rate": rates[-1], "real_lvf_minus_fcfs_by_rate": gaps,
            "real_rates_meeting_target": [
                float(r) for r, g in gaps.items()
                if slo_plan.meets_target({"ttft_pts": g["ttft_attainment_pts"],
                                          "tbt_pts": g["tbt_attainment_pts"]})]}


def print_row(elapsed_s: float, rate: float, policy: str, row: dict) -> None:
    real, sim, err = row["real"], row["sim"], row["sim_rel_error"]
    print(f"  [{elapsed_s:4.0f} s] rate {rate:5.1f}  {policy:13s} real TTFT "
          f"{real['ttft_attainment_pct']:5.1f}% TBT {real['tbt_attainment_pct']:5.1f}%  |  sim "
          f"TTFT {sim['ttft_attainment_pct']:5.1f}% TBT {sim['tbt_attainment_pct']:5.1f}%  |  "
          f"mean TTFT/TPOT error {err['mean_ttft_ms']:.0%} / {err['mean_tpot_ms']:.0%} (medians "
          f"{err['median_ttft_ms']:.0%} / {err['median_tpot_ms']:.0%})  |  preemptions real "
          f"{real['preemptions']} (rotations {real['rotations']}), sim {sim['preemptions']}  |  "
          f"mean iteration {real['mean_iteration_ms']:.2f} ms, model "
          f"{real['mean_iteration_model_ms']:.2f}", flush=True)


def main(argv=None) -> int:
    """``python -m blink_edu.bench.slo_real [flags]`` = ``python -m blink_edu.bench.slo --real
    [flags]``."""
    from .slo import main as slo_main

    return slo_main(["--real", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
