"""``bench.slo --real --executor persistent[,persistent-graph] [--hog]``: the experiment with the
host out of the loop, and with the host busy.

Both papers at once: SuperInfer §5's experiment (the policies on the engine under memory
pressure, scored by SLO attainment) run on Blink's persistent scheduler kernel (§3), whose
RotaSched decisions and KV rotations happen on the GPU (``executors/persistent_kernel.py``);
and Blink §5's interference test on top: with ``--hog`` LVF is replayed again, on every
executor, while a CPU hog runs on every core but the frontend's (``hog.py``). docs/design.md §9.

The rows share everything but the engine: the workload (seed, rates), the SLOs, the transfer
budget and the decision interval are the ones ``slo_real.py`` calibrated and planned on the
host-driven executor (the simulator's cost model is fitted on a host loop's iterations, which
the kernel has none of); the KV pool, batch limit and host arena are the same. What each row
measures: attainment and latencies (``sim.metrics``), the kernel's own counters (preemptions,
rotations, decisions, blocks each way) and the host's CPU time per token. Where the threads
run, with ``--hog``: the persistent kernel's frontend (this process's main thread) on its own
core; the host-driven engine's loop on the hog's cores, quiet or not -- it is the host work
that a busy host disturbs (``bench.persistent`` places them alike).
"""

from __future__ import annotations

import gc
import os
from contextlib import nullcontext
from dataclasses import replace

from ..config import EngineConfig
from ..engine.llm_engine import kernel_weight_dtype
from ..ring import Ring, RingLayout
from ..sched.vlt import RotaSchedConfig
from ..sim.metrics import score
from ..sim.workload import RequestSpec
from .hog import Cores, CpuHog, run_on
from .ring_replay import ring_replay

#: the policies replayed again beside the hog
HOG_POLICIES = ("lvf",)
#: a hog lasts at most this long (it is killed when its replay ends)
HOG_SECONDS = 600


def ring_layout(max_num_seqs: int, max_model_len: int) -> RingLayout:
    """Slots for every lane a RotaSched policy may keep (4 x the batch) and arenas for the
    workload's longest request."""
    return RingLayout(num_slots=4 * max_num_seqs, max_prompt_tokens=max_model_len,
                      max_output_tokens=max_model_len)


def host_cores(hog: bool) -> Cores | None:
    """Where the host's threads run: pinned (``Cores``) when a hog will run, else anywhere."""
    return Cores.of_this_process() if hog else None


def busy_host(cores: Cores | None, hogged: bool):
    """A CPU hog on every core but the frontend's, or nothing."""
    return CpuHog(cores.others, HOG_SECONDS) if hogged else nullcontext()


def replay_host_loop(bench, policy: str, config: RotaSchedConfig, workload: list[RequestSpec],
                     cores: Cores | None, hogged: bool):
    """``bench.replay`` (the host-driven engine) on the hog's cores when placed, beside a hog if
    ``hogged``."""
    if cores is None:
        return bench.replay(policy, config, workload)
    with busy_host(cores, hogged):
        return run_on(cores.others, bench.replay, policy, config, workload)


def replay_persistent(bench, name: str, engine: EngineConfig, config: RotaSchedConfig,
                      workload: list[RequestSpec], cores: Cores | None, hogged: bool) -> dict:
    """One row on the persistent kernel ``name`` ("persistent": inline dispatch;
    "persistent-graph": device-graph dispatch) configured as the host engine ``engine`` (its
    pool, batch, policy, preemption and host arena): a fresh kernel over a fresh ring, the
    replay's frontend on its own core when placed. Scored as ``slo_real.measure`` scores the
    host engine's rows, with the kernel's counters and the host's CPU time per token."""
    from ..executors.persistent import PersistentExecutor

    weights = bench.weights
    layout = ring_layout(engine.max_num_seqs, weights.config.max_position_embeddings)
    ring = Ring(bytearray(layout.nbytes), layout)
    executor = PersistentExecutor(weights, replace(engine, executor=name), ring,
                                  weight_dtype=kernel_weight_dtype(weights, engine),
                                  dispatch="graph" if name == "persistent-graph" else "inline",
                                  rotasched=config)
    executor.start()
    affinity = os.sched_getaffinity(0)
    try:
        with busy_host(cores, hogged):
            if cores is not None:
                os.sched_setaffinity(0, {cores.frontend})
            result = ring_replay(executor, ring, workload, bench.rng, weights.config.vocab_size)
    finally:
        os.sched_setaffinity(0, affinity)
        executor.stop()
        del executor
        gc.collect()  # its pinned host arena goes back now, not during the next row
    return {**score(result.requests, config.ttft_slo_s, config.tbt_slo_s), **result.counts}


