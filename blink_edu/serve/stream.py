"""One request's life in the frontend: write it into the ring, poll its slot, stream its text.

Blink §3, the DPU's half of the request lifecycle: "find slot -> write prompt into the slot ->
(the GPU runs it) -> poll results -> detokenize -> SSE", and docs/design.md §2. The frontend never
calls the engine: it writes a slot and then watches it, exactly as the paper's DPU reads GPU
memory over RDMA. Here the "RDMA read" is a NumPy read of shared memory, repeated every
``poll_interval_s`` with an ``await asyncio.sleep`` in between so one event loop can watch
hundreds of requests at once.

    slot = client.submit(prompt_ids, params, request_id)
    loop:  tokens, finished, reason = client.poll(slot, seen)
           text = stop_matcher.feed(detokenizer.push(token))     # per token, incrementally
           yield text
    client.release(slot)                                          # DECODE_COMPLETED -> EMPTY

Two ways a request ends early, and both must still free its slot: a *stop string* appears in
the text (the engine only knows token ids, so the frontend finds it and cancels the slot), or
the *client goes away* (the HTTP task is cancelled mid-``await``). A cancelled slot is not
EMPTY yet — the engine still owns it until it writes DECODE_COMPLETED — so it is handed to the
``SlotReaper``, which releases it once the engine lets go (and the engine frees its KV blocks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from ..config import SamplingParams
from ..model.tokenizer import StopStringMatcher, Tokenizer
from ..ring.client import RingClient
from .metrics import ServeMetrics


class EngineFailed(RuntimeError):
    """The engine died, or finished this request with an error: the client gets a 5xx/error."""


class SlotReaper:
    """Releases slots whose request the frontend gave up on (cancelled) once the engine has
    completed them (it frees the request's KV blocks then). One background task sweeps it."""

    def __init__(self, client: RingClient):
        self.client = client
        self.slots: set[int] = set()  # cancelled, not yet DECODE_COMPLETED

    def add(self, slot: int) -> None:
        self.client.cancel(slot)
        self.slots.add(slot)

    def forget_all(self) -> None:
        """The engine died and the ring was reset: nothing is left to release."""
        self.slots.clear()

    def sweep(self) -> None:
        for slot in list(self.slots):
            _, finished, _ = self.client.poll(slot, seen=0)
            if finished:
                self.client.release(slot)
                self.slots.discard(slot)

    async def run(self, period_s: float = 0.005) -> None:
        while True:
            self.sweep()
            await asyncio.sleep(period_s)


class RequestStream:
    """Submit one request and stream its text. Iterate ``text()`` for the pieces; afterwards
    ``finish_reason`` ("stop" | "length") and ``completion_tokens`` hold the outcome.

    ``engine_alive``: checked between polls, so a dead engine ends the stream with
    ``EngineFailed`` instead of a wait that never ends. ``metrics``: gets the request's timings.
    """

    def __init__(self, client: RingClient, tokenizer: Tokenizer, prompt_ids: list[int],
                 params: SamplingParams, stop: list[str], request_id: int, *,
                 reaper: SlotReaper, engine_alive: Callable[[], bool], metrics: ServeMetrics,
                 poll_interval_s: float = 0.001):
        self.client = client
        self.prompt_ids = prompt_ids
        self.params = params
        self.request_id = request_id
        self.reaper = reaper
        self.engine_alive = engine_alive
        self.metrics = metrics
        self.poll_interval_s = poll_interval_s
        self._detok = tokenizer.detokenizer(prompt_ids)
        self._stop = StopStringMatcher(stop) if stop else None
        self.slot: int | None = None
        self.finish_reason: str | None = None
        self.completion_tokens = 0  # tokens consumed: up to the one that completed a stop string
        # (token, logprob, [(token, logprob), ...]) of each consumed token not yet taken, when
        # the request asked for logprobs (take_logprobs)
        self._logprobs: list[tuple[int, float, list]] = []

    def submit(self) -> None:
        """Write the request into the ring (ValueError / RingFull from the client pass through)."""
        self._start = time.perf_counter()
        self.slot = self.client.submit(self.prompt_ids, self.params, self.request_id)

    async def text(self) -> AsyncIterator[str]:
        """The generated text, one piece per poll that brought tokens ("" pieces are skipped)."""
        seen, last = 0, self._start
        outcome = "abort"  # what is recorded if the generator is closed early: the client left
        try:
            while True:
                if not self.engine_alive():  # first: a restart resets the ring's slots
                    outcome = "error"
                    raise EngineFailed("the engine process stopped while generating")
                tokens, finished, reason = self.client.poll(self.slot, seen)
                if tokens:
                    now = time.perf_counter()
                    self._observe(seen, len(tokens), now - last)
                    consumed_before = self.completion_tokens
                    piece, stopped = self._consume(tokens)
                    self._keep_logprobs(tokens[:self.completion_tokens - consumed_before], seen)
                    seen, last = seen + len(tokens), now
                    if piece:
                        yield piece
                    if stopped:  # a stop string: the finally below cancels the slot
                        outcome = self.finish_reason = "stop"
                        return
                if finished:
                    self._release()
                    if reason not in ("stop", "length"):  # "error", or an "abort" not ours
                        outcome = "error"
                        raise EngineFailed(f"the engine ended the request with {reason!r}")
                    outcome = self.finish_reason = reason
                    tail = self._flush()
                    if tail:
                        yield tail
                    return
                await asyncio.sleep(self.poll_interval_s)
        finally:
            self._let_go(outcome)

    def take_logprobs(self) -> list[tuple[int, float, list]]:
        """The logprobs of the tokens consumed since the last call (empty without logprobs)."""
        taken, self._logprobs = self._logprobs, []
        return taken

    # --- steps -------------------------------------------------------------------------------
    def _keep_logprobs(self, tokens: list[int], first: int) -> None:
        if self.params.logprobs is None or not tokens:
            return
        entries = self.client.logprobs(self.slot, first, first + len(tokens))
        self._logprobs += [(t, lp, top) for t, (lp, top) in zip(tokens, entries)]

    def _consume(self, tokens: list[int]) -> tuple[str, bool]:
        """Detokenize new ids one by one, cutting at a stop string; (text, stopped)."""
        pieces = []
        for token in tokens:
            self.completion_tokens += 1
            text = self._detok.push(token)
            if self._stop is None:
                pieces.append(text)
                continue
            text, stopped = self._stop.feed(text)
            pieces.append(text)
            if stopped:
                return "".join(pieces), True
        return "".join(pieces), False

    def _flush(self) -> str:
        """End of stream: what the detokenizer and the stop matcher still hold back."""
        text = self._detok.flush()
        if self._stop is None:
            return text
        text, stopped = self._stop.feed(text)
        return text if stopped else text + self._stop.flush()

    def _observe(self, seen: int, count: int, elapsed_s: float) -> None:
        if seen == 0:
            self.metrics.time_to_first_token.observe(elapsed_s)
            count, elapsed_s = count - 1, 0.0  # the rest of this batch came with the first
        for _ in range(count):
            self.metrics.inter_token_latency.observe(elapsed_s / max(count, 1))

    def _release(self) -> None:
        self.client.release(self.slot)  # DECODE_COMPLETED -> EMPTY: the slot is free again
        self.slot = None

    def _let_go(self, outcome: str) -> None:
        """Record the outcome; a slot still held is cancelled and left to the reaper (unless
        the engine is dead: then nobody will ever complete it)."""
        if self.slot is not None and self.engine_alive():
            self.reaper.add(self.slot)
        self.slot = None
        self.metrics.request_finished(outcome, time.perf_counter() - self._start,
                                      len(self.prompt_ids), self.completion_tokens)
