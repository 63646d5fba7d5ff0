"""Lab 3's plug: a ``Scheduler`` whose ``schedule`` is the lab's continuous-batching functions.

``LabScheduler.schedule`` builds a ``StepContext`` (the few operations the lab may use), calls
``schedule_decodes`` and then ``schedule_prompts`` of ``implementation(3)``, checks the step
against the rules that must always hold (budget, seats, every token of a chunk backed by KV
blocks), records it in ``history`` (for the notebook's picture) and packs the ``StepBatch``.
Everything after the model ran (``postprocess``: tokens, stop rules, freeing blocks) is the
project's ``Scheduler``. ``lab_engine`` builds an ``LLMEngine`` (NumPy reference executor) with it
(``LLMEngine(..., scheduler=)``).
"""

from __future__ import annotations

import time

from .. import implementation, require
from ...config import EngineConfig, ModelConfig, SamplingParams
from ...engine.llm_engine import LLMEngine
from ...engine.scheduler import Scheduler
from ...engine.sequence import Sequence, SequenceStatus
from ...executors.step import StepBatch, pack_step
from ...model.weights import random_weights

MICRO = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
             tie_word_embeddings=True, eos_token_id=2)


class LabRuleBroken(AssertionError):
    """A step that breaks a rule of continuous batching (the message says which)."""


def micro_weights(seed: int = 0):
    return random_weights(ModelConfig.from_dict(MICRO), seed=seed, scale=0.4)


class StepContext:
    """What the lab's functions may see and do in one step (see ``lab3_batching.py``)."""

    def __init__(self, scheduler: Scheduler):
        self._s = scheduler
        self.scheduled: list[Sequence] = []
        self.preempted: list[Sequence] = []
        self.admitted: list[Sequence] = []

    @property
    def running(self):
        return self._s.running

    @property
    def waiting(self):
        return self._s.waiting

    @property
    def max_num_seqs(self) -> int:
        return self._s.max_num_seqs

    def fits(self, seq: Sequence, num_tokens: int) -> bool:
        return self._s.block_manager.can_grow(seq.seq_id, seq.num_cached_tokens
                                              + seq.num_scheduled_tokens + num_tokens)

    def run(self, seq: Sequence, num_tokens: int) -> None:
        if seq not in self._s.running:
            raise LabRuleBroken(f"ctx.run({seq}): only a running sequence can run (admit it "
                                f"first)")
        if seq in self.scheduled:
            raise LabRuleBroken(f"ctx.run({seq}) twice in one step")
        if not 1 <= num_tokens <= seq.num_uncached_tokens:
            raise LabRuleBroken(f"ctx.run({seq}, {num_tokens}): a sequence runs between 1 and "
                                f"its {seq.num_uncached_tokens} uncached token(s)")
        if not self.fits(seq, num_tokens):
            raise LabRuleBroken(f"ctx.run({seq}, {num_tokens}): the KV pool has no room "
                                f"(check ctx.fits first)")
        self._s.block_manager.grow(seq.seq_id, seq.num_cached_tokens + num_tokens)
        seq.num_scheduled_tokens = num_tokens
        self.scheduled.append(seq)

    def preempt_newest(self) -> Sequence:
        s = self._s
        if not s.running:
            raise LabRuleBroken("ctx.preempt_newest(): nobody is running")
        victim = s.running.pop()
        if victim in self.scheduled:
            raise LabRuleBroken(f"ctx.preempt_newest() took {victim}, already scheduled this "
                                f"step: preempt only while the newest has not run yet")
        s.num_preemptions += 1
        victim.num_preemptions += 1
        s.block_manager.free(victim.seq_id)
        victim.num_cached_tokens = 0
        victim.status = SequenceStatus.PREEMPTED
        s.waiting.appendleft(victim)
        self.preempted.append(victim)
        return victim

    def admit(self, seq: Sequence) -> None:
        s = self._s
        if not s.waiting or s.waiting[0] is not seq:
            raise LabRuleBroken(f"ctx.admit({seq}): only the front of the waiting queue may be "
                                f"admitted (FCFS)")
        if len(s.running) >= s.max_num_seqs:
            raise LabRuleBroken(f"ctx.admit({seq}): already max_num_seqs={s.max_num_seqs} "
                                f"running")
        s.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        seq.run_start_time = time.monotonic()
        s.running.append(seq)
        self.admitted.append(seq)


