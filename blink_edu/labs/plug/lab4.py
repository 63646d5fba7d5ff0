"""Lab 4's plug: the lab's DuplexKV books inside the engine's rotation machinery.

* ``LabBlockManager.mark_written`` is the lab's ``mark_written`` (DIRTY -> SYNCED);
* ``LabRotationEngine.on_written`` / ``blocks_to_rotate_out`` are the lab's eager-rotation books;
* the NumPy transport of ``kv/transfer.py`` takes the lab's ``plan_batched_copy`` (checked) as
  its ``plan``: every batched copy moves the planned pairs, one copy per planned run.

``rotating_engine`` builds an ``LLMEngine`` (reference executor, ``preemption="rotate"``) over
them, through its constructor arguments (``executor=``, ``scheduler=``, the scheduler's
``block_manager=`` and ``attach_rotation``, the transport's ``plan=``); under memory pressure its
FCFS scheduler rotates decoding requests out and back in.
"""

from __future__ import annotations

import numpy as np

from .. import implementation, require
from ...config import EngineConfig, ModelConfig, SamplingParams
from ...engine.llm_engine import LLMEngine
from ...executors.reference_executor import ReferenceExecutor
from ...engine.scheduler import Scheduler
from ...kv.block_manager import BlockManager
from ...kv.host_store import HostKVStore
from ...kv.rotation import RotationEngine
from ...kv.transfer import NumpyTransport
from ...model.weights import random_weights

MICRO = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
             tie_word_embeddings=True, eos_token_id=2)


class LabRuleBroken(AssertionError):
    """The lab's books or plan broke a rule (the message says which)."""


def micro_weights(seed: int = 0, dtype=np.float64):
    # float64: no rounding-level near-ties between different batchings of the same requests
    return random_weights(ModelConfig.from_dict(MICRO), seed=seed, scale=0.5, dtype=dtype)


def _impl():
    impl = implementation(4)
    return impl


class LabBlockManager(BlockManager):
    def mark_written(self, seq_id: int, num_tokens: int) -> list[int]:
        impl = _impl()
        require(impl.mark_written, "4.1")
        table = self.tables[seq_id]
        if num_tokens > len(table) * self.block_size:
            raise ValueError(f"sequence {seq_id}: {num_tokens} tokens exceed its "
                             f"{len(table)} block(s) of {self.block_size}")
        before = self.num_tokens[seq_id]
        filled = impl.mark_written(self.state, list(table), before, num_tokens, self.block_size)
        self.num_tokens[seq_id] = num_tokens
        return list(filled)


class LabRotationEngine(RotationEngine):
    def on_written(self, seq_id: int, old_tokens: int, new_tokens: int) -> None:
        impl = _impl()
        require(impl.on_written, "4.2")
        pending = self.pending_out.setdefault(seq_id, set()) if self.eager else set()
        impl.on_written(self.mirrored.setdefault(seq_id, set()), pending, old_tokens, new_tokens,
                        self.block_size)

    def blocks_to_rotate_out(self, seq_id: int) -> list[int]:
        impl = _impl()
        require(impl.blocks_to_rotate_out, "4.3")
        n = len(self.blocks.block_table(seq_id))
        return list(impl.blocks_to_rotate_out(n, set(self.mirrored.get(seq_id, set()))))


def checked_plan(gpu_blocks, host_blocks, impl=None) -> list[tuple[int, list[int]]]:
    """The lab's plan for these pairs, checked: it must copy every (gpu, host) pair exactly once,
    each run to consecutive host blocks."""
    impl = impl or _impl()
    require(impl.plan_batched_copy, "4.4")
    gpu, host = [int(g) for g in gpu_blocks], [int(h) for h in host_blocks]
    plan = [(int(h0), [int(g) for g in run]) for h0, run in impl.plan_batched_copy(gpu, host)]
    planned = sorted((h0 + k, g) for h0, run in plan for k, g in enumerate(run))
    wanted = sorted(zip(host, gpu))
    if planned != wanted:
        raise LabRuleBroken(f"plan_batched_copy({gpu}, {host}) returned {plan}: run "
                            f"(h, [g0, g1, ...]) copies g0 -> h, g1 -> h+1, ...; that moves "
                            f"(host, gpu) pairs {planned}, not the wanted {wanted}")
    return plan


def rotating_engine(weights, config: EngineConfig, delay: int = 0) -> LLMEngine:
    """``LLMEngine`` with rotation preemption over the lab's block manager, books and transport
    (copies land ``delay`` steps after they are issued, as on a busy link), all handed to it
    through its constructor: the executor, and a scheduler with the lab's rotation attached."""
    if config.preemption != "rotate":
        raise ValueError("the lab engine rotates: use EngineConfig(preemption='rotate')")
    model = weights.config
    executor = ReferenceExecutor(weights, config.num_kv_blocks, config.block_size)
    pool = executor.kv_pool  # (N, L, 2, B, K, E)
    blocks = LabBlockManager(config.num_kv_blocks, config.block_size)
    scheduler = Scheduler(config, config.max_model_len or model.max_position_embeddings,
                          model.eos_token_ids, block_manager=blocks)
    host = HostKVStore(config.num_host_kv_blocks or 2 * config.num_kv_blocks,
                       tuple(pool.shape[1:]), pool.dtype)
    transport = NumpyTransport(pool, host, delay, plan=checked_plan)
    scheduler.attach_rotation(LabRotationEngine(blocks, host, transport, eager=True))
    return LLMEngine(weights, config, executor=executor, scheduler=scheduler)


def generate(weights, prompts, params: SamplingParams, config: EngineConfig, delay: int = 0,
             after_step=None):
    """Tokens per prompt from a rotating lab engine (``rotation.check()`` after every step;
    ``after_step(engine)`` too, if given), and the engine."""
    engine = rotating_engine(weights, config, delay)
    ids = [engine.add_request(p, params) for p in prompts]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].append(o.token_id)
        engine.scheduler.rotation.check()
        if after_step:
            after_step(engine)
    engine.scheduler.rotation.check()
    return [out[i] for i in ids], engine
