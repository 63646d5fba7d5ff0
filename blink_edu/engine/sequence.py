"""A sequence: one request's tokens, its progress through the KV cache, and its life cycle.

docs/design.md §2 (the path of a request; Blink §3's slot states); nano-vllm's ``Sequence``.

A sequence holds its prompt and the tokens generated so far. The scheduler moves it between
states, which mirror the ring-buffer slot states of Blink §3:

    WAITING  --admit-->  RUNNING  --stop / max_tokens-->  FINISHED
                          |    ^
                  preempt |    | re-admit (recompute its K/V from its tokens)
                          v    |
                        PREEMPTED   (queued again, at the front: Blink's DECODE_PAUSED)

    RUNNING  --rotate_out-->  ROTATED  --rotate_in-->  RUNNING
                              (SuperInfer's rotary state, also DECODE_PAUSED: its K/V waits in
                               host memory, kv/rotation.py; it resumes without recomputing)

and ``abort`` moves a sequence in any state to FINISHED.

``num_cached_tokens`` counts how many of its tokens already have keys and values in the KV pool.
Everything the model must still see is ``token_ids[num_cached_tokens:]``:

* many tokens left: a prompt (or a prompt chunk, for chunked prefill) — or, after a preemption,
  the prompt *and* the generated tokens, recomputed;
* one token left: a decode step — the last sampled token goes in, the next comes out (or the
  last token of a prompt chunked so that one was left over: the same thing to the model).

A sequence samples a token only in a step that brings its cache up to date (``num_cached_tokens
== num_tokens``); a step that covers only part of its prompt produces nothing.
"""

from __future__ import annotations

import random
import time
from enum import Enum

from ..config import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"  # in the queue, no KV blocks
    RUNNING = "running"  # admitted: owns KV blocks, scheduled every step it fits the budget
    PREEMPTED = "preempted"  # evicted by recompute: back in the queue, blocks freed, tokens kept
    ROTATED = "rotated"  # rotated out: K/V in host memory, GPU blocks freed, tokens kept
    FINISHED = "finished"  # stopped, length-limited or aborted; blocks freed


class Sequence:
    def __init__(self, seq_id: int, prompt_token_ids: list[int], params: SamplingParams,
                 request_id=None, arrival_time: float | None = None):
        self.seq_id = seq_id  # the block manager's key
        self.request_id = seq_id if request_id is None else request_id  # the caller's name for it
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        # The counter-based sampler draws the n-th token from (seed, n): a fresh random seed when
        # the request names none, and the same seed again after a preemption.
        self.seed = params.seed if params.seed is not None else random.getrandbits(32)
        self.status = SequenceStatus.WAITING
        self.num_cached_tokens = 0  # tokens whose K/V are in the pool
        self.num_scheduled_tokens = 0  # tokens this step feeds the model (set by the scheduler)
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.num_preemptions = 0
        self.num_rotations = 0  # times rotated out
        # Timestamps (time.monotonic seconds) for latency metrics: TTFT, TBT.
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.run_start_time: float | None = None  # when it last became RUNNING (for VLT)
        self.token_times: list[float] = []  # one per generated token

    # --- sizes --------------------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def token_ids(self) -> list[int]:
        """Prompt then generated tokens."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncached_tokens(self) -> int:
        """Tokens the model has not seen yet: 1 while decoding, more while (re)filling the cache."""
        return self.num_tokens - self.num_cached_tokens

    @property
    def is_decoding(self) -> bool:
        return self.num_uncached_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    # --- changes ------------------------------------------------------------------------------
    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, cached={self.num_cached_tokens})")
