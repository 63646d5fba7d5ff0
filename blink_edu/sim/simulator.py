"""A discrete-event simulator that runs the scheduling policies of ``blink_edu.sched`` against a
cost model instead of a GPU.

docs/design.md §8 ("sim/: runs sched/ policies against a cost model") and SuperInfer §3–§5: the same
policy objects that the engine calls decide every iteration from the same plain numbers
(``StepView``); the simulator only replaces the forward pass and the copies by their cost.

The events are request arrivals and step completions. One iteration:

1. requests that arrived by ``now`` join the waiting queue (FCFS order);
2. the policy decides (``Policy.decide``) and the decision is checked (``check_decision``);
3. preemptions: *recompute* drops a request's KV (it re-enters the front of the waiting queue and
   will prefill prompt + generated tokens again); *rotary* frees its GPU blocks and keeps its KV on
   the host — with DuplexKV's eager rotation only the dirty tail block still has to be copied out;
4. admissions: waiting requests get blocks for all their tokens; rotary ones get them back and
   their host blocks are copied in;
5. the batch: one token for every decoding request, then prompt chunks (chunked prefill) up to
   ``max_num_batched_tokens``, in admission order — the engine's scheduler does the same;
6. the step lasts ``max(compute, transfer)`` (``CostModel.step_s``); every request whose cache is
   now complete gets a token at the step's end; blocks that just filled are copied out eagerly
   (next step's device-to-host traffic); finished requests free their blocks.

Deterministic: no clock, no threads; a seeded workload gives the same run every time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..kv.block_manager import blocks_needed
from ..sched.policies import Policy, RequestView, StepView, check_decision, view_vlt
from ..sched.vlt import ROTARY, RUNNING, STATE_NAMES, WAITING
from .presets import Preset
from .workload import RequestSpec

FINISHED = 3  # simulator-only state (never shown to a policy)
STATE_LABELS = {**STATE_NAMES, FINISHED: "finished"}


class SimulationStalled(RuntimeError):
    """Work is left, nothing can run and nothing will arrive: the policy (or preset) is stuck."""


@dataclass
class SimRequest:
    """One request's life in the simulator."""

    spec: RequestSpec
    state: int = WAITING
    num_output: int = 0  # tokens generated so far
    num_computed: int = 0  # tokens whose KV exists (on the GPU while running, the host if rotary)
    gpu_blocks: int = 0
    run_start_time: float = math.nan  # t_run
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list = field(default_factory=list)  # (num_output,) seconds
    transitions: list = field(default_factory=list)  # [(time, state), ...]
    num_preemptions: int = 0

    @property
    def request_id(self) -> int:
        return self.spec.request_id

    @property
    def num_tokens(self) -> int:
        return self.spec.prompt_len + self.num_output

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    def blocks_for_all_tokens(self, block_size: int) -> int:
        return blocks_needed(self.num_tokens, block_size)

    def move(self, state: int, now: float) -> None:
        self.state = state
        self.transitions.append((now, state))


@dataclass
class SimResult:
    """Everything a run produced: per-request records, per-step records, and totals."""

    policy: str
    preset: str
    requests: list[SimRequest]
    end_time: float
    completed: bool  # every request finished before ``max_time_s``
    steps: int
    step_times: np.ndarray  # (steps,) seconds
    step_starts: np.ndarray  # (steps,) seconds
    free_blocks: np.ndarray  # (steps,) free GPU blocks at each decision
    blocks_in: int  # total blocks copied host -> GPU
    blocks_out: int  # total blocks copied GPU -> host
    vlt_trace: list | None = None  # [(time, ids (N,), states (N,), vlt (N,)), ...] when recorded


