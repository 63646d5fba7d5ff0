"""A busy host, on purpose: the CPU hog of the interference experiments (Blink §5).

Blink's claim is that a serving loop the host does not drive keeps its pace when the host's
cores are busy with something else. To test it, ``CpuHog`` starts one busy process per core on
every core but the frontend's (``bench.persistent``, ``bench.slo --real --hog``), each bounded in
time and killed when the measurement ends. ``Cores`` says which core is the frontend's and
which are the others -- a host-driven engine loop runs on those, beside the hog, as the paper's
baselines do -- and ``run_on`` runs a function in a thread pinned to some of them.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from dataclasses import dataclass


def _pinned_hog(cpu: int, deadline: float) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while time.time() < deadline:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


class CpuHog:
    """One busy process per core in ``cpus``, for at most ``seconds``; a context manager."""

    def __init__(self, cpus, seconds: float):
        ctx = multiprocessing.get_context("fork")
        self.procs = [ctx.Process(target=_pinned_hog, args=(cpu, time.time() + seconds), daemon=True)
                      for cpu in cpus]

    def __enter__(self):
        for p in self.procs:
            p.start()
        time.sleep(0.5)  # every hog spinning before the measurement starts
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.join()


@dataclass(frozen=True)
class Cores:
    """This process's cores: the frontend's (the lowest) and every other one."""

    frontend: int
    others: tuple[int, ...]

    @classmethod
    def of_this_process(cls) -> Cores:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise ValueError("a CPU hog beside a frontend needs at least two cores")
        return cls(cpus[0], tuple(cpus[1:]))


def run_on(cpus, fn, *args):
    """``fn(*args)`` in a thread pinned to ``cpus``; its result, or its exception re-raised."""
    outcome = {}

    def target():
        os.sched_setaffinity(threading.get_native_id(), set(cpus))
        try:
            outcome["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=target, name="pinned")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
