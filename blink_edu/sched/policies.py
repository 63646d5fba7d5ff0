"""Scheduling policies: who runs this step, who waits, who is rotated out — from plain numbers.

SuperInfer §3 (RotaSched: the rotary state, Virtual Lag Time, Largest-VLT-First) and its
baselines (§2 and §5: FCFS with passive preemption by recompute as in vLLM v1; the static offload
policies Waiting-First and Swapped-First, the latter being vLLM v0's); docs/design.md §6 and §8
("sched/ policies decide from plain numbers; they never call an executor").

The interface
-------------
Every step the caller (the engine's ``Scheduler``, or ``blink_edu.sim``) describes its requests
as plain numbers and asks the policy what to do::

    view = StepView(now=t, free_blocks=bm.num_free, requests=[RequestView(...), ...],
                    max_num_seqs=64)
    decision = policy.decide(view)
    # decision.preempt_rotary     running -> rotary: free its GPU blocks, keep its KV on the host
    # decision.preempt_recompute  running -> waiting: free its GPU blocks, recompute it later
    # decision.admit              waiting / rotary -> running, in this order (rotary ones are
    #                             swapped in first); every admitted request is promised
    #                             ``blocks_to_run`` blocks
    # everything else keeps its state.

``view.requests`` must be listed in the caller's FCFS order: running requests in order of
admission, then the waiting queue front to back (a request preempted by recompute goes to the
front, as in vLLM v1), then rotary requests in the order they were rotated out. FCFS-like
policies follow that order; LVF breaks VLT ties with it.

**How often.** The paper decides every iteration (``decision_interval=1``, the default). A
caller that wants fewer decisions counts its iterations and calls ``decide`` only where
``policy.decides_at(step, num_running)``, and ``policy.hold(view)`` on the steps between: the batch stands,
nobody is admitted, the newest running requests are preempted only if the others cannot grow.
SuperInfer's policy is a sliver of its ~20 ms iteration; with our 1.5 ms step on the GPU,
describing and ranking every request costs a fifth of the step, so ``bench.slo --real`` has the
simulator choose an interval (docs/design.md §6; ``bench/slo_plan.py``).

The promise a policy keeps (``check_decision`` verifies it; the simulator calls it every step):
after its preemptions, the free blocks cover every admitted request's ``blocks_to_run`` plus the
growth (``blocks_to_run``) of every running request that was not preempted; no request is both
admitted and preempted; at most ``max_num_seqs`` requests run.

Intended wiring into ``blink_edu.engine.scheduler.Scheduler.schedule`` (the lead's part): before
``_schedule_decodes``, build one ``RequestView`` per live ``Sequence`` (``state``
from its status — RUNNING, WAITING/PREEMPTED -> WAITING, a new ROTATED status -> ROTARY;
``t_run`` the time it was last admitted; ``t_last`` its last ``token_times`` entry;
``blocks_held`` its block-table length; ``blocks_to_run`` = ``block_manager.blocks_to_grow``
for its next chunk), call ``decide``, apply the preemptions (``_preempt`` for recompute, the
DuplexKV rotation engine for rotary), move the admitted sequences into ``running`` in the given
order (swapping rotary ones in), then let the existing token-budget code split prompts into chunks.
The policy never touches the block manager, the KV pool or an executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from .vlt import ROTARY, RUNNING, STATE_NAMES, WAITING, RotaSchedConfig, vlt_numpy


class RequestView(NamedTuple):
    """One live request as a policy sees it (plain numbers; times in seconds). A NamedTuple: the
    engine builds one per live request every step, and a tuple is built several times faster
    than a frozen dataclass."""

    request_id: int
    state: int  # WAITING | RUNNING | ROTARY
    arrival_time: float  # t_arr
    run_start_time: float = float("nan")  # t_run: when it last entered RUNNING
    last_token_time: float = float("nan")  # t_last; a request with no token yet: its arrival
    blocks_held: int = 0  # GPU KV blocks it owns now (0 unless RUNNING)
    blocks_to_run: int = 0  # running: more blocks it needs this step (growth, usually 0 or 1);
    #                         waiting / rotary: GPU blocks it needs to be admitted
    blocks_on_host: int = 0  # rotary: blocks to swap in on admission (transfer volume)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]


@dataclass(frozen=True)
class StepView:
    """Everything a policy may look at for one step."""

    now: float
    free_blocks: int  # free GPU KV blocks before this step's decisions
    requests: Sequence[RequestView]  # in the caller's FCFS order (see the module docstring)
    max_num_seqs: int = 1 << 30  # most requests that may run at once

    def in_state(self, state: int) -> list[RequestView]:
        return [r for r in self.requests if r.state == state]


@dataclass
class Decision:
    """What to change this step (request ids); everything not named keeps its state."""

    admit: list[int] = field(default_factory=list)  # waiting/rotary -> running, in this order
    preempt_rotary: list[int] = field(default_factory=list)  # running -> rotary (KV to host)
    preempt_recompute: list[int] = field(default_factory=list)  # running -> waiting (KV dropped)
    fcfs_fallback: bool = False  # LVF only: memory sufficed, plain FCFS was used
    vlt: dict[int, float] | None = None  # LVF only: the VLT it sorted by, per request id

    @property
    def preempted(self) -> list[int]:
        return self.preempt_rotary + self.preempt_recompute


def view_vlt(view: StepView, config: RotaSchedConfig) -> np.ndarray:
    """(N,) VLT of ``view.requests`` at ``view.now``. A request with no token yet lags from its
    arrival when it is rotary (its ``last_token_time`` is taken to be its arrival)."""
    # (N, 4): state, t_arr, t_run, t_last -- one conversion from the views' tuples
    table = np.array([(r.state, r.arrival_time, r.run_start_time, r.last_token_time)
                      for r in view.requests], dtype=np.float64).reshape(-1, 4)
    state, t_arr, t_run, t_last = table.T  # (N,) each
    t_last = np.where(np.isnan(t_last), t_arr, t_last)
    return vlt_numpy(state.astype(np.int8), view.now, t_arr, t_run, t_last, config)


class PolicyError(AssertionError):
    """A decision broke the policy contract (see ``check_decision``)."""


def check_decision(view: StepView, decision: Decision) -> None:
    """Raise PolicyError unless ``decision`` keeps the promise of the module docstring."""
    by_id = {r.request_id: r for r in view.requests}
    admitted, preempted = decision.admit, decision.preempted
    if len(set(admitted)) != len(admitted) or len(set(preempted)) != len(preempted):
        raise PolicyError(f"a request is named twice: {decision}")
    if set(admitted) & set(preempted):
        raise PolicyError(f"admitted and preempted at once: {set(admitted) & set(preempted)}")
    for rid in admitted:
        if by_id[rid].state == RUNNING:
            raise PolicyError(f"request {rid} is already running")
    for rid in preempted:
        if by_id[rid].state != RUNNING:
            raise PolicyError(f"request {rid} is not running, it cannot be preempted")
    staying = [r for r in view.in_state(RUNNING) if r.request_id not in set(preempted)]
    free = view.free_blocks + sum(by_id[rid].blocks_held for rid in preempted)
    used = sum(r.blocks_to_run for r in staying) + sum(by_id[rid].blocks_to_run for rid in admitted)
    if used > free:
        raise PolicyError(f"over budget: {used} blocks needed, {free} free after preemption")
    if len(staying) + len(admitted) > view.max_num_seqs:
        raise PolicyError(f"{len(staying) + len(admitted)} running > max_num_seqs={view.max_num_seqs}")


class Policy:
    """Base class: ``decide(view) -> Decision``. Policies keep no state between steps."""

    name = "policy"
    preemption = "recompute"  # "recompute" or "rotary": what happens to a preempted request
    # The engine describes every live request to this policy on the steps it decides
    # (engine/policy_step.py), host work the simulator charges (CostModel.per_decision_s).
    # FCFS is the engine scheduler's own rules: nothing to describe.
    described = True

    def decides_at(self, step: int, num_running: int) -> bool:
        """Whether the policy decides at ``step`` (the caller's count of iterations, from 0)
        with ``num_running`` requests running: every ``config.decision_interval``-th step, and
        whenever nothing runs (held, such a step would run nothing). The caller calls ``hold``
        on the other steps."""
        return step % self.config.decision_interval == 0 or num_running == 0

    def hold(self, view: StepView) -> Decision:
        """A step between two decisions: the batch stands. Nobody is admitted; if the running
        requests' growth does not fit, the newest are preempted (the engine scheduler's own
        passive preemption, which it applies without asking the policy)."""
        _, preempted, _ = self._preempt_for_growth(view)
        return self._decision([], preempted)

    def __init__(self, config: RotaSchedConfig = RotaSchedConfig()):
        self.config = config

    def decide(self, view: StepView) -> Decision:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"

    # --- shared building blocks -------------------------------------------------------------

    def _preempt_for_growth(self, view: StepView) -> tuple[list[RequestView], list[int], int]:
        """Passive preemption (vLLM): while the running requests' growth does not fit the free
        blocks, preempt the most recently admitted. Returns (still running, preempted ids,
        blocks left free after their growth)."""
        running = view.in_state(RUNNING)
        free = view.free_blocks
        growth = sum(r.blocks_to_run for r in running)
        preempted = []
        while growth > free and running:
            victim = running.pop()
            preempted.append(victim.request_id)
            free += victim.blocks_held
            growth -= victim.blocks_to_run
        return running, preempted, free - growth

    def _admit_in_order(self, queue: list[RequestView], free: int, seats: int,
                        transfer_left: int | None = None) -> list[int]:
        """Admit from the front of ``queue`` while blocks, seats (and swap-in budget) last;
        stop at the first that does not fit (no overtaking: nobody starves). The first request
        of a step may exceed the swap-in budget on its own: a rotary request with more KV than
        B_xfer would otherwise never come back (and, at the front of the queue, block everyone)."""
        admitted = []
        for r in queue:
            swap_in = r.blocks_on_host if r.state == ROTARY else 0
            if seats <= 0 or r.blocks_to_run > free:
                break
            if transfer_left is not None and swap_in > transfer_left and admitted:
                break
            admitted.append(r.request_id)
            free -= r.blocks_to_run
            seats -= 1
            if transfer_left is not None:
                transfer_left = max(0, transfer_left - swap_in)
        return admitted

    def _decision(self, admit: list[int], preempted: list[int], **extra) -> Decision:
        if self.preemption == "rotary":
            return Decision(admit=admit, preempt_rotary=preempted, **extra)
        return Decision(admit=admit, preempt_recompute=preempted, **extra)


class FCFS(Policy):
    """vLLM v1: FCFS admission, passive preemption *by recompute* of the newest running request
    when the running ones cannot grow; a step that preempted admits nobody."""

    name = "fcfs"
    preemption = "recompute"
    described = False

    def decides_at(self, step: int, num_running: int) -> bool:
        return True  # vLLM v1's rules are cheap: they run every step, whatever the interval

    def decide(self, view: StepView) -> Decision:
        running, preempted, free = self._preempt_for_growth(view)
        admit = []
        if not preempted:
            queue = [r for r in view.requests if r.state != RUNNING]
            admit = self._admit_in_order(queue, free, view.max_num_seqs - len(running))
        return self._decision(admit, preempted)


class _StaticOffload(Policy):
    """Passive preemption *by swapping* (running -> rotary) and a fixed priority between the
    waiting and the rotary queue; swap-ins limited by the transfer budget."""

    preemption = "rotary"
    first_state = WAITING

    def decide(self, view: StepView) -> Decision:
        running, preempted, free = self._preempt_for_growth(view)
        admit = []
        if not preempted:  # as vLLM v0: a step that had to preempt brings nobody in
            second = ROTARY if self.first_state == WAITING else WAITING
            queue = view.in_state(self.first_state) + view.in_state(second)
            admit = self._admit_in_order(queue, free, view.max_num_seqs - len(running),
                                         transfer_left=self.config.transfer_budget_blocks)
        return self._decision(admit, preempted)


class WaitingFirst(_StaticOffload):
    """New (waiting) requests before rotary ones: good TTFT, the rotated-out ones starve (TBT)."""

    name = "waiting-first"
    first_state = WAITING


class SwappedFirst(_StaticOffload):
    """vLLM v0: rotary (swapped) requests come back before any new one is admitted: good TBT,
    FCFS-like TTFT."""

    name = "swapped-first"
    first_state = ROTARY


class LVF(Policy):
    """Largest-VLT-First (SuperInfer §3, RotaSched).

    If the free blocks cover every waiting and rotary request (and the running ones' growth):
    plain FCFS, admit them all. Otherwise sort every live request by VLT, largest first; admit
    waiting/rotary requests from the head while the blocks last — free blocks plus the transfer
    budget, the blocks that rotating running requests out may free this iteration — and preempt
    running requests from the tail (most negative VLT = running the longest) into the rotary
    state until the admitted fit.
    """

    name = "lvf"
    preemption = "rotary"

    def vlt(self, view: StepView) -> np.ndarray:
        return view_vlt(view, self.config)

    def decide(self, view: StepView) -> Decision:
        running = view.in_state(RUNNING)
        candidates = [r for r in view.requests if r.state != RUNNING]
        growth = sum(r.blocks_to_run for r in running)
        seats = view.max_num_seqs - len(running)
        if (sum(r.blocks_to_run for r in candidates) + growth <= view.free_blocks
                and len(candidates) <= seats):
            return self._decision([r.request_id for r in candidates], [], fcfs_fallback=True)

        vlt = self.vlt(view)  # (N,)
        vlt_by_id = dict(zip([r.request_id for r in view.requests], vlt.tolist()))
        order = np.argsort(-vlt, kind="stable")  # (N,) head = largest lag; ties keep FCFS order
        ranked = [view.requests[i] for i in order]
        tail_first = [r for r in reversed(ranked) if r.state == RUNNING]  # preemption order

        # Admit from the head: capacity = free + what rotation may free, less the growth of
        # the running requests (those that stay need it; a preempted one gives it back).
        capacity = view.free_blocks + self.config.transfer_budget_blocks - growth
        preemptable = sum(r.blocks_held + r.blocks_to_run for r in running)
        capacity = min(capacity, view.free_blocks - growth + preemptable)
        admitted: list[RequestView] = []
        for r in ranked:
            if r.state == RUNNING:
                continue
            if r.blocks_to_run > capacity:
                break
            admitted.append(r)
            capacity -= r.blocks_to_run

        # Preempt from the tail until the admitted fit and the seats suffice.
        deficit = sum(r.blocks_to_run for r in admitted) + growth - view.free_blocks
        preempted: list[RequestView] = []
        for victim in tail_first:
            if deficit <= 0 and len(running) - len(preempted) + len(admitted) <= view.max_num_seqs:
                break
            preempted.append(victim)
            deficit -= victim.blocks_held + victim.blocks_to_run
        # Seats: if even preempting every running request leaves too many, admit fewer.
        while len(running) - len(preempted) + len(admitted) > view.max_num_seqs:
            admitted.pop()
        return self._decision([r.request_id for r in admitted],
                              [r.request_id for r in preempted], vlt=vlt_by_id)


POLICIES: dict[str, Callable[[RotaSchedConfig], Policy]] = {
    "lvf": LVF,
    "fcfs": FCFS,
    "waiting-first": WaitingFirst,
    "swapped-first": SwappedFirst,
}


def make_policy(name: str, config: RotaSchedConfig | None = None) -> Policy:
    """The policy called ``name`` (one of ``POLICIES``) with ``config`` (defaults: docs/design.md §6)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r}; choose one of "
                         f"{', '.join(POLICIES)}") from None
    return cls(config or RotaSchedConfig())
