"""The frontend's side of the ring: submit a request, poll its tokens, cancel it, release its slot.

Blink §3 (the DPU "finds a slot (local cache + circular scan)", writes the prompt into it, and
polls the slot for generated tokens) and docs/design.md §2, §8: ``serve/`` reaches the engine only
through this client. Safe to use from several threads, and from several processes attached to the
same ring: slots are reserved with ``Ring.cas`` (EMPTY -> FILLING), so no two frontends ever
write the same slot.

    slot = client.submit(prompt_ids, params, request_id=7)   # EMPTY -> FILLING -> PREFILL_PENDING
    seen, done = 0, False
    while not done:
        tokens, done, reason = client.poll(slot, seen)        # read `generated`, then the arena
        seen += len(tokens)
    client.release(slot)                                      # DECODE_COMPLETED -> EMPTY
"""

from __future__ import annotations

import time

import numpy as np

from ..config import SamplingParams
from .layout import (DECODE_COMPLETED, EMPTY, FILLING, FINISH_NONE, FINISH_REASONS,
                     PREFILL_PENDING, STATE_NAMES, Ring)


class RingFull(RuntimeError):
    """No slot is EMPTY: the caller should retry later (or answer 503). Never a silent drop."""


class RingClient:
    def __init__(self, ring: Ring):
        self.ring = ring
        self._cursor = 0  # where the next circular scan starts; a hint, so races on it are harmless

    def submit(self, prompt_ids, params: SamplingParams, request_id: int) -> int:
        """Write one request into an EMPTY slot and hand it to the engine; returns the slot.
        ValueError if it does not fit the ring's arenas; RingFull if no slot is EMPTY."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)  # (n,)
        self._validate(prompt, params)
        slot = self._reserve()  # now FILLING: ours alone
        self._write_payload(slot, prompt, params, request_id)
        self.ring.advance(slot, FILLING, PREFILL_PENDING)  # payload first, then the state
        self.ring.ring_doorbell()  # after the state, so a woken engine finds the slot pending
        return slot

    def poll(self, slot: int, seen: int) -> tuple[list[int], bool, str | None]:
        """Tokens published after the first ``seen``, whether the request is finished, and why.
        Published tokens are never rewritten, so polling is a plain read."""
        ring = self.ring
        state = int(ring.state[slot])  # the state first: if finished, every token is published
        if state in (EMPTY, FILLING):
            raise ValueError(f"slot {slot} is {STATE_NAMES[state]}: no request to poll")
        generated = int(ring.generated[slot])  # then the counter, then the arena below it
        tokens = ring.output_tokens[slot, seen:generated].tolist()
        finished = state == DECODE_COMPLETED
        reason = FINISH_REASONS[int(ring.finish_reason[slot])] if finished else None
        return tokens, finished, reason

    def logprobs(self, slot: int, start: int, stop: int) -> list[tuple[float, list]]:
        """Tokens ``start..stop`` (already seen by ``poll``) of a request that asked for
        logprobs: (logprob, [(token, logprob), ...] most likely first) each."""
        ring, k = self.ring, int(self.ring.num_logprobs[slot])
        chosen = ring.output_logprobs[slot, start:stop].tolist()
        ids = ring.output_top_ids[slot, start:stop, :k].tolist()
        values = ring.output_top_logprobs[slot, start:stop, :k].tolist()
        return [(c, list(zip(i, v))) for c, i, v in zip(chosen, ids, values)]

    def cancel(self, slot: int) -> None:
        """Ask the engine to stop this request; it completes the slot with reason "abort"
        (or whatever it finished with, if it finished first)."""
        self.ring.cancel[slot] = 1

    def release(self, slot: int) -> None:
        """Give a finished slot back (DECODE_COMPLETED -> EMPTY), after reading its tokens."""
        if not self.ring.cas(slot, DECODE_COMPLETED, EMPTY):
            state = STATE_NAMES[int(self.ring.state[slot])]
            raise ValueError(f"slot {slot} is {state}; only a DECODE_COMPLETED slot can be "
                             f"released")

    def collect(self, slots, timeout_s: float, poll_interval_s: float = 0.002) -> dict[int, tuple]:
        """Poll until every slot in ``slots`` finished, releasing each as it does; returns
        slot -> (tokens, finish reason). TimeoutError if some are still running after
        ``timeout_s`` (those stay held: cancel them, or collect again)."""
        done, deadline = {}, time.monotonic() + timeout_s
        while len(done) < len(slots):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(slots) - len(done)} request(s) did not finish in "
                                   f"{timeout_s} s")
            for slot in slots:
                if slot not in done:
                    tokens, finished, reason = self.poll(slot, 0)
                    if finished:
                        done[slot] = (tokens, reason)
                        self.release(slot)
            time.sleep(poll_interval_s)
        return done

    def occupancy(self) -> dict[str, int]:
        """How many slots are in each state, by state name."""
        counts = np.bincount(self.ring.state, minlength=len(STATE_NAMES))
        return {name: int(counts[state]) for state, name in STATE_NAMES.items()}

    # --- submit, step by step ----------------------------------------------------------------
    def _validate(self, prompt: np.ndarray, params: SamplingParams) -> None:
        layout = self.ring.layout
        if prompt.ndim != 1 or prompt.size == 0:
            raise ValueError("the prompt must be a non-empty list of token ids")
        if prompt.size > layout.max_prompt_tokens:
            raise ValueError(f"prompt of {prompt.size} tokens is longer than the ring's "
                             f"max_prompt_tokens={layout.max_prompt_tokens}")
        if params.max_tokens > layout.max_output_tokens:
            raise ValueError(f"max_tokens={params.max_tokens} is above the ring's "
                             f"max_output_tokens={layout.max_output_tokens}")
        if len(params.stop_token_ids) > layout.max_stop_ids:
            raise ValueError(f"{len(params.stop_token_ids)} stop token ids; the ring holds at "
                             f"most max_stop_ids={layout.max_stop_ids}")
        if prompt.min() < 0 or prompt.max() >= 2**31:
            raise ValueError("token ids must be in [0, 2**31)")
        if params.seed is not None and not 0 <= params.seed < 2**63:
            raise ValueError(f"seed={params.seed} must be in [0, 2**63)")
        if len(params.logit_bias) > layout.max_logit_bias:
            raise ValueError(f"{len(params.logit_bias)} logit_bias entries; the ring holds at "
                             f"most max_logit_bias={layout.max_logit_bias}")
        if any(token >= 2**31 for token, _ in params.logit_bias):
            raise ValueError("logit_bias token ids must be in [0, 2**31)")
        if params.logprobs is not None and params.logprobs > layout.max_logprobs:
            raise ValueError(f"logprobs={params.logprobs}: this ring holds at most "
                             f"max_logprobs={layout.max_logprobs} per token")

    def _reserve(self) -> int:
        """Claim an EMPTY slot (EMPTY -> FILLING), scanning circularly from the cursor."""
        n = self.ring.layout.num_slots
        empty = np.flatnonzero(self.ring.state == EMPTY)  # (k,) candidates; may go stale
        start = self._cursor
        for slot in np.concatenate([empty[empty >= start], empty[empty < start]]):
            if self.ring.cas(int(slot), EMPTY, FILLING):  # False: another frontend won it
                self._cursor = (int(slot) + 1) % n
                return int(slot)
        raise RingFull(f"all {n} ring slots are in use")

    def _write_payload(self, slot: int, prompt: np.ndarray, params: SamplingParams,
                       request_id: int) -> None:
        ring, n = self.ring, prompt.size
        ring.prompt_tokens[slot, :n] = prompt
        ring.prompt_len[slot] = n
        ring.max_tokens[slot] = params.max_tokens
        ring.temperature[slot] = params.temperature
        ring.top_p[slot] = params.top_p
        ring.top_k[slot] = params.top_k
        ring.seed[slot] = -1 if params.seed is None else params.seed
        ring.stop_ids[slot] = -1
        ring.stop_ids[slot, :len(params.stop_token_ids)] = params.stop_token_ids
        ring.ignore_eos[slot] = int(params.ignore_eos)
        ring.presence_penalty[slot] = params.presence_penalty
        ring.frequency_penalty[slot] = params.frequency_penalty
        ring.logit_bias_ids[slot] = -1
        ring.logit_bias_ids[slot, :len(params.logit_bias)] = [t for t, _ in params.logit_bias]
        ring.logit_bias_values[slot, :len(params.logit_bias)] = [b for _, b in params.logit_bias]
        ring.num_logprobs[slot] = -1 if params.logprobs is None else params.logprobs
        ring.request_id[slot] = request_id
        # The engine's fields start fresh: this slot may have carried another request before.
        ring.cancel[slot] = 0
        ring.generated[slot] = 0
        ring.finish_reason[slot] = FINISH_NONE
        ring.claim_ns[slot] = ring.first_token_ns[slot] = ring.last_token_ns[slot] = 0
        ring.arrival_ns[slot] = time.monotonic_ns()  # CLOCK_MONOTONIC: one clock for all processes
