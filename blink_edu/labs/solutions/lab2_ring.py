"""Lab 2 reference solution (instructors only)."""

from __future__ import annotations

from ...kernels.reduce import cuda
from ...kernels.sync import load_acquire, store_release  # noqa: F401
from ...ring.layout import (DECODE_COMPLETED, DECODE_PROCESSING, FINISH_LENGTH, PREFILL_PENDING,
                            PREFILL_PROCESSING, STATE_NAMES, TRANSITIONS)


def slot_cas(ring, slot: int, expected: int, new: int) -> bool:
    if (expected, new) not in TRANSITIONS:
        raise ValueError(f"illegal move {STATE_NAMES.get(expected, expected)} -> "
                         f"{STATE_NAMES.get(new, new)}: not in the slot state machine")
    with ring.lock():
        if int(ring.state[slot]) != expected:
            return False
        ring.state[slot] = new
    return True


@cuda.jit(device=True)
def claim_slot(state, slot):
    seen = cuda.atomic.cas(state, slot, PREFILL_PENDING, PREFILL_PROCESSING)
    return seen == PREFILL_PENDING


@cuda.jit(device=True)
def publish_token(state, output_tokens, generated, finish_reason, slot, token, last):
    count = generated[slot]
    output_tokens[slot, count] = token
    store_release(generated, slot, count + 1)
    if count == 0:
        store_release(state, slot, DECODE_PROCESSING)
    if last:
        store_release(finish_reason, slot, FINISH_LENGTH)
        store_release(state, slot, DECODE_COMPLETED)