class LabScheduler(Scheduler):
    """The project's scheduler with ``schedule`` made of the lab's functions (recompute
    preemption; no rotation, no policy)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.history: list[dict] = []  # one entry per step: who ran how many tokens

    def schedule(self) -> tuple[StepBatch | None, list[Sequence]]:
        impl = implementation(3)
        require(impl.schedule_decodes, "3.1")
        require(impl.prompt_chunk, "3.2")
        require(impl.schedule_prompts, "3.3")
        ctx = StepContext(self)
        budget = self.max_num_batched_tokens
        left = impl.schedule_decodes(ctx, budget)
        n_decode = sum(s.num_scheduled_tokens for s in ctx.scheduled)
        if left != budget - n_decode:
            raise LabRuleBroken(f"schedule_decodes returned a budget of {left}, but "
                                f"{budget} - {n_decode} decode token(s) = {budget - n_decode}")
        impl.schedule_prompts(ctx, left, admit_new=not ctx.preempted)
        self._check(ctx)
        self.history.append(dict(
            tokens={s.seq_id: s.num_scheduled_tokens for s in ctx.scheduled},
            decodes=[s.seq_id for s in ctx.scheduled if s.is_decoding],
            preempted=[s.seq_id for s in ctx.preempted],
            admitted=[s.seq_id for s in ctx.admitted]))
        if not ctx.scheduled:
            if self.has_unfinished():
                raise LabRuleBroken("nothing was scheduled although requests are waiting: the "
                                    "engine would stall")
            return None, []
        chunks = [(s.token_ids[s.num_cached_tokens:s.num_cached_tokens + s.num_scheduled_tokens],
                   s.num_cached_tokens) for s in ctx.scheduled]
        tables = self.block_manager.block_table_array([s.seq_id for s in ctx.scheduled])
        batch = pack_step(chunks, tables, [s.params for s in ctx.scheduled],
                          seeds=[s.seed for s in ctx.scheduled],
                          counters=[s.num_output_tokens for s in ctx.scheduled])
        return batch, ctx.scheduled

    def _check(self, ctx: StepContext) -> None:
        total = sum(s.num_scheduled_tokens for s in ctx.scheduled)
        if total > self.max_num_batched_tokens:
            raise LabRuleBroken(f"{total} tokens scheduled, over the budget of "
                                f"{self.max_num_batched_tokens}")
        if len(self.running) > self.max_num_seqs:
            raise LabRuleBroken(f"{len(self.running)} running, over max_num_seqs="
                                f"{self.max_num_seqs}")
        decoding = [s for s in self.running if s.is_decoding]
        skipped = [s for s in decoding if s not in ctx.scheduled]
        if skipped and total < self.max_num_batched_tokens and not ctx.preempted:
            raise LabRuleBroken(f"decoding sequence(s) {skipped} got no token although the "
                                f"budget had room")


def lab_engine(weights, config: EngineConfig) -> LLMEngine:
    """``LLMEngine`` (reference executor) built with a ``LabScheduler`` as its scheduler."""
    model = weights.config
    scheduler = LabScheduler(config, config.max_model_len or model.max_position_embeddings,
                             model.eos_token_ids)
    return LLMEngine(weights, config, scheduler=scheduler)


def generate(weights, prompts, params: SamplingParams, config: EngineConfig):
    """Tokens per prompt from a lab engine, and the engine (its ``scheduler.history``)."""
    engine = lab_engine(weights, config)
    ids = [engine.add_request(p, params) for p in prompts]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].append(o.token_id)
    engine.scheduler.block_manager.check()
    return [out[i] for i in ids], engine


# --- helpers for tests and the notebook: sequences in a given state -----------------------------
def scheduler_for(num_blocks: int, block_size: int = 4, budget: int = 8,
                  max_num_seqs: int = 4) -> LabScheduler:
    config = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    return LabScheduler(config, max_model_len=256)


def add_waiting(scheduler: Scheduler, seq_id: int, prompt_len: int, max_tokens: int = 8) -> Sequence:
    seq = Sequence(seq_id, list(range(3, 3 + prompt_len)), SamplingParams(max_tokens=max_tokens))
    scheduler.waiting.append(seq)  # (no admission check: a test may queue one that cannot fit)
    return seq


def add_running(scheduler: Scheduler, seq_id: int, prompt_len: int, cached: int | None = None,
                outputs: int = 0, max_tokens: int = 8) -> Sequence:
    """A running sequence with ``outputs`` generated tokens and ``cached`` tokens in the KV pool
    (default: all but its last token: it is decoding)."""
    seq = Sequence(seq_id, list(range(3, 3 + prompt_len)), SamplingParams(max_tokens=max_tokens))
    seq.output_token_ids = list(range(5, 5 + outputs))
    seq.num_cached_tokens = seq.num_tokens - 1 if cached is None else cached
    seq.status = SequenceStatus.RUNNING
    if seq.num_cached_tokens:
        scheduler.block_manager.grow(seq_id, seq.num_cached_tokens)
        scheduler.block_manager.mark_written(seq_id, seq.num_cached_tokens)
    scheduler.running.append(seq)
    return seq
