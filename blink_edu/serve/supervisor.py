"""The server survives its engine: notice the death, say so loudly, start another engine.

Blink §3 keeps the frontend (the DPU) and the engine (the GPU) apart, sharing only the ring; so
an engine that dies -- killed, out of memory, a crashed kernel -- need not take the server down.
``EngineSupervisor.run`` is a background task of the HTTP app:

    every period_s: is the engine process alive?           (EngineWatch)
    dead ->  log it (ERROR, with the exit code)
             the requests it was running fail at their next poll (their generation is gone):
             an SSE error event for a stream, a 500 for a whole answer; new ones get 503
             wait the backoff: first_delay_s, doubling up to max_delay_s
             reset the ring (every slot EMPTY), forget the cancelled slots, start a new engine
             process on the same ring, and follow it (EngineWatch.follow: /health "starting",
             then "ready"; /metrics blink_edu:engine_restarts_total counts it)
    max_restarts deaths in a row (none after a healthy stretch of healthy_after_s): give up,
             log it (CRITICAL) and stop the server with exit status 3, for a supervisor
             (systemd, Kubernetes) to act on

The ring is reset only after the old engine is gone and after the waits, so no request of the
old generation reads a slot the reset emptied: each one checks that its generation is alive
before every poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .health import EngineWatch

log = logging.getLogger("blink_edu.serve")

GAVE_UP_EXIT_STATUS = 3


class EngineSupervisor:
    def __init__(self, engine, watch: EngineWatch, *, max_restarts: int = 5,
                 first_delay_s: float = 0.5, max_delay_s: float = 8.0,
                 healthy_after_s: float = 30.0, period_s: float = 0.05):
        """``engine``: a ``launcher.EngineProcess`` (``exitcode``, ``reset_ring``,
        ``restart`` -> is_alive, pid)."""
        self.engine, self.watch = engine, watch
        self.max_restarts, self.period_s = max_restarts, period_s
        self.first_delay_s, self.max_delay_s = first_delay_s, max_delay_s
        self.healthy_after_s = healthy_after_s
        self.deaths_in_a_row = 0
        self.gave_up = False
        self.on_give_up: Callable[[], None] = lambda: None  # the server sets: stop serving

    async def run(self, on_reset: Callable[[], None] = lambda: None) -> None:
        """Watch and restart until giving up. ``on_reset``: called when the ring was reset."""
        ready_since = None
        while True:
            state = self.watch.refresh()
            if state == "ready":
                ready_since = ready_since or time.monotonic()
                if time.monotonic() - ready_since >= self.healthy_after_s:
                    self.deaths_in_a_row = 0
            elif state == "dead":
                ready_since = None
                if not await self._restart(on_reset):
                    return
            await asyncio.sleep(self.period_s)

    def backoff_s(self) -> float:
        """The wait before the next restart: doubling with each death in a row."""
        return min(self.first_delay_s * 2 ** (self.deaths_in_a_row - 1), self.max_delay_s)

    async def _restart(self, on_reset: Callable[[], None]) -> bool:
        """One death: log, wait, reset, restart; False (and the server stops) when giving up."""
        self.deaths_in_a_row += 1
        log.error("the engine process %s died (exit code %s); its in-flight requests fail",
                  self.watch.pid, self.engine.exitcode)
        if self.deaths_in_a_row > self.max_restarts:
            log.critical("the engine died %d times in a row: giving up, the server stops",
                         self.deaths_in_a_row)
            self.gave_up = True
            self.on_give_up()
            return False
        delay = self.backoff_s()
        log.warning("restarting the engine in %.1f s (restart %d of at most %d in a row)",
                    delay, self.deaths_in_a_row, self.max_restarts)
        await asyncio.sleep(delay)
        self.engine.reset_ring()
        on_reset()
        is_alive, pid = self.engine.restart()
        self.watch.follow(is_alive, pid)
        log.warning("engine restarted: process %s (restart %d so far)", pid, self.watch.restarts)
        return True
