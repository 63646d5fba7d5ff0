"""The engine's side of the ring: a host loop standing in for Blink's persistent GPU scheduler.

Blink §3 ("Control loop: scan ring buffer -> claim via atomic CAS -> select/launch CUDA graph ->
poll for completion -> publish tokens") and docs/design.md §2. This is that loop in Python, driving an
``LLMEngine``; the persistent executor (``persistent_kernel.py``) runs the same loop in a GPU
kernel that never returns. One iteration:

    heartbeat += 1
    if doorbell moved:  scan PREFILL_PENDING slots, oldest arrival first;
                        cas -> PREFILL_PROCESSING; engine.add_request(..., request_id=slot)
    for each live slot with its cancel flag up:  engine.abort(slot), complete it with "abort"
    engine.step()  ->  publish each new token (and its logprobs, if asked): arena first, then
                       `generated` (then the state)
    requests rotated out to host memory (DuplexKV)  ->  DECODE_PAUSED, and back

**Idle.** An iteration that finds nothing to do naps before the next (``IdleNap``): 100 µs
at first, doubling while the ring stays quiet, up to 1 ms; any work resets it. A loop that
napped 100 µs forever cost a quarter of a CPU core doing nothing; the longest nap adds at most
1 ms (half of it on average) to the first token of a request that arrives after a quiet spell.
(Blink's persistent kernel spins on the GPU; its host side polls only for statistics.)

The engine uses the slot number as its request id: a slot holds one request at a time. A slot
whose payload is invalid (a token id outside the vocabulary, a size out of range, bad sampling
parameters) is completed at once with finish reason "error"; nothing else is affected.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..config import SamplingParams
from ..ring.layout import (DECODE_COMPLETED, DECODE_PAUSED, DECODE_PROCESSING, FINISH_CODES,
                           PREFILL_PENDING, PREFILL_PROCESSING, Ring)
from .llm_engine import LLMEngine, StepOutput


class IdleNap:
    """Exponential backoff for a polling loop: ``after(worked)`` is how long to nap now --
    0 after an iteration that worked, else ``shortest_s`` doubling on each quiet iteration in a
    row, up to ``longest_s``. ``shortest_s=0``: never nap (spin)."""

    def __init__(self, shortest_s: float = 1e-4, longest_s: float = 1e-3):
        if not 0 <= shortest_s <= longest_s:
            raise ValueError(f"need 0 <= shortest_s <= longest_s, got {shortest_s}, {longest_s}")
        self.shortest_s, self.longest_s = shortest_s, longest_s
        self.next_s = shortest_s

    def after(self, worked: bool) -> float:
        if worked:
            self.next_s = self.shortest_s
            return 0.0
        nap = self.next_s
        self.next_s = min(2 * nap, self.longest_s)
        return nap


class RingEngineLoop:
    def __init__(self, ring: Ring, engine: LLMEngine, idle_sleep_s: float = 1e-4,
                 max_idle_sleep_s: float = 1e-3):
        self.ring = ring
        self.engine = engine
        # how long `run` naps when an iteration found no work: idle_sleep_s at first, doubling
        # up to max_idle_sleep_s while nothing happens
        self.nap = IdleNap(idle_sleep_s, max(idle_sleep_s, max_idle_sleep_s))
        self.live: set[int] = set()  # slots claimed and not yet completed
        self._doorbell_seen = 0

    def run(self, stop_event: threading.Event) -> None:
        """Iterate until ``stop_event`` is set (a GPU kernel would poll a stop flag instead)."""
        while not stop_event.is_set():
            nap = self.nap.after(self.run_once())
            if nap:
                stop_event.wait(nap)

    def run_once(self) -> bool:
        """One iteration of the scheduler loop; True if it did any work."""
        self.ring.engine_heartbeat[...] += 1  # only the engine writes it: no atomic needed
        admitted = self._admit()
        cancelled = self._cancel()
        outputs = self.engine.step() if self.engine.has_unfinished() else []
        for out in outputs:
            self._publish(out)
        if self.engine.scheduler.rotation is not None:
            self._mark_rotated()
        return bool(admitted or cancelled or outputs)

    def _mark_rotated(self) -> None:
        """A request whose KV was rotated out to host memory shows as DECODE_PAUSED (SuperInfer's
        rotary state) until it is back on the GPU."""
        rotated = {seq.request_id for seq in self.engine.scheduler.rotated}
        for slot in self.live:
            state = int(self.ring.state[slot])
            if slot in rotated and state == DECODE_PROCESSING:
                self.ring.advance(slot, DECODE_PROCESSING, DECODE_PAUSED)
            elif slot not in rotated and state == DECODE_PAUSED:
                self.ring.advance(slot, DECODE_PAUSED, DECODE_PROCESSING)

    # --- scan and claim ----------------------------------------------------------------------
    def _admit(self) -> int:
        """Claim every PREFILL_PENDING slot, oldest first, if a frontend rang since last time."""
        doorbell = int(self.ring.doorbell)  # read before scanning: a later ring means a rescan
        if doorbell == self._doorbell_seen:
            return 0
        self._doorbell_seen = doorbell
        pending = np.flatnonzero(self.ring.state == PREFILL_PENDING)  # (k,) slot numbers
        pending = pending[np.argsort(self.ring.arrival_ns[pending], kind="stable")]
        claimed = 0
        for slot in pending.tolist():
            if self.ring.cas(slot, PREFILL_PENDING, PREFILL_PROCESSING):
                self.ring.claim_ns[slot] = time.monotonic_ns()
                self._start(slot)
                claimed += 1
        return claimed

    def _start(self, slot: int) -> None:
        """Hand a claimed slot's request to the engine, or complete it with "error"."""
        try:
            prompt, params = self._read_request(slot)
            self.engine.add_request(prompt, params, request_id=slot)
        except ValueError:  # a bad payload: this slot fails, the loop goes on
            self._complete(slot, "error")
            return
        self.live.add(slot)

    def _read_request(self, slot: int) -> tuple[list[int], SamplingParams]:
        """The request in ``slot``, checked against the ring's sizes (the frontend is not
        trusted: a bad payload must not overrun an arena). ValueError if it is invalid."""
        ring, layout = self.ring, self.ring.layout
        n, max_tokens = int(ring.prompt_len[slot]), int(ring.max_tokens[slot])
        if not 1 <= n <= layout.max_prompt_tokens:
            raise ValueError(f"slot {slot}: prompt_len={n} out of range")
        if not 1 <= max_tokens <= layout.max_output_tokens:
            raise ValueError(f"slot {slot}: max_tokens={max_tokens} out of range")
        seed = int(ring.seed[slot])
        params = SamplingParams(  # raises ValueError for bad values
            temperature=float(ring.temperature[slot]), top_p=float(ring.top_p[slot]),
            top_k=int(ring.top_k[slot]), max_tokens=max_tokens,
            seed=None if seed < 0 else seed,
            stop_token_ids=tuple(int(t) for t in ring.stop_ids[slot] if t >= 0),
            ignore_eos=bool(ring.ignore_eos[slot]),
            presence_penalty=float(ring.presence_penalty[slot]),
            frequency_penalty=float(ring.frequency_penalty[slot]),
            logit_bias=tuple((int(t), float(b)) for t, b in zip(
                ring.logit_bias_ids[slot].tolist(), ring.logit_bias_values[slot].tolist()) if t >= 0),
            logprobs=self._num_logprobs(slot))
        return ring.prompt_tokens[slot, :n].tolist(), params

    def _num_logprobs(self, slot: int) -> int | None:
        k = int(self.ring.num_logprobs[slot])
        if k > self.ring.layout.max_logprobs:
            raise ValueError(f"slot {slot}: num_logprobs={k} above the ring's max_logprobs")
        return None if k < 0 else k

    # --- cancel and publish ------------------------------------------------------------------
    def _cancel(self) -> int:
        """Abort every live request whose frontend raised its cancel flag."""
        cancelled = [slot for slot in self.live if self.ring.cancel[slot]]
        for slot in cancelled:
            self.engine.abort(slot)
            self._complete(slot, "abort")
        return len(cancelled)

    def _publish(self, out: StepOutput) -> None:
        """Make one new token visible: the arena, then the counter, then the state."""
        ring, slot = self.ring, out.request_id
        n = int(ring.generated[slot])
        ring.output_tokens[slot, n] = out.token_id
        if out.logprobs is not None:
            ring.output_logprobs[slot, n] = out.logprobs.logprob
            k = len(out.logprobs.top)
            ring.output_top_ids[slot, n, :k] = [t for t, _ in out.logprobs.top]
            ring.output_top_logprobs[slot, n, :k] = [lp for _, lp in out.logprobs.top]
        now = time.monotonic_ns()
        ring.last_token_ns[slot] = now
        if n == 0:
            ring.first_token_ns[slot] = now
        ring.generated[slot] = n + 1  # the frontend reads up to here: the token is written
        if n == 0:
            ring.advance(slot, PREFILL_PROCESSING, DECODE_PROCESSING)
        if out.finished:
            self._complete(slot, out.finish_reason)

    def _complete(self, slot: int, reason: str) -> None:
        """Finish a slot: the reason first, then the state the frontend polls for."""
        self.live.discard(slot)
        self.ring.finish_reason[slot] = FINISH_CODES[reason]
        self.ring.advance(slot, int(self.ring.state[slot]), DECODE_COMPLETED)  # frontend's now
