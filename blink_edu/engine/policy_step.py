"""A RotaSched policy at the head of an engine step: describe, decide, apply.

SuperInfer §3 (RotaSched: every iteration -- here every ``decision_interval``-th, see
``Policy.decides_at`` -- decide who runs, who waits and who rotates out, by Virtual Lag Time)
and docs/design.md §6, §8 ("sched/ policies decide from plain numbers; they never call an
executor"). The policy (``blink_edu.sched.policies``) sees plain numbers; this module is
the glue between it and the engine's ``Scheduler``:

1. **describe** — one ``RequestView`` per live ``Sequence``, in FCFS order: running (in order of
   admission), then waiting (front first), then rotated out (oldest first); times are
   ``time.monotonic`` seconds, blocks come from the block manager;
2. **decide** — ``policy.decide(view)``;
3. **apply** — preempt (into the rotary state through DuplexKV when the sequence has cached
   tokens — decoding, or part-way through its prompt — and the host has room; by recompute
   when it has nothing cached; not at all when the host is full), rotate the admitted rotary
   ones back in, and put the
   admitted waiting ones at the front of the queue. The scheduler's token-budget code then runs
   as always, admitting from the waiting queue only the sequences the policy admitted.

Same tokens whatever the policy: a sequence's seed and counter travel with it, so only *when* it
runs changes, never *what* it samples.
"""

from __future__ import annotations

import math
from collections import deque

from ..kv.block_manager import OutOfBlocks, blocks_needed
from ..kv.host_store import OutOfHostBlocks
from ..sched.policies import Decision, Policy, RequestView, StepView
from ..sched.vlt import ROTARY, RUNNING, WAITING
from .sequence import Sequence


def describe(scheduler, now: float) -> tuple[StepView, dict[int, Sequence]]:
    """The step as the policy sees it, and the sequences by id. It runs over every live request
    (a queue of a hundred under overload) on every step the policy decides, so each view is
    built from plain attributes, positionally -- the field order of ``RequestView``."""
    bm = scheduler.block_manager
    views, by_id = [], {}
    for state, seqs in ((RUNNING, scheduler.running), (WAITING, scheduler.waiting),
                        (ROTARY, scheduler.rotated)):
        for seq in seqs:
            sid = seq.seq_id
            num_prompt, num_output = len(seq.prompt_token_ids), len(seq.output_token_ids)
            held, on_host = 0, 0
            if state == RUNNING:
                held = len(bm.tables[sid])
                to_run = bm.blocks_to_grow(sid, num_prompt + num_output)
            else:  # admitted, it needs blocks for every token, its next one's K/V included
                to_run = blocks_needed(num_prompt + num_output, bm.block_size)
                if state == ROTARY:
                    on_host = scheduler.blocks_to_rotate_in(seq)
            run_start = seq.run_start_time
            views.append(RequestView(
                sid, state, seq.arrival_time, math.nan if run_start is None else run_start,
                seq.token_times[-1] if seq.token_times else math.nan,  # last_token_time
                held, to_run, on_host, num_prompt, num_output))
            by_id[sid] = seq
    view = StepView(now=now, free_blocks=bm.num_free, requests=views,
                    max_num_seqs=scheduler.max_num_seqs)
    return view, by_id


def apply(scheduler, decision: Decision, by_id: dict[int, Sequence], now: float) -> set[int]:
    """Carry the decision out at ``now``; returns the ids of the waiting sequences it admitted.

    All the step's rotate-outs share one copy-out, all its rotate-ins one copy-in (DuplexKV's
    batched copies, ``Scheduler.batched_copies``). Two batches, not one: the first ends -- its
    copy issued -- before the rotate-ins take GPU blocks, so the tail blocks it copies out are
    free for them once it lands, as the policy counted on (at once with a synchronous
    transport; on a GPU, after ``reclaim_draining_blocks``)."""
    with scheduler.batched_copies():
        preempt(scheduler, decision, by_id)
    if decision.admit:
        # The policy counted the rotated-out sequences' blocks as free now; those with a copy
        # still in flight are DRAINING until it lands. On a GPU the copy-out was just issued and
        # runs at once (the model's last step is over): wait for it here, or the admissions it
        # was made for fail this step and the policy preempts again next step for the same
        # requests.
        scheduler.reclaim_draining_blocks()
    with scheduler.batched_copies():
        admitted_waiting = admit(scheduler, decision, by_id, now)
    admitted_ids = {s.seq_id for s in admitted_waiting}
    rest = [s for s in scheduler.waiting if s.seq_id not in admitted_ids]
    scheduler.waiting = deque(admitted_waiting + rest)
    return admitted_ids


def preempt(scheduler, decision: Decision, by_id: dict[int, Sequence]) -> None:
    """The decision's preemptions. A rotary one whose K/V the host has no room for is *not*
    done: the sequence keeps running, and whatever was admitted on the strength of its blocks
    waits until they are free (the scheduler admits only what fits). Turning it into a
    recompute instead would trade a copy for the victim's whole context in model work -- and
    under LVF the victim soon has the largest lag, is admitted again, rotated out again: a
    CPU served 16 requests 10x slower than FCFS that way, almost all of it recomputing."""
    for sid in decision.preempt_recompute:
        scheduler.running.remove(by_id[sid])
        scheduler.preempt_by_recompute(by_id[sid])
    for sid in decision.preempt_rotary:
        seq = by_id[sid]
        if seq.num_cached_tokens == 0 or scheduler.rotation is None:
            scheduler.running.remove(seq)  # nothing cached to lose (or nowhere to rotate to)
            scheduler.preempt_by_recompute(seq)
            continue
        try:
            scheduler.rotate_out(seq)
        except OutOfHostBlocks:
            pass  # no room on the host: it stays running (see above)


def admit(scheduler, decision: Decision, by_id: dict[int, Sequence],
          now: float) -> list[Sequence]:
    """Rotate the admitted rotary sequences back in; returns the admitted waiting ones, in order.
    Each admitted one runs from ``now`` on (t_run, which its VLT counts from), even if the token
    budget leaves its prompt out of this step's batch."""
    admitted_waiting = []
    for sid in decision.admit:
        seq = by_id[sid]
        if seq in scheduler.rotated:
            try:
                scheduler.rotate_in(seq)
            except (OutOfBlocks, ValueError):
                break  # the GPU is full after all: the rest waits for the next step
        else:
            seq.run_start_time = now
            admitted_waiting.append(seq)
    return admitted_waiting


def run_policy(scheduler, policy: Policy, now: float) -> set[int]:
    """describe -> decide -> apply; the waiting sequences the scheduler may admit this step."""
    view, by_id = describe(scheduler, now)
    decision = policy.decide(view)
    scheduler.last_decision = decision
    return apply(scheduler, decision, by_id, now)
