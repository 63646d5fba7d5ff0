"""Lab 3 reference solution (instructors only)."""

from __future__ import annotations


def schedule_decodes(ctx, budget: int) -> int:
    idx = 0
    while idx < len(ctx.running) and budget > 0:
        seq = ctx.running[idx]
        idx += 1
        if not seq.is_decoding:
            continue
        preempted_self = False
        while not ctx.fits(seq, 1):
            if ctx.preempt_newest() is seq:
                preempted_self = True
                break
        if preempted_self:
            break
        ctx.run(seq, 1)
        budget -= 1
    return budget


def prompt_chunk(ctx, seq, budget: int) -> int:
    n = min(seq.num_uncached_tokens, budget)
    if n > 0 and ctx.fits(seq, n):
        return n
    return 0


def schedule_prompts(ctx, budget: int, admit_new: bool) -> None:
    partial = [s for s in ctx.running if not s.is_decoding]
    for seq in partial:
        n = prompt_chunk(ctx, seq, budget)
        if n == 0:
            return
        ctx.run(seq, n)
        budget -= n
    if not admit_new:
        return
    while ctx.waiting and len(ctx.running) < ctx.max_num_seqs:
        head = ctx.waiting[0]
        n = prompt_chunk(ctx, head, budget)
        if n == 0:
            return
        ctx.admit(head)
        ctx.run(head, n)
        budget -= n
