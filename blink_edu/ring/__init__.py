"""The ring buffer between frontend and engine (Blink §3): slot layout, states and the client."""

from .client import RingClient, RingFull
from .layout import (DECODE_COMPLETED, DECODE_PAUSED, DECODE_PROCESSING, EMPTY, FILLING,
                     FINISH_CODES, FINISH_REASONS, PREFILL_PENDING, PREFILL_PROCESSING,
                     STATE_NAMES, TRANSITIONS, Ring, RingLayout)

__all__ = ["Ring", "RingLayout", "RingClient", "RingFull", "EMPTY", "FILLING", "PREFILL_PENDING",
           "PREFILL_PROCESSING", "DECODE_PROCESSING", "DECODE_COMPLETED", "DECODE_PAUSED",
           "STATE_NAMES", "TRANSITIONS", "FINISH_REASONS", "FINISH_CODES"]
