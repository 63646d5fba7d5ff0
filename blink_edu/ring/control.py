"""The ring's control words: the frontend asks the engine to stop; the engine reports its stats.

Blink §3: the frontend and the engine share nothing but the ring, so control and telemetry ride
on it too (docs/design.md §2). Two words areas, both plain shared memory, so that an engine that
dies cannot leave anything locked:

* ``engine_stop`` -- written by the frontend, read by the engine after every iteration;
* ``engine_stats`` -- written by the engine after every iteration (KV blocks used and free,
  running and waiting requests, steps: ``EngineStatsBoard`` names them), read by the frontend
  for ``/metrics`` and ``/health``.
"""

from __future__ import annotations

from .layout import ENGINE_STATS, Ring


class EngineStatsBoard:
    """The ring's ``engine_stats`` words by name (``EngineStats``): the engine writes, the
    frontend reads. ``published`` = 0 until the engine's first write."""

    def __init__(self, ring: Ring):
        self.ring = ring  # no view kept: a view would stop the ring's shared memory from closing

    def publish(self, stats) -> None:
        values = self.ring.engine_stats  # (len(ENGINE_STATS),) int64
        for i, name in enumerate(ENGINE_STATS[:-1]):
            values[i] = getattr(stats, name)
        values[-1] = 1

    def read(self) -> dict[str, int] | None:
        """The latest stats by name, or None before the engine's first write."""
        snapshot = dict(zip(ENGINE_STATS, self.ring.engine_stats.tolist()))
        return snapshot if snapshot.pop("published") else None


def stop_requested(ring: Ring) -> bool:
    """The engine's side: has the frontend asked us to stop?"""
    return bool(ring.engine_stop)


def request_stop(ring: Ring) -> None:
    """The frontend's side: ask the engine to stop (it finishes its iteration, then exits)."""
    ring.engine_stop[...] = 1
