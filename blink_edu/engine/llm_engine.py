"""The engine: requests in, one step at a time, tokens out.

docs/design.md §2 (the eager/graph executors' host loop: "a Python loop launches every kernel of every
step"); nano-vllm's ``LLMEngine``. This host-driven loop is exactly what Blink takes off the CPU:

    while engine.has_unfinished():
        batch, seqs = scheduler.schedule()     # host: decide who runs (Python)
        tokens = executor.step(batch)          # device: one forward over the flat batch + sampling
        scheduler.postprocess(seqs, tokens)    # host: append, stop, free blocks

Every token of every request goes through this Python code. Blink's persistent kernel runs the
same three lines on the GPU instead, polling a ring buffer for requests.

The executor owns the KV pool and runs the model; the scheduler owns the block tables. They meet
only in the ``StepBatch`` (``step.py``), so executors are interchangeable.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..backend import warn_if_simulated
from ..config import PERSISTENT_EXECUTORS, EngineConfig, SamplingParams, resolve_executor
from ..kv.rotation import make_rotation_engine
from ..model.sampling import TokenLogprobs, token_logprobs
from ..model.weights import ModelWeights, load_weights
from ..executors.protocol import Executor
from ..executors.reference_executor import ReferenceExecutor
from .scheduler import Scheduler
from .sequence import Sequence


def kernel_weight_dtype(weights: ModelWeights, engine_config: EngineConfig):
    """float16 or float32 for the kernels' weights; ``auto`` keeps the checkpoint's precision
    (bfloat16 becomes float16: the kernels have no bfloat16)."""
    choice = engine_config.weight_dtype
    if choice == "auto":
        choice = "float16" if weights.config.torch_dtype in ("float16", "bfloat16") else "float32"
    return np.dtype(choice)


def make_scheduling_policy(name: str):
    """None for "fcfs" (the scheduler's built-in FCFS), else the sched/ policy object."""
    if name == "fcfs":
        return None
    from ..sched.policies import make_policy

    return make_policy(name)


def make_executor(name: str, weights: ModelWeights, engine_config: EngineConfig) -> Executor:
    """Build the host-driven executor called ``name`` (``EngineConfig.executor``; ``auto`` as
    ``config.resolve_executor`` decides). Each owns a KV pool of ``engine_config.num_kv_blocks``
    blocks and is an ``Executor`` (``executor.py``)."""
    name = resolve_executor(name, engine_config.policy)
    if name == "reference":
        return ReferenceExecutor(weights, engine_config.num_kv_blocks, engine_config.block_size)
    if name in ("eager", "graph"):
        from ..executors.kernel_executor import EagerExecutor, GraphExecutor

        warn_if_simulated(name, weights.config.num_parameters())
        cls = EagerExecutor if name == "eager" else GraphExecutor
        return cls(weights, engine_config, weight_dtype=kernel_weight_dtype(weights, engine_config))
    if name in PERSISTENT_EXECUTORS:
        raise ValueError(f"the {name} executor owns the serving loop on the GPU and serves a "
                         f"ring, not LLMEngine.step(): use python -m blink_edu.serve --executor "
                         f"{name}, or engine.persistent.PersistentExecutor with a Ring")
    raise ValueError(f"unknown executor {name!r}; choose reference, eager or graph")


class StepOutput(NamedTuple):
    """One new token of one request."""

    request_id: object
    token_id: int
    finished: bool
    finish_reason: str | None  # "stop" | "length" once finished
    logprobs: TokenLogprobs | None = None  # when the request asked for them (params.logprobs)


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    num_steps: int
    num_preemptions: int
    num_rotated: int = 0  # requests whose KV is in host memory now (preemption="rotate")
    host_kv_blocks_used: int = 0


class LLMEngine:
    def __init__(self, weights_or_folder: ModelWeights | str | Path,
                 engine_config: EngineConfig | None = None, executor: Executor | None = None,
                 eos_token_ids: tuple[int, ...] | None = None, scheduler: Scheduler | None = None):
        """``executor``: an already built executor (same num_kv_blocks and block_size as the
        config) instead of ``make_executor(engine_config.executor, ...)``. ``eos_token_ids``:
        the ids that end a request unless it sets ``ignore_eos``; default: the model config's.
        ``scheduler``: an already built ``Scheduler`` of the same config (a subclass with its own
        ``schedule``, say) instead of a new one; with ``preemption="rotate"`` it gets the
        engine's rotation engine unless one is attached to it already."""
        self.weights = (weights_or_folder if isinstance(weights_or_folder, ModelWeights)
                        else load_weights(weights_or_folder))
        model = self.weights.config
        self.config = engine_config or EngineConfig()
        self.max_model_len = self.config.max_model_len_for(model)
        self.executor = (executor if executor is not None
                         else make_executor(self.config.executor, self.weights, self.config))
        eos = model.eos_token_ids if eos_token_ids is None else eos_token_ids
        self.scheduler = (scheduler if scheduler is not None else
                          Scheduler(self.config, self.max_model_len, eos,
                                    policy=make_scheduling_policy(self.config.policy)))
        if self.config.preemption == "rotate" and self.scheduler.rotation is None:
            self.scheduler.attach_rotation(self.make_rotation_engine())
        self.requests: dict[object, Sequence] = {}  # unfinished requests by request id
        self._next_seq_id = itertools.count()
        self.num_steps = 0

    def make_rotation_engine(self, eager: bool = True, delay: int = 0):
        """DuplexKV over the executor's KV pool and the scheduler's block manager
        (``kv/rotation.py``); ``delay``: copies land that many steps late (NumPy pool only)."""
        host_blocks = self.config.num_host_kv_blocks or 2 * self.config.num_kv_blocks
        return make_rotation_engine(self.scheduler.block_manager, self.executor.kv_pool,
                                    host_blocks, compute_stream=self.executor.compute_stream,
                                    eager=eager, delay=delay, transport=self.config.kv_transport)

    def add_request(self, prompt_token_ids, params: SamplingParams | None = None,
                    request_id=None, arrival_time: float | None = None):
        """Queue a request; returns its id (``request_id``, or a fresh integer). ValueError for a
        request that is malformed or could never fit. ``arrival_time``: when it arrived, in
        ``time.monotonic`` seconds (default: now), if it waited before reaching the engine --
        a RotaSched policy's VLT counts a waiting request's lag from it."""
        params = params or SamplingParams()
        seq_id = next(self._next_seq_id)
        request_id = seq_id if request_id is None else request_id
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        vocab = self.weights.config.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {request_id!r}: token id(s) {bad[:5]} outside the "
                             f"vocabulary [0, {vocab})")
        bad = [t for t, _ in params.logit_bias if t >= vocab]
        if bad:
            raise ValueError(f"request {request_id!r}: logit_bias names token id(s) {bad[:5]} "
                             f"outside the vocabulary [0, {vocab})")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if arrival_time is not None and not math.isfinite(arrival_time):
            raise ValueError(f"request {request_id!r}: arrival_time must be a finite "
                             f"time.monotonic() reading, not {arrival_time!r}")
        seq = Sequence(seq_id, prompt, params, request_id, arrival_time)
        self.scheduler.add(seq)
        self.requests[seq.request_id] = seq
        return seq.request_id

    def step(self) -> list[StepOutput]:
        """Run one step; the new tokens, one per request that produced one."""
        batch, scheduled = self.scheduler.schedule()
        if batch is None:
            return []
        sampled = self.executor.step(batch)  # (S,) int32
        logprobs = self._logprobs(batch, scheduled, sampled)
        produced = self.scheduler.postprocess(scheduled, sampled, now=time.monotonic())
        self.num_steps += 1
        if self.scheduler.rotation is not None and not self.has_unfinished():
            self.scheduler.rotation.wait_all()  # idle: let the last copies land
        for seq in produced:
            if seq.is_finished:
                del self.requests[seq.request_id]
        return [StepOutput(s.request_id, s.output_token_ids[-1], s.is_finished, s.finish_reason,
                           logprobs.get(s.seq_id)) for s in produced]

    def _logprobs(self, batch, scheduled: list[Sequence],
                  sampled: np.ndarray) -> dict[int, TokenLogprobs]:
        """seq_id -> the sampled token's log-probabilities, for the rows that asked; from the
        logits the executor kept (``StepBatch.num_logprobs``)."""
        if batch.num_logprobs is None:
            return {}
        logits = self.executor.logits_out  # (S, V)
        return {seq.seq_id: token_logprobs(logits[row], int(sampled[row]), int(n))
                for row, (seq, n) in enumerate(zip(scheduled, batch.num_logprobs.tolist()))
                if n >= 0}

    def abort(self, request_id) -> bool:
        """Cancel an unfinished request and free its blocks; False if there is no such request."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        blocks, rotation = self.scheduler.block_manager, self.scheduler.rotation
        return EngineStats(num_running=len(self.scheduler.running),
                           num_waiting=len(self.scheduler.waiting),
                           kv_blocks_used=blocks.num_blocks - blocks.num_free,
                           kv_blocks_free=blocks.num_free, num_steps=self.num_steps,
                           num_preemptions=self.scheduler.num_preemptions,
                           num_rotated=len(self.scheduler.rotated),
                           host_kv_blocks_used=rotation.host.num_used if rotation else 0)
