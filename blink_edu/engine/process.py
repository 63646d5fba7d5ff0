"""The engine's process main: attach the ring by name, load the model, run the scheduler loop.

Blink §3 ("Host loads model + captures CUDA graphs at startup, then exits") and docs/design.md
§2, §8. This is the process standing in for the GPU side: the server's launcher
(``serve/launcher.py``) spawns it with ``multiprocessing``'s *spawn* method (a fresh
interpreter, nothing inherited from the frontend) and hands it only the ring's name, the model
folder and the ``EngineConfig``. From then on it talks to the frontend only through the ring: it
never sees an HTTP request, and the frontend never sees the engine. (vLLM v1 keeps its engine
process's main on the engine side the same way: ``EngineCoreProc.run_engine_core``.)

The ring is the only channel, for control and telemetry too (``ring/control.py``): the frontend
asks the engine to stop through the ring's ``engine_stop`` word, and the engine overwrites the
ring's ``engine_stats`` after every iteration, which the frontend reads for ``/metrics`` and
``/health``.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from dataclasses import replace

from ..config import PERSISTENT_EXECUTORS, resolve_executor
from ..ring.control import EngineStatsBoard, stop_requested
from ..ring.layout import Ring
from ..executors.protocol import RingExecutor


def run_engine(ring_name: str, model_dir: str, engine_config, idle_sleep_s: float = 1e-4,
               max_idle_sleep_s: float = 1e-3) -> None:
    """The engine process's main function (the target of ``multiprocessing.Process``).
    Runs until the ring's ``engine_stop`` word is set or the frontend process is gone. While
    idle it naps ``idle_sleep_s``, doubling up to ``max_idle_sleep_s`` (``RingEngineLoop``)."""
    # Ctrl-C (and `kill` of a process group) reach every process of the group; the frontend
    # decides when we stop, after it has drained its requests. (An orphan stops by itself.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from ..backend import describe  # imported here: this is the only process that runs kernels
    from ..model.tokenizer import stop_ids
    from .llm_engine import LLMEngine
    from .ring_loop import RingEngineLoop

    ring = Ring.attach(ring_name)
    board = EngineStatsBoard(ring)
    eos = stop_ids(model_dir)
    parent = multiprocessing.parent_process()
    try:
        executor = resolve_executor(engine_config.executor, engine_config.policy,
                                    serves_ring=True)
        if executor in PERSISTENT_EXECUTORS:
            run_persistent(ring, model_dir, engine_config, eos, board, parent,
                           dispatch="graph" if executor == "persistent-graph" else "inline")
            return
        engine = LLMEngine(model_dir, replace(engine_config, executor=executor),
                           eos_token_ids=eos)
        print(f"blink_edu.serve engine: executor={engine.executor.name}, {describe()}, "
              f"{engine_config.num_kv_blocks} KV blocks x {engine_config.block_size} tokens, "
              f"max_num_seqs={engine_config.max_num_seqs}", file=sys.stderr, flush=True)
        loop = RingEngineLoop(ring, engine, idle_sleep_s, max_idle_sleep_s)
        while not stop_requested(ring) and parent.is_alive():  # an orphan must not spin on
            worked = loop.run_once()
            board.publish(engine.stats())
            nap = loop.nap.after(worked)
            if nap:
                time.sleep(nap)
    finally:
        ring.close()


def run_persistent(ring, model_dir, engine_config, eos, board, parent, dispatch: str = "inline",
                   poll_s: float = 0.05) -> None:
    """A ``RingExecutor`` (the persistent kernel): launch it over the ring, then only watch.
    This loop makes no CUDA call: it reads the kernel's counters from host memory for the stats
    board and waits for the stop flag. (Stop this process with SIGSTOP and the kernel goes on
    serving: Blink's claim, shown by ``python -m blink_edu.bench.persistent``.)"""
    from ..backend import describe, warn_if_simulated
    from ..model.weights import load_weights
    from .llm_engine import EngineStats, kernel_weight_dtype
    from ..executors.persistent import PersistentExecutor

    weights = load_weights(model_dir)
    warn_if_simulated("persistent", weights.config.num_parameters())
    executor: RingExecutor = PersistentExecutor(
        weights, engine_config, ring, eos_token_ids=eos,
        weight_dtype=kernel_weight_dtype(weights, engine_config), dispatch=dispatch)
    executor.start()
    print(f"blink_edu.serve engine: executor=persistent, {dispatch} dispatch "
          f"({executor.grid_blocks} blocks), "
          f"{describe()}, {engine_config.num_kv_blocks} KV blocks x {engine_config.block_size} "
          f"tokens, max_num_seqs={engine_config.max_num_seqs}, policy={engine_config.policy}",
          file=sys.stderr, flush=True)
    try:
        while not stop_requested(ring) and parent.is_alive() and executor.alive():
            counters = executor.stats()
            board.publish(EngineStats(
                num_running=counters["running"], num_waiting=counters["waiting"],
                kv_blocks_used=executor.num_kv_blocks - counters["free_blocks"],
                kv_blocks_free=counters["free_blocks"], num_steps=counters["steps"],
                num_preemptions=counters["preemptions"]))
            time.sleep(poll_s)
    finally:
        executor.stop()
