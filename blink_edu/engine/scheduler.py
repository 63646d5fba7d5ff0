"""The scheduler: who runs this step, how many tokens each, and what happens to their tokens.

docs/design.md §2 ("step = model forward over a flat batch of tokens (prefill chunks + decodes)") and
§6 (FCFS with passive preemption by recompute, the baseline SuperInfer's RotaSched improves on);
Blink §3 ("FCFS scheduling ... continuous batching with inline prefill"); nano-vllm's and vLLM
v1's schedulers. Pure Python: it decides and keeps books, it never runs the model.

One step, in order:

1. **Decodes first.** Every RUNNING sequence that needs one token (its last sampled one) gets
   it, oldest first, each costing 1 token of the budget ``max_num_batched_tokens``. When the KV
   pool has no block for it, the *most recently admitted* running sequence is **preempted by
   recompute** (vLLM v1): its blocks are freed and it goes back to the *front* of the waiting
   queue, keeping its generated tokens. Later it re-fills the cache from prompt + generated tokens
   and continues; its seed and counter are unchanged, so it samples exactly what it would have.
2. **Then prompts, FCFS (chunked prefill).** What is left of the budget goes to prompts: first a
   running sequence still part-way through its prompt, then the waiting queue in order. A prompt
   longer than the budget is cut into chunks over several steps; a step that covers only part of
   a prompt samples nothing for it. A step that had to preempt admits no new sequences.

Decodes and prompt chunks travel in ONE ``StepBatch`` (inline prefill: no separate prefill step).

After the executor returns one sampled token per scheduled sequence, ``postprocess`` records
what was written to the cache, appends tokens, applies the stop rules and frees the blocks of
finished sequences.

**Rotation** (SuperInfer's rotary state; DuplexKV in ``kv/rotation.py``). With a rotation engine
attached (``EngineConfig(preemption="rotate")``), a policy may move a decoding sequence's K/V to
host memory and back between steps: ``rotate_out(seq)`` / ``rotate_in(seq)``, with
``rotation_stats()`` for the numbers a policy decides from (host blocks used, blocks in flight).
A rotated sequence keeps its tokens and resumes exactly where it stopped. With
``preemption="rotate"`` the built-in FCFS policy uses it too: a preemption victim that is
decoding is rotated out instead of recomputed (if the host has room), and rotated sequences are
rotated back in, oldest first, before any new prompt is admitted (vLLM v0's swapped-first).
The moves one step decides together -- a policy's, the FCFS resumes -- share one batched copy
per direction (``batched_copies``). Each step starts with ``rotation.tick()`` (land finished
copies) and ends with ``rotation.flush()`` (eagerly copy out the blocks that just filled). A
sequence whose copy-in has not landed is skipped unless the model's kernels can be ordered after
it (on a GPU).

Why this cannot get stuck: admission takes blocks only for the chunk it schedules, and at most one
running sequence is ever part-way through its prompt — the last one admitted, because a prompt is
cut only when the budget runs out. The oldest running sequence always progresses (it preempts
the newest ones until its block fits), and ``add`` rejects any request that would not fit in the
whole pool on its own.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext

import numpy as np

from ..config import EngineConfig
from ..kv.block_manager import COPY_OUT, BlockManager, blocks_needed
from ..kv.host_store import OutOfHostBlocks
from .sequence import Sequence, SequenceStatus
from .policy_step import run_policy
from ..executors.step import StepBatch, pack_step


class Scheduler:
    def __init__(self, config: EngineConfig, max_model_len: int, eos_token_ids=(), policy=None,
                 block_manager: BlockManager | None = None):
        """``block_manager``: an already built one (of ``config``'s blocks and block size)
        instead of a new ``BlockManager``."""
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = (block_manager if block_manager is not None
                              else BlockManager(config.num_kv_blocks, config.block_size))
        self.waiting: deque[Sequence] = deque()  # FCFS queue; preempted sequences go to the front
        self.running: list[Sequence] = []  # in order of admission: the last is preempted first
        self.rotated: deque[Sequence] = deque()  # rotated out to host memory, oldest first
        # Requests moved, each move counted once: num_recomputes + num_rotations + num_rotate_ins
        # (num_preemptions counts the FCFS rules' preemptions, by recompute or by rotation).
        self.num_preemptions = 0
        self.num_recomputes = 0  # preemptions by recompute, by the FCFS rules or a policy
        self.num_rotations = 0  # rotate-outs, by preemption or asked for
        self.num_rotate_ins = 0
        self.preemption = config.preemption
        self.rotation = None  # a kv.rotation.RotationEngine, once attached
        # preemption="rotate": rotate sequences back in FCFS each step. A policy that decides
        # rotate-ins itself sets this to False.
        self.resume_rotated = config.preemption == "rotate"
        # A RotaSched policy (sched/policies.py) deciding admissions and preemptions at the head
        # of each step (engine/policy_step.py); None: the FCFS rules of this module's docstring.
        self.policy = policy
        if policy is not None:
            self.resume_rotated = False
        self.last_decision = None  # the policy's decision this step (None: it did not decide)
        self.num_iterations = 0  # schedule() calls: the policy decides every decision_interval-th
        self._admissible: set[int] | None = None  # waiting ids the policy admitted, not yet in

    def attach_rotation(self, rotation) -> None:
        """Give the scheduler a ``kv.rotation.RotationEngine`` over the same block manager."""
        if rotation.blocks is not self.block_manager:
            raise ValueError("the rotation engine must share the scheduler's block manager")
        self.rotation = rotation

    # --- requests in and out ------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; ValueError if it could never run to completion."""
        longest = seq.num_prompt_tokens + seq.params.max_tokens
        if longest > self.max_model_len:
            raise ValueError(f"request {seq.request_id!r}: prompt ({seq.num_prompt_tokens} "
                             f"tokens) + max_tokens ({seq.params.max_tokens}) = {longest} exceeds "
                             f"max_model_len={self.max_model_len}")
        # The last sampled token is never fed back, so K/V is needed for longest - 1 tokens.
        need = blocks_needed(longest - 1, self.block_manager.block_size)
        if need > self.block_manager.num_blocks:
            raise ValueError(f"request {seq.request_id!r}: needs up to {need} KV blocks of "
                             f"{self.block_manager.block_size} tokens, but the whole pool has "
                             f"{self.block_manager.num_blocks}; raise num_kv_blocks or lower "
                             f"max_tokens")
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Cancel a sequence whatever its state; its blocks (if any) go back to the pool."""
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.rotated:
            self.rotated.remove(seq)
        else:
            self.waiting.remove(seq)
        self._finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.rotated)

    # --- rotation: the mechanism a policy drives (between steps) -------------------------------
    def rotate_out(self, seq: Sequence) -> int:
        """Move a running sequence's K/V to host memory; its GPU blocks are freed (each as soon
        as its copy lands). It may be part-way through its prompt: rotated back in, it goes on
        from the tokens it had cached (a recompute would throw them away). Returns the blocks
        copied now: with eager rotation at most its dirty tail. OutOfHostBlocks (nothing
        changed) if the host arena is full."""
        if seq not in self.running or seq.num_cached_tokens == 0:
            raise ValueError(f"{seq}: only a running sequence with cached tokens can be rotated out")
        moved = self._rotate_out(seq)
        self.running.remove(seq)
        return moved

    def rotate_in(self, seq: Sequence) -> None:
        """Bring a rotated sequence back: GPU blocks now, its K/V copied in; it runs once the
        copy has landed. OutOfBlocks (nothing changed) if too few GPU blocks are free."""
        if seq not in self.rotated:
            raise ValueError(f"{seq} is not rotated out")
        if len(self.running) >= self.max_num_seqs:
            raise ValueError(f"{seq}: already max_num_seqs={self.max_num_seqs} sequences running")
        self.rotation.rotate_in(seq.seq_id)
        self.num_rotate_ins += 1
        self.rotated.remove(seq)
        seq.status = SequenceStatus.RUNNING
        seq.run_start_time = time.monotonic()
        self.running.append(seq)

    def blocks_to_rotate_in(self, seq: Sequence) -> int:
        """GPU blocks ``rotate_in(seq)`` takes (the next decode may need one more)."""
        return self.rotation.blocks_to_rotate_in(seq.seq_id)

    def rotation_stats(self):
        """A ``kv.rotation.RotationStats``: host blocks used/free, blocks in flight each way,
        sequences rotated/loading, blocks moved so far."""
        return self.rotation.stats()

    def _rotate_out(self, seq: Sequence) -> int:
        if self.rotation is None:
            raise RuntimeError("no rotation engine: use EngineConfig(preemption='rotate')")
        moved = self.rotation.rotate_out(seq.seq_id)
        seq.status = SequenceStatus.ROTATED
        seq.num_rotations += 1
        self.rotated.append(seq)
        self.num_rotations += 1
        return moved

    def batched_copies(self):
        """``with scheduler.batched_copies():`` -- the rotations inside share one copy per
        direction (``RotationEngine.batch``); without a rotation engine, nothing to share."""
        return self.rotation.batch() if self.rotation is not None else nullcontext()

    def _resume_rotated(self) -> None:
        """FCFS over rotated sequences: rotate each back in while the GPU has blocks for it and
        for the next token of every running sequence; their copy-ins travel as one."""
        bm = self.block_manager
        with self.rotation.batch():
            while self.rotated and len(self.running) < self.max_num_seqs:
                seq = self.rotated[0]
                reserve = sum(bm.blocks_to_grow(s.seq_id, s.num_tokens) for s in self.running)
                if blocks_needed(seq.num_tokens, bm.block_size) + reserve > bm.num_free:
                    return
                self.rotate_in(seq)

    def reclaim_draining_blocks(self) -> bool:
        """Wait for the copies still reading blocks that rotate-outs gave back (DRAINING: with
        eager rotation, each one's dirty tail), so those blocks are free now. False if none."""
        if self.rotation is None or not self.block_manager.num_draining:
            return False
        self.rotation.wait_for_draining()
        return True

    def _ready(self, seq: Sequence) -> bool:
        return self.rotation is None or self.rotation.ready(seq.seq_id)

    # --- one step -----------------------------------------------------------------------------
    def schedule(self) -> tuple[StepBatch | None, list[Sequence]]:
        """Pick this step's work; (None, []) when there is nothing to run."""
        scheduled: list[Sequence] = []
        budget = self.max_num_batched_tokens
        if self.rotation is not None:
            self.rotation.tick()
            if self.resume_rotated:
                self._resume_rotated()
        if self.policy is not None:
            self.last_decision = None
            if self.policy.decides_at(self.num_iterations, len(self.running)):
                self._admissible = run_policy(self, self.policy, time.monotonic())
            # else the batch stands (Policy.hold): the FCFS rules below preempt the newest if
            # the others cannot grow, and only what the last decision admitted may still enter
            # (a prompt the token budget left out of that step; the simulator's policy admits
            # it at once and runs its prompt in chunks)
        self.num_iterations += 1
        preemptions_before = self.num_preemptions
        budget = self._schedule_decodes(scheduled, budget)
        self._schedule_prompts(scheduled, budget,
                               admit_new=self.num_preemptions == preemptions_before
                               and not (self.resume_rotated and self.rotated))
        # Nothing to run is fine while copies are in flight, or while a policy keeps everyone
        # rotated out (it decides rotate-ins itself); otherwise it would be a stall.
        waits_for_rotation = self.rotation is not None and bool(
            self.rotation.transport.in_flight or (self.rotated and not self.resume_rotated))
        assert scheduled or not self.has_unfinished() or waits_for_rotation, \
            "scheduler stalled with work to do"
        if not scheduled:
            return None, []
        return self._pack(scheduled), scheduled

    def _schedule_decodes(self, scheduled: list[Sequence], budget: int) -> int:
        """Give each running sequence that needs one token its token; returns the budget left."""
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            i += 1
            if not seq.is_decoding:
                continue  # part-way through its prompt: step 2 continues it
            if not self._ready(seq):
                continue  # rotated in, its copy-in still in flight
            if not self._make_room_for_one_token(seq):
                break  # it preempted itself: nobody after it is left
            self._schedule_chunk(seq, 1, scheduled)
            budget -= 1
        return budget

    def _make_room_for_one_token(self, seq: Sequence) -> bool:
        """Grow ``seq`` by one token, preempting the newest running sequences until it fits.
        False if ``seq`` itself had to be preempted.

        These preemptions are not batched (``batched_copies``): right after a victim's rotate-out
        the loop may have to wait for the tail block it is giving back (``wait_for_draining``),
        which needs that copy issued, not collected; and it takes one victim per missing block,
        rarely more than one a step."""
        while not self.block_manager.can_grow(seq.seq_id, seq.num_tokens):
            if self.reclaim_draining_blocks():
                continue
            victim = self.running.pop()  # the most recently admitted (never one already scheduled)
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _schedule_prompts(self, scheduled: list[Sequence], budget: int, admit_new: bool) -> None:
        """Fill the rest of the budget with prompt chunks, FCFS, up to the first that cannot run."""
        for seq in [s for s in self.running if not s.is_decoding]:
            if not self._ready(seq):
                continue  # rotated in part-way through its prompt, its copy-in still in flight
            chunk = self._prompt_chunk(seq, budget)
            if chunk == 0:
                return
            self._schedule_chunk(seq, chunk, scheduled)
            budget -= chunk
        while admit_new and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._admissible is not None and seq.seq_id not in self._admissible:
                return  # the policy keeps it waiting this step
            chunk = self._prompt_chunk(seq, budget)
            if chunk == 0:
                return
            self.waiting.popleft()
            if self._admissible is not None:  # the policy admitted it (and set its t_run)
                self._admissible.discard(seq.seq_id)  # admitted once: in, not admissible again
            else:
                seq.run_start_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule_chunk(seq, chunk, scheduled)
            budget -= chunk

    def _prompt_chunk(self, seq: Sequence, budget: int) -> int:
        """How many of ``seq``'s uncached tokens to run now: as many as the budget allows, or 0
        if the KV pool has no room for them."""
        chunk = min(seq.num_uncached_tokens, budget)
        fits = self.block_manager.can_grow(seq.seq_id, seq.num_cached_tokens + chunk)
        return chunk if fits else 0

    def _schedule_chunk(self, seq: Sequence, num_tokens: int, scheduled: list[Sequence]) -> None:
        self.block_manager.grow(seq.seq_id, seq.num_cached_tokens + num_tokens)
        if self.rotation is not None:
            self._check_writable(seq, num_tokens)
        seq.num_scheduled_tokens = num_tokens
        scheduled.append(seq)

    def _check_writable(self, seq: Sequence, num_tokens: int) -> None:
        """The blocks this step writes must have no copy out of them in flight."""
        B, start = self.block_manager.block_size, seq.num_cached_tokens
        table = self.block_manager.block_table(seq.seq_id)
        transfer = self.block_manager.transfer
        for block in table[start // B: blocks_needed(start + num_tokens, B)]:  # one or two
            if transfer[block] == COPY_OUT:
                raise RuntimeError(f"{seq}: a block this step writes is being copied out")

    def _preempt(self, seq: Sequence) -> None:
        """Preemption: by rotation when asked for and possible (tokens cached, room on the
        host), else by recompute: drop its K/V; it keeps its tokens, refills the cache later."""
        self.num_preemptions += 1
        seq.num_preemptions += 1
        if self.preemption == "rotate" and self.rotation is not None and seq.num_cached_tokens > 0:
            try:
                self._rotate_out(seq)
                return
            except OutOfHostBlocks:
                pass
        self.preempt_by_recompute(seq, counted=True)

    def preempt_by_recompute(self, seq: Sequence, counted: bool = False) -> None:
        """Drop ``seq``'s K/V (it is no longer in ``running``); it keeps its tokens and goes to
        the front of the waiting queue to refill its cache later."""
        if not counted:
            self.num_preemptions += 1
            seq.num_preemptions += 1
        self.num_recomputes += 1
        self._forget_rotation(seq)
        self.block_manager.free(seq.seq_id)
        seq.num_cached_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(seq)

    def _forget_rotation(self, seq: Sequence) -> None:
        if self.rotation is not None:
            self.rotation.forget(seq.seq_id)

    def _pack(self, scheduled: list[Sequence]) -> StepBatch:
        chunks = [(s.token_ids[s.num_cached_tokens:s.num_cached_tokens + s.num_scheduled_tokens],
                   s.num_cached_tokens) for s in scheduled]
        tables = self.block_manager.block_table_array([s.seq_id for s in scheduled])  # (S, W)
        return pack_step(chunks, tables, [s.params for s in scheduled],
                         seeds=[s.seed for s in scheduled],
                         counters=[s.num_output_tokens for s in scheduled],
                         outputs=[s.output_token_ids for s in scheduled])

    # --- after the model ran ------------------------------------------------------------------
    def postprocess(self, scheduled: list[Sequence], sampled_tokens: np.ndarray,
                    now: float) -> list[Sequence]:
        """Record the step: ``sampled_tokens`` (S,) holds one token per scheduled sequence.
        Returns the sequences that got a new token (some of them now finished)."""
        produced = []
        for seq, token in zip(scheduled, sampled_tokens.tolist()):
            written_from = seq.num_cached_tokens
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.mark_written(seq.seq_id, seq.num_cached_tokens)
            if self.rotation is not None:
                self.rotation.on_written(seq.seq_id, written_from, seq.num_cached_tokens)
            if seq.num_cached_tokens < seq.num_tokens:
                continue  # a prompt chunk that did not reach the end: its sample is meaningless
            seq.append_token(token, now)
            produced.append(seq)
            reason = self._finish_reason(seq, token)
            if reason:
                self.running.remove(seq)
                self._finish(seq, reason)
        if self.rotation is not None:
            self.rotation.flush()  # eager rotation: copy out the blocks that just filled
        return produced

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        """"stop" for a stop token or EOS, "length" at max_tokens (``add`` made sure that
        prompt + max_tokens fits max_model_len), None to keep going."""
        if token in seq.params.stop_token_ids or (token in self.eos_token_ids
                                                  and not seq.params.ignore_eos):
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> None:
        self._forget_rotation(seq)
        self.block_manager.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
