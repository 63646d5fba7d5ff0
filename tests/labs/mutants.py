"""Known-wrong answers to every lab task (instructors only; not in the student handout).

Each ``Mutant`` is the reference solution of its lab with ONE function replaced by a plausible
mistake — the answers a student is likely to hand in. ``test_lab_mutants.py`` runs the lab's own
grading (``python -m blink_edu.labs check``'s ``run_check``) against each, and every one must fail
its task: a mutant that scores is a hole in the lab's tests.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from numba import float32

from blink_edu import labs
from blink_edu.kernels.reduce import cuda
from blink_edu.kernels.sync import store_release
from blink_edu.ring.layout import (DECODE_COMPLETED, DECODE_PROCESSING, FINISH_LENGTH,
                                   PREFILL_PROCESSING)
from blink_edu.sched.vlt import ROTARY


@dataclass(frozen=True)
class Mutant:
    task: str  # "N.k": the task whose tests must fail
    mistake: str  # what is wrong, in words
    replaces: dict  # function name -> the wrong version

    @property
    def lab(self) -> int:
        return int(self.task.split(".")[0])

    def module(self) -> ModuleType:
        """The lab's reference solution with the wrong functions in place."""
        module = ModuleType(f"mutant_{self.task.replace('.', '_')}")
        module.__dict__.update({k: v for k, v in vars(_solution(self.lab)).items()
                                if not k.startswith("__")})
        module.__dict__.update(self.replaces)
        return module


def _solution(lab: int) -> ModuleType:
    """The reference solution of ``lab``, whatever the switch or a substitution says."""
    return importlib.import_module(f"blink_edu.labs.solutions.{labs.LABS[lab].module}")


# --- Lab 1 ----------------------------------------------------------------------------------------
@cuda.jit(device=True)
def inv_rms_sum_not_mean(x, row, eps):
    total = float32(0)
    for col in range(x.shape[1]):
        total += x[row, col] * x[row, col]
    return float32(1) / math.sqrt(total + eps)  # the sum of squares, not their mean


class Relaunched:
    """Stands in for a lab kernel: ``kernel[grid, block, stream](*args)`` launches the reference
    solution's kernel on the inputs a known mistake would use (``wrong_inputs(*args)``) — the
    mistake without a copy of the kernel."""

    def __init__(self, kernel, wrong_inputs):
        self.kernel, self.wrong_inputs = kernel, wrong_inputs

    def __getitem__(self, launch):
        return lambda *args: self.kernel[launch](*self.wrong_inputs(*args))