def warm_up_persistent(bench, name: str, engine: EngineConfig,
                       workload: list[RequestSpec]) -> None:
    """Compile the kernel (and, for the graph dispatcher, capture its graphs) on an unmeasured
    ``workload`` under ``engine`` (LVF, which rotates, exercises it all): the first kernel of
    a process compiles for a minute or more."""
    replay_persistent(bench, name, engine, RotaSchedConfig(), workload, None, False)


def attainment_gaps(rows: dict, rate: str) -> dict:
    """LVF - FCFS attainment points of one executor's quiet rows at ``rate``."""
    lvf, fcfs = rows["lvf"][rate], rows["fcfs"][rate]
    return {"ttft_pts": lvf["ttft_attainment_pct"] - fcfs["ttft_attainment_pct"],
            "tbt_pts": lvf["tbt_attainment_pct"] - fcfs["tbt_attainment_pct"]}


def summary(executors: dict, rates: list[float]) -> dict:
    """The headline figures of ``raw["executors"]`` (executor -> "quiet"/"hog" -> policy ->
    rate -> row) at the last rate, ``{key}`` the executor's name with "_" for "-":
    ``{key}_lvf_minus_fcfs_{ttft,tbt}_pts`` (and by rate) for the persistent kernels,
    ``{key}_lvf_hog_{ttft,tbt}_loss_pts`` (quiet minus hogged: points lost to the hog) and
    ``host_cpu_us_per_token_{key}`` (LVF's quiet row) for every executor measured so."""
    last = str(rates[-1])
    out = {}
    for name, runs in executors.items():
        key, quiet, hog = name.replace("-", "_"), runs.get("quiet", {}), runs.get("hog", {})
        if name != "graph" and {"lvf", "fcfs"} <= set(quiet):
            gaps = {str(rate): attainment_gaps(quiet, str(rate)) for rate in rates}
            out[f"{key}_lvf_minus_fcfs_ttft_pts"] = gaps[last]["ttft_pts"]
            out[f"{key}_lvf_minus_fcfs_tbt_pts"] = gaps[last]["tbt_pts"]
            out[f"{key}_lvf_minus_fcfs_by_rate"] = gaps
        if last in hog.get("lvf", {}):
            for kind in ("ttft", "tbt"):
                out[f"{key}_lvf_hog_{kind}_loss_pts"] = (
                    quiet["lvf"][last][f"{kind}_attainment_pct"]
                    - hog["lvf"][last][f"{kind}_attainment_pct"])
        if last in quiet.get("lvf", {}):
            out[f"host_cpu_us_per_token_{key}"] = quiet["lvf"][last]["host_cpu_us_per_token"]
    return out


def print_row(elapsed_s: float, rate: float, executor: str, policy: str, hogged: bool,
              row: dict) -> None:
    moved = f"preemptions {row['preemptions']} (rotations {row['rotations']})"
    if "schedule_us_per_step" in row:  # a persistent kernel's: its phases' GPU time
        moved += (f", {row['decisions']} decisions; a step {row['schedule_us_per_step']:.0f} us "
                  f"scheduling + {row['forward_us_per_step']:.0f} forward")
    print(f"  [{elapsed_s:4.0f} s] rate {rate:5.1f}  {executor:16s} {policy:13s} "
          f"{'hog  ' if hogged else 'quiet'} TTFT {row['ttft_attainment_pct']:5.1f}% TBT "
          f"{row['tbt_attainment_pct']:5.1f}%  |  mean TTFT {row['mean_ttft_ms'] or 0:7.1f} ms, "
          f"TPOT {row['mean_tpot_ms'] or 0:5.2f} ms  |  {moved}  |  host CPU "
          f"{row['host_cpu_us_per_token'] or 0:6.1f} us/token", flush=True)
