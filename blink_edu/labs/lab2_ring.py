"""Lab 2 — the ring buffer: the slot state machine, CAS claims, and publishing tokens.

Read first: ``notebooks/labs/lab2_ring.ipynb`` and ``blink_edu/ring/layout.py`` (the state
diagram, ``TRANSITIONS``, the publish order). Check your work with::

    python -m blink_edu.labs check 2

Where your code runs (``blink_edu.labs.plug.lab2``):

* ``slot_cas`` (2.1) becomes ``Ring.cas`` of a ``LabRing``: every state change of every slot —
  the frontend's ``RingClient`` reserving, handing over and releasing slots, and the engine's
  host loop (``engine/ring_loop.py``) claiming and completing them — goes through it, while real
  requests are served by ``LLMEngine``.
* ``claim_slot`` (2.2) and ``publish_token`` (2.3) are device functions called by a small
  *persistent polling kernel*: launched once, it loops until the host raises a stop flag; each of
  its threads scans every slot of the ring, and all of them race to claim each PREFILL_PENDING
  slot. The winner serves the request (a toy model: it echoes the prompt backwards) and publishes
  each token with your ``publish_token`` while the frontend polls.

Slot states (``ring.layout``): EMPTY, FILLING, PREFILL_PENDING, PREFILL_PROCESSING,
DECODE_PROCESSING, DECODE_COMPLETED, DECODE_PAUSED.
"""

from __future__ import annotations

from ..kernels.reduce import cuda
from ..kernels.sync import load_acquire, store_release  # noqa: F401 - for your device functions
from ..ring.layout import (DECODE_COMPLETED, DECODE_PROCESSING, FINISH_LENGTH,  # noqa: F401
                           PREFILL_PENDING, PREFILL_PROCESSING, STATE_NAMES, TRANSITIONS)


# --- Lab 2.1 ------------------------------------------------------------------------------------
def slot_cas(ring, slot: int, expected: int, new: int) -> bool:
    """Compare-and-swap the state word of ``slot`` on the host.

    * If ``(expected, new)`` is not a move of the state machine (``TRANSITIONS``), raise
      ``ValueError`` (say which move, e.g. with ``STATE_NAMES``) and change nothing.
    * Otherwise, *while holding* ``ring.lock()`` (a context manager: ``with ring.lock(): ...``),
      compare ``ring.state[slot]`` with ``expected``: if equal, write ``new`` and return True;
      if not, change nothing and return False.

    The lock is what makes the read and the write one atomic step: two frontends racing for
    the same EMPTY slot must not both see EMPTY and both win.
    """
    # TODO: Lab 2.1
    raise NotImplementedError("Lab 2.1: slot_cas")


# --- Lab 2.2 ------------------------------------------------------------------------------------
@cuda.jit(device=True)
def claim_slot(state, slot):
    """The polling kernel's claim: move ``state[slot]`` from PREFILL_PENDING to
    PREFILL_PROCESSING and return True if *this thread* made the move, False otherwise.

    Many threads call this for the same slot at the same time. Use one atomic compare-and-swap:
    ``cuda.atomic.cas(state, slot, old, new)`` writes ``new`` only if ``state[slot] == old``, and
    returns what ``state[slot]`` held before — so exactly one caller sees ``old`` come back.
    (A plain "if state[slot] == PENDING: state[slot] = PROCESSING" lets two threads both win.)
    """
    # TODO: Lab 2.2
    raise NotImplementedError("Lab 2.2: claim_slot")


# --- Lab 2.3 ------------------------------------------------------------------------------------
@cuda.jit(device=True)
def publish_token(state, output_tokens, generated, finish_reason, slot, token, last):
    """Make one new token of the request in ``slot`` visible to the frontend, in this order:

    1. ``n = generated[slot]`` (how many are published already); write the token into the
       arena: ``output_tokens[slot, n] = token``;
    2. then publish the counter: ``store_release(generated, slot, n + 1)`` — a frontend that
       reads ``generated`` first and the arena after must never see a counter ahead of its token;
    3. then, for the first token (n == 0), the state: PREFILL_PROCESSING -> DECODE_PROCESSING
       (``store_release(state, slot, DECODE_PROCESSING)``);
    4. if ``last`` (1 for the request's final token): the finish reason first,
       ``store_release(finish_reason, slot, FINISH_LENGTH)``, then the state the frontend polls
       for: ``store_release(state, slot, DECODE_COMPLETED)``.

    Only the engine's thread that claimed the slot calls this, so no atomics are needed here —
    only the order.
    """
    # TODO: Lab 2.3
    raise NotImplementedError("Lab 2.3: publish_token")
