"""Is the engine alive? The frontend's answer, from outside: the process and the ring's heartbeat.

Blink §3 and docs/design.md §2: the frontend cannot ask the engine anything (it only shares the ring),
so it watches two signs of life. The engine adds one to the ring's ``engine_heartbeat`` on every
loop iteration (busy or idle); the operating system says whether its process still exists.

    state       meaning                                         GET /health
    starting    heartbeat still 0: the model is loading          503
    ready       heartbeat moved within the last stall_after_s    200
    stalled     process alive, heartbeat frozen (a hung step)    503
    dead        the engine process exited                        503, in-flight requests fail

The server's ``EngineSupervisor`` (``supervisor.py``) then starts another engine on the same,
reset, ring; ``follow`` points the watch at it (``starting`` again) and counts the restart.
Each engine is a *generation*: a request belongs to the one that was running when it was
submitted, and fails if that one is gone, even once the next one is ready.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class EngineWatch:
    def __init__(self, ring, is_alive: Callable[[], bool],
                 stats: Callable[[], dict[str, int] | None] = lambda: None,
                 stall_after_s: float = 10.0, pid: int | None = None):
        self.ring = ring
        self.pid = pid  # the engine's process id, shown by /health
        self.is_alive = is_alive
        self.stats = stats  # the engine's EngineStats as a dict (EngineStatsBoard.read)
        self.stall_after_s = stall_after_s
        self.state = "starting"
        self._beat, self._beat_at = 0, time.monotonic()
        self.generation = 0  # which engine this is: 0, then one more per restart
        self.restarts = 0

    def follow(self, is_alive: Callable[[], bool], pid: int | None) -> None:
        """Watch a newly started engine (after a restart): ``starting`` until its heartbeat."""
        self.is_alive, self.pid = is_alive, pid
        self.state = "starting"
        self._beat, self._beat_at = 0, time.monotonic()
        self.generation += 1
        self.restarts += 1

    def alive_for(self, generation: int) -> bool:
        """Whether the engine of ``generation`` is still the one running, and alive."""
        return self.alive and self.generation == generation

    def refresh(self) -> str:
        """Look again; returns (and stores) the new state. A dead engine stays dead."""
        if self.state == "dead" or not self.is_alive():
            self.state = "dead"
            return self.state
        beat, now = int(self.ring.engine_heartbeat), time.monotonic()
        if beat != self._beat:
            self._beat, self._beat_at = beat, now
        if beat == 0:
            self.state = "starting"
        else:
            self.state = "stalled" if now - self._beat_at > self.stall_after_s else "ready"
        return self.state

    @property
    def alive(self) -> bool:
        return self.state != "dead"

    def kv_blocks(self) -> tuple[int, int] | None:
        """(used, total) KV blocks, or None until the engine has reported them."""
        stats = self.stats()
        if stats is None:
            return None
        return stats["kv_blocks_used"], stats["kv_blocks_used"] + stats["kv_blocks_free"]

    def scheduler_counts(self) -> tuple[int, int] | None:
        """(running, waiting) as the engine's scheduler counts them, or None until reported."""
        stats = self.stats()
        return None if stats is None else (stats["num_running"], stats["num_waiting"])

    def preemptions(self) -> int | None:
        """Requests the engine has preempted so far, or None until reported."""
        stats = self.stats()
        return None if stats is None else stats["num_preemptions"]

    async def run(self, period_s: float = 0.05) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(period_s)
