"""Lab 3 — continuous batching with inline (chunked) prefill under a token budget.

Read first: ``notebooks/labs/lab3_batching.ipynb`` and the docstring of
``blink_edu/engine/scheduler.py`` (the rules, in words). Check your work with::

    python -m blink_edu.labs check 3

Every engine step runs ONE flat batch of tokens (``executors/step.py``): one token for each sequence
that is decoding, plus prompt chunks — "inline prefill", no separate prefill step — and at most
``max_num_batched_tokens`` tokens in all (the *budget*). Your functions decide who runs and how
many tokens each; ``blink_edu.labs.plug.lab3.LabScheduler`` calls them once per step, inside
``LLMEngine``, and the tests check that the engine then produces exactly the NumPy reference's
tokens.

What you are given — ``ctx``, a ``StepContext`` for this step:

* ``ctx.running``: the running sequences, oldest admission first (a list; read only);
* ``ctx.waiting``: the waiting queue, front first (read only);
* ``ctx.max_num_seqs``: how many sequences may run at once;
* ``ctx.fits(seq, n)``: True if the KV pool has room for ``n`` more tokens of ``seq``;
* ``ctx.run(seq, n)``: run ``n`` tokens of ``seq`` in this step (its KV blocks are taken now);
* ``ctx.preempt_newest()``: preempt the most recently admitted running sequence *by
  recompute* — it leaves ``running``, its KV blocks are freed, it goes to the front of
  ``waiting`` (keeping its tokens) — and return it;
* ``ctx.admit(seq)``: move ``seq``, the front of ``waiting``, to the end of ``running``.

And a sequence ``seq`` (``engine/sequence.py``): ``seq.is_decoding`` (it needs exactly one
token: its last sampled one), ``seq.num_uncached_tokens`` (tokens the model has not seen yet: the
rest of its prompt, or everything again after a preemption).
"""

from __future__ import annotations


# --- Lab 3.1 ------------------------------------------------------------------------------------
def schedule_decodes(ctx, budget: int) -> int:
    """Decodes first: give every running sequence that ``is_decoding`` its one token, oldest
    first, while budget is left. Returns the budget left.

    Walk ``ctx.running`` *by index* (it shrinks when you preempt). For each decoding sequence
    (skip the others: they are part-way through a prompt, Lab 3.3 continues them):

    * stop when the budget is 0;
    * while the pool has no room for its one token (``not ctx.fits(seq, 1)``), preempt the newest
      running sequence (``ctx.preempt_newest()``). If the victim is ``seq`` itself, stop: nobody
      after it is left;
    * then ``ctx.run(seq, 1)`` and spend one token of the budget.
    """
    # TODO: Lab 3.1
    raise NotImplementedError("Lab 3.1: schedule_decodes")


# --- Lab 3.2 ------------------------------------------------------------------------------------
def prompt_chunk(ctx, seq, budget: int) -> int:
    """How many of ``seq``'s uncached tokens to run now: as many as the budget allows
    (``min(seq.num_uncached_tokens, budget)``) — or 0 if the KV pool has no room for them."""
    # TODO: Lab 3.2
    raise NotImplementedError("Lab 3.2: prompt_chunk")


# --- Lab 3.3 ------------------------------------------------------------------------------------
def schedule_prompts(ctx, budget: int, admit_new: bool) -> None:
    """Then prompts, FCFS: fill what is left of the budget with prompt chunks (use
    ``prompt_chunk``; a chunk of 0 means "stop here": nobody may overtake).

    1. First every running sequence that is not decoding (part-way through its prompt), in
       order: run its chunk.
    2. Then, only if ``admit_new`` (False when this step had to preempt), admit from the front of
       ``ctx.waiting`` while fewer than ``ctx.max_num_seqs`` sequences run: compute the front
       sequence's chunk; if it is 0, stop; otherwise ``ctx.admit`` it and ``ctx.run`` the chunk.

    A prompt longer than the budget left is cut (chunked prefill): its next chunk runs next step.
    """
    # TODO: Lab 3.3
    raise NotImplementedError("Lab 3.3: schedule_prompts")