def _gemv_without_bias(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    return x, x_rows, norm_w, eps, w, cuda.to_device(np.zeros(0, np.float32)), out, accumulate


def _gemv_on_rows_0_to_r(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    rows = cuda.to_device(np.arange(x_rows.shape[0], dtype=np.int32))  # (R,) 0..R-1
    return x, rows, norm_w, eps, w, bias, out, accumulate


def _attention_kv_head_modulo(qkv, positions, seq_rows, tables, pool, layer, heads, kv_heads,
                              out):
    """One kv head per query head, kv head h % K: the solution's h // (H // H) then reads it."""
    spread = pool.copy_to_host()[..., [h % kv_heads for h in range(heads)], :]  # (N, L, 2, B, H, E)
    spread = cuda.to_device(np.ascontiguousarray(spread))
    return qkv, positions, seq_rows, tables, spread, layer, heads, heads, out


def _attention_without_block_table(qkv, positions, seq_rows, tables, pool, layer, heads,
                                   kv_heads, out):
    """Position c read from pool block c // B, as if every table were 0, 1, 2, ..."""
    n_seqs, width = tables.shape
    identity = np.tile(np.arange(width, dtype=np.int32), (n_seqs, 1))  # (S, W)
    return qkv, positions, seq_rows, cuda.to_device(identity), pool, layer, heads, kv_heads, out


# --- Lab 2 ----------------------------------------------------------------------------------------
def slot_cas_returning_nothing_when_it_loses(ring, slot, expected, new):
    return _solution(2).slot_cas(ring, slot, expected, new) or None  # None, not False


@cuda.jit(device=True)
def claim_any_slot(state, slot):
    seen = cuda.atomic.cas(state, slot, state[slot], PREFILL_PROCESSING)  # whatever it held
    return seen != PREFILL_PROCESSING


def _publish_without_the_finish_reason():
    publish = _solution(2).publish_token

    @cuda.jit(device=True)
    def publish_token(state, output_tokens, generated, finish_reason, slot, token, last):
        publish(state, output_tokens, generated, finish_reason, slot, token, 0)
        if last:  # completed, but no FINISH_LENGTH written first
            store_release(state, slot, DECODE_COMPLETED)

    return publish_token


@cuda.jit(device=True)
def publish_counter_before_token(state, output_tokens, generated, finish_reason, slot, token,
                                 last):
    count = generated[slot]
    store_release(generated, slot, count + 1)  # a reader may see the count before the token
    output_tokens[slot, count] = token
    if count == 0:
        store_release(state, slot, DECODE_PROCESSING)
    if last:
        store_release(finish_reason, slot, FINISH_LENGTH)
        store_release(state, slot, DECODE_COMPLETED)


# --- Lab 3 ----------------------------------------------------------------------------------------
def decodes_including_prefills(ctx, budget):
    for seq in list(ctx.running):  # no is_decoding check: prefilling sequences get 1 token
        if budget == 0:
            break
        while not ctx.fits(seq, 1):
            if ctx.preempt_newest() is seq:
                return budget
        ctx.run(seq, 1)
        budget -= 1
    return budget


def chunk_ignoring_memory(ctx, seq, budget):
    return min(seq.num_uncached_tokens, budget)


def prompts_admitting_after_a_preemption(ctx, budget, admit_new):
    _solution(3).schedule_prompts(ctx, budget, True)  # admit_new ignored


# --- Lab 4 ----------------------------------------------------------------------------------------
def mark_the_tail_too(states, table, old_tokens, new_tokens, block_size):
    filled = [table[i] for i in range(old_tokens // block_size,
                                      min(-(-new_tokens // block_size), len(table)))]
    for blk in filled:
        states[blk] = _solution(4).SYNCED
    return filled


def written_but_still_mirrored(mirrored, pending_out, old_tokens, new_tokens, block_size):
    for i in range(old_tokens // block_size, new_tokens // block_size):
        pending_out.add(i)  # the host copies of the touched blocks are stale, yet kept


def rotate_out_everything(num_blocks, mirrored):
    return list(range(num_blocks))


def plan_without_merging(gpu_blocks, host_blocks):
    return sorted((h, [g]) for g, h in zip(gpu_blocks, host_blocks))


# --- Lab 5 ----------------------------------------------------------------------------------------
def vlt_without_alpha(request, now, config):
    if request.state == ROTARY:
        last = request.arrival_time if math.isnan(request.last_token_time) else \
            request.last_token_time
        return max(0.0, now - last - config.beta_b * config.tbt_slo_s)
    return _solution(5).vlt(request, now, config)


def rank_smallest_first(view, config):
    vlt = _solution(5).vlt
    return sorted(view.requests, key=lambda r: vlt(r, view.now, config))  # the minus forgotten


def decide_without_the_transfer_budget(view, config):
    """The capacity bounded only by what rotating out could free, not by the link's budget."""
    return _solution(5).lvf_decide(view, config.replace(transfer_budget_blocks=10**9))


MUTANTS = [
    Mutant("1.1", "the sum of squares instead of their mean", {"inv_rms": inv_rms_sum_not_mean}),
    Mutant("1.2", "no bias", {"rmsnorm_gemv_kernel": Relaunched(
        _solution(1).rmsnorm_gemv_kernel, _gemv_without_bias)}),
    Mutant("1.2", "row r of x instead of row x_rows[r]", {"rmsnorm_gemv_kernel": Relaunched(
        _solution(1).rmsnorm_gemv_kernel, _gemv_on_rows_0_to_r)}),
    Mutant("1.3", "kv head h % K (grouped-query attention maps h // (H // K))",
           {"paged_attention_kernel": Relaunched(_solution(1).paged_attention_kernel,
                                                 _attention_kv_head_modulo)}),
    Mutant("1.3", "block c // B of the pool, not of the block table",
           {"paged_attention_kernel": Relaunched(_solution(1).paged_attention_kernel,
                                                 _attention_without_block_table)}),
    Mutant("2.1", "None instead of False when the CAS loses",
           {"slot_cas": slot_cas_returning_nothing_when_it_loses}),
    Mutant("2.2", "claims a slot whatever its state", {"claim_slot": claim_any_slot}),
    Mutant("2.3", "no finish reason on the last token",
           {"publish_token": _publish_without_the_finish_reason()}),
    Mutant("2.3", "the counter before the token", {"publish_token": publish_counter_before_token}),
    Mutant("3.1", "prefilling sequences decoded too",
           {"schedule_decodes": decodes_including_prefills}),
    Mutant("3.2", "the chunk ignores the KV pool", {"prompt_chunk": chunk_ignoring_memory}),
    Mutant("3.3", "new prompts admitted in a step that preempted (admit_new ignored)",
           {"schedule_prompts": prompts_admitting_after_a_preemption}),
    Mutant("4.1", "the partly filled tail marked SYNCED", {"mark_written": mark_the_tail_too}),
    Mutant("4.2", "written blocks keep their (stale) host copies",
           {"on_written": written_but_still_mirrored}),
    Mutant("4.3", "a rotate-out moves every block",
           {"blocks_to_rotate_out": rotate_out_everything}),
    Mutant("4.4", "one copy per block, runs never merged",
           {"plan_batched_copy": plan_without_merging}),
    Mutant("5.1", "a rotary request's lag without alpha", {"vlt": vlt_without_alpha}),
    Mutant("5.2", "the smallest VLT first", {"rank_by_vlt": rank_smallest_first}),
    Mutant("5.3", "no transfer budget in the capacity",
           {"lvf_decide": decide_without_the_transfer_budget}),
]