class Simulator:
    """Runs one policy over one workload on one preset."""

    def __init__(self, preset: Preset, policy: Policy, max_time_s: float = math.inf,
                 record_vlt: bool = False, check: bool = True):
        self.preset = preset
        self.policy = policy
        self.max_time_s = max_time_s
        self.record_vlt = record_vlt
        self.check = check
        self.bs = preset.block_size
        # Only policies that rotate keep a host mirror (recompute drops the KV instead).
        self.eager_copy_out = policy.preemption == "rotary"

    # --- the run ------------------------------------------------------------------------------
    def run(self, workload: list[RequestSpec]) -> SimResult:
        pending = sorted(workload, key=lambda s: (s.arrival_time, s.request_id))
        for spec in pending:
            need = blocks_needed(spec.prompt_len + spec.output_len, self.bs)
            if need > self.preset.num_gpu_blocks:
                raise ValueError(f"request {spec.request_id} needs {need} blocks; the GPU has "
                                 f"{self.preset.num_gpu_blocks}")
        reqs = [SimRequest(spec) for spec in pending]
        self.free = self.preset.num_gpu_blocks
        self.running: list[SimRequest] = []  # admission order
        self.waiting: list[SimRequest] = []  # FCFS queue (recompute-preempted at the front)
        self.rotary: list[SimRequest] = []  # rotation order
        self.pending_out = 0  # blocks that filled last step: copied out eagerly this step
        self.blocks_in_total = self.blocks_out_total = 0
        trace = [] if self.record_vlt else None
        step_times, step_starts, free_log = [], [], []
        now, next_arrival, done = 0.0, 0, 0
        while done < len(reqs) and now < self.max_time_s:
            while next_arrival < len(reqs) and reqs[next_arrival].spec.arrival_time <= now:
                r = reqs[next_arrival]
                r.move(WAITING, r.spec.arrival_time)
                self.waiting.append(r)
                next_arrival += 1
            if not (self.running or self.waiting or self.rotary):
                now = reqs[next_arrival].spec.arrival_time  # idle: jump to the next arrival
                continue
            blocks_in, blocks_out, moves, decided = self._decide_and_apply(now, trace,
                                                                          len(step_times))
            batch = self._form_batch()
            if not batch and not blocks_in and not blocks_out:
                if next_arrival < len(reqs):
                    now = max(now, reqs[next_arrival].spec.arrival_time)
                    continue
                raise SimulationStalled(f"{self.policy.name}: {len(self.waiting)} waiting, "
                                        f"{len(self.rotary)} rotary, nothing runs (t={now:.3f})")
            tokens = sum(n for _, n in batch)
            context = sum(r.num_computed + n for r, n in batch)
            dt = self.preset.cost.step_s(tokens, context, blocks_in, blocks_out, moves, decided,
                                         mirrored=self.eager_copy_out, seqs=len(batch))
            step_starts.append(now)
            step_times.append(dt)
            free_log.append(self.free)
            now += dt
            done += self._finish_step(batch, now)
        return SimResult(policy=self.policy.name, preset=self.preset.name, requests=reqs,
                         end_time=now, completed=done == len(reqs), steps=len(step_times),
                         step_times=np.array(step_times), step_starts=np.array(step_starts),
                         free_blocks=np.array(free_log), blocks_in=self.blocks_in_total,
                         blocks_out=self.blocks_out_total, vlt_trace=trace)

    # --- one iteration ------------------------------------------------------------------------
    def _view(self, now: float) -> StepView:
        views = [self._request_view(r) for r in self.running + self.waiting + self.rotary]
        return StepView(now=now, free_blocks=self.free, requests=views,
                        max_num_seqs=self.preset.max_num_seqs)

    def _request_view(self, r: SimRequest) -> RequestView:
        return RequestView(
            request_id=r.request_id, state=r.state, arrival_time=r.spec.arrival_time,
            run_start_time=r.run_start_time,
            last_token_time=r.token_times[-1] if r.token_times else math.nan,
            blocks_held=r.gpu_blocks,
            blocks_to_run=r.blocks_for_all_tokens(self.bs) - r.gpu_blocks,
            blocks_on_host=blocks_needed(r.num_computed, self.bs) if r.state == ROTARY else 0,
            num_prompt_tokens=r.spec.prompt_len, num_output_tokens=r.num_output)

    def _decide_and_apply(self, now: float, trace: list | None,
                          step: int) -> tuple[int, int, int, bool]:
        """Apply the policy's decision (or, between its decisions, ``hold``); (blocks in,
        blocks out, requests moved, whether the engine would have described the requests to
        the policy: ``Policy.described`` and it decided)."""
        view = self._view(now)
        decides = self.policy.decides_at(step, len(self.running))
        decision = self.policy.decide(view) if decides else self.policy.hold(view)
        if self.check:
            check_decision(view, decision)
        if trace is not None:
            self._record_vlt(view, trace)
        by_id = {r.request_id: r for r in self.running + self.waiting + self.rotary}
        blocks_out = self.pending_out
        blocks_in = rotated_in = 0
        self.pending_out = 0
        for rid in decision.preempt_recompute:
            r = by_id[rid]
            self._release(r)
            r.num_computed = 0
            r.num_preemptions += 1
            r.move(WAITING, now)
            self.waiting.insert(0, r)
        for rid in decision.preempt_rotary:
            r = by_id[rid]
            self._release(r)
            blocks_out += 1 if r.num_computed % self.bs else 0  # the dirty tail block
            r.num_preemptions += 1
            r.move(ROTARY, now)
            self.rotary.append(r)
        # Rotary requests join the running ones first, then waiting ones, as in the engine: a
        # rotate-in enters when the decision is applied, a prompt when the batch is formed
        # (the order matters: passive preemption evicts the most recently admitted).
        admitted = [by_id[rid] for rid in decision.admit]
        for r in sorted(admitted, key=lambda r: r.state != ROTARY):  # stable: in order

            if r.state == ROTARY:
                self.rotary.remove(r)
                blocks_in += blocks_needed(r.num_computed, self.bs)
                rotated_in += 1
            else:
                self.waiting.remove(r)
            need = r.blocks_for_all_tokens(self.bs)
            assert need <= self.free, "check_decision lets no over-commitment through"
            self.free -= need
            r.gpu_blocks = need
            r.run_start_time = now
            r.move(RUNNING, now)
            self.running.append(r)
        for r in self.running:  # growth of those that stayed: a decode may open a new block
            grow = r.blocks_for_all_tokens(self.bs) - r.gpu_blocks
            if grow > 0:
                assert grow <= self.free, "check_decision lets no over-commitment through"
                self.free -= grow
                r.gpu_blocks += grow
        self.blocks_in_total += blocks_in
        self.blocks_out_total += blocks_out
        moves = len(decision.preempt_recompute) + len(decision.preempt_rotary) + rotated_in
        return blocks_in, blocks_out, moves, decides and self.policy.described

    def _release(self, r: SimRequest) -> None:
        self.running.remove(r)
        self.free += r.gpu_blocks
        r.gpu_blocks = 0

    def _form_batch(self) -> list[tuple[SimRequest, int]]:
        """Decodes first, then prompt chunks, within the token budget (chunked prefill)."""
        budget = self.preset.max_num_batched_tokens
        batch = []
        for r in self.running:
            if r.num_uncomputed == 1 and budget > 0:
                batch.append((r, 1))
                budget -= 1
        for r in self.running:
            if r.num_uncomputed > 1 and budget > 0:
                chunk = min(r.num_uncomputed, budget)
                batch.append((r, chunk))
                budget -= chunk
        return batch

    def _finish_step(self, batch: list[tuple[SimRequest, int]], t_end: float) -> int:
        finished = 0
        for r, n in batch:
            before = r.num_computed // self.bs
            r.num_computed += n
            if self.eager_copy_out:  # filled blocks are Synced: DuplexKV mirrors them now
                self.pending_out += r.num_computed // self.bs - before
            if r.num_computed < r.num_tokens:
                continue  # a prompt chunk short of the end samples nothing
            r.num_output += 1
            r.token_times.append(t_end)
            if r.first_token_time is None:
                r.first_token_time = t_end
            if r.num_output >= r.spec.output_len:
                self._release(r)
                r.finish_time = t_end
                r.move(FINISHED, t_end)
                finished += 1
        return finished

    def _record_vlt(self, view: StepView, trace: list) -> None:
        ids = np.array([r.request_id for r in view.requests], dtype=np.int64)  # (N,)
        states = np.array([r.state for r in view.requests], dtype=np.int8)  # (N,)
        trace.append((view.now, ids, states, view_vlt(view, self.policy.config)))


def simulate(preset: Preset, policy: Policy, workload: list[RequestSpec], **options) -> SimResult:
    """Run ``policy`` over ``workload`` on ``preset`` (see ``Simulator`` for the options)."""
    return Simulator(preset, policy, **options).run(workload)
