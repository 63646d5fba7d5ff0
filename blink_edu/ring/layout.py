"""The ring buffer: N request slots in one shared buffer, each owned by whoever its state says.

Blink §3 ("Communication: GPU-resident lock-free ring buffer with per-slot state machine") and
docs/design.md §2. The frontend (Blink's DPU) and the engine (Blink's persistent GPU scheduler) never
call each other: they meet only here. Each slot carries one request — its prompt, its sampling
parameters, and the tokens generated so far — and one *state word* saying who owns the slot now:

    frontend                              engine
    --------                              ------
    EMPTY ──cas──> FILLING                          (reserve: this frontend alone writes it)
                   FILLING ──cas──> PREFILL_PENDING (payload written; hand over; ring doorbell)
                                    PREFILL_PENDING ──cas──> PREFILL_PROCESSING   (claim)
                                    PREFILL_PROCESSING ──cas──> DECODE_PROCESSING (first token)
                                    DECODE_PROCESSING ──cas──> DECODE_PAUSED      (preempt)
                                    DECODE_PAUSED ──cas──> DECODE_PROCESSING      (resume)
                                    PREFILL_PROCESSING / DECODE_PROCESSING / DECODE_PAUSED
                                        ──cas──> DECODE_COMPLETED  (finish_reason written first)
    DECODE_COMPLETED ──cas──> EMPTY                 (tokens read; release)

The frontend owns EMPTY, FILLING and DECODE_COMPLETED; the engine owns every state in between and
is the only one that advances a slot through them. The one thing a frontend may write into an
engine-owned slot is the ``cancel`` flag. ``FILLING`` is ours, not the paper's: Blink has a single
DPU writer, while we allow several frontend threads and processes, so a frontend must reserve a
slot before writing its payload (otherwise two frontends could both fill the same EMPTY slot).

**Every state change is one compare-and-swap** (``Ring.cas``), so a slot can never be claimed
twice: of two agents racing to move a slot out of a state, exactly one sees its expected value.
On the GPU ``cas`` is ``cuda.atomic.compas`` on a device-memory word (the persistent kernel); on the host it is
made atomic by a process-shared lock (``fcntl.flock`` on a lock file named after the shared-memory
block, plus a ``threading.Lock`` because threads of one process share one open file and ``flock``
would not exclude them from each other).

**Publish order.** A writer fills the payload first (prompt, parameters, an output token) and only
then moves the word the reader polls (the state, or the ``generated`` counter); the reader loads
that word first and the payload after. A reader that sees the new word therefore sees a complete
payload. This needs the stores to become visible in program order: x86 guarantees that for
ordinary stores (TSO), and each ``cas`` here also passes through a lock (a full barrier). Python
itself gives no fence, so on a weakly ordered CPU (Arm) or across PCIe the plain stores would need
a release fence — on the GPU that is ``st.release.sys`` / ``__threadfence_system`` (docs/design.md §5).
Aligned 32- and 64-bit loads and stores do not tear, so a reader never sees half a word.

Memory: structure-of-arrays, one field after another (each aligned to a 64-byte cache line, so
that fields written by different sides never share a line), behind a small header that records
the layout so another process can attach by name alone. Any writable buffer can back a ring:
``multiprocessing.shared_memory`` between host processes, a NumPy array in one process, or a
``cuda.mapped_array`` that a persistent kernel and the host share.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import multiprocessing
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

# --- slot states --------------------------------------------------------------------------------
EMPTY = 0
PREFILL_PENDING = 1
PREFILL_PROCESSING = 2
DECODE_PROCESSING = 3
DECODE_COMPLETED = 4
DECODE_PAUSED = 5  # SuperInfer's "rotary" state: preempted, KV rotated out, waiting to resume
FILLING = 6  # a frontend reserved this slot and is writing its payload (see the module docstring)
STATE_NAMES = {EMPTY: "EMPTY", PREFILL_PENDING: "PREFILL_PENDING",
               PREFILL_PROCESSING: "PREFILL_PROCESSING", DECODE_PROCESSING: "DECODE_PROCESSING",
               DECODE_COMPLETED: "DECODE_COMPLETED", DECODE_PAUSED: "DECODE_PAUSED",
               FILLING: "FILLING"}

# The only moves ``cas`` accepts: (from, to). The diagram above, as data.
TRANSITIONS = frozenset({
    (EMPTY, FILLING), (FILLING, PREFILL_PENDING),                                  # frontend
    (PREFILL_PENDING, PREFILL_PROCESSING), (PREFILL_PROCESSING, DECODE_PROCESSING),  # engine
    (DECODE_PROCESSING, DECODE_PAUSED), (DECODE_PAUSED, DECODE_PROCESSING),
    (PREFILL_PROCESSING, DECODE_COMPLETED), (DECODE_PROCESSING, DECODE_COMPLETED),
    (DECODE_PAUSED, DECODE_COMPLETED),
    (DECODE_COMPLETED, EMPTY),                                                     # frontend
})

# --- finish reasons (the int32 ``finish_reason`` field) -------------------------------------------
FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR = range(5)
FINISH_REASONS = {FINISH_NONE: None, FINISH_STOP: "stop", FINISH_LENGTH: "length",
                  FINISH_ABORT: "abort", FINISH_ERROR: "error"}
FINISH_CODES = {reason: code for code, reason in FINISH_REASONS.items()}

ALIGN = 64  # bytes: one cache line per field start
MAGIC = int.from_bytes(b"BLNKRNG3", "little")  # marks a formatted ring (and its format version)
HEADER = ("magic", "num_slots", "max_prompt_tokens", "max_output_tokens", "max_stop_ids",
          "max_logit_bias", "max_logprobs")  # int64
# int64 each, one cache line each: the frontends ring the doorbell; the engine beats its heartbeat;
# a frontend sets engine_stop to 1 to ask the engine to stop (after draining its requests).
COUNTERS = ("doorbell", "engine_heartbeat", "engine_stop")
# The engine's telemetry, overwritten after every step (engine writes, frontend reads for
# /metrics and /health). Written without a lock: a reader may mix two consecutive steps' values,
# fine for telemetry. ``published`` stays 0 until the engine's first write.
ENGINE_STATS = ("kv_blocks_used", "kv_blocks_free", "num_running", "num_waiting", "num_steps",
                "num_preemptions", "published")


@dataclass(frozen=True)
class Field:
    offset: int  # bytes from the start of the buffer
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class RingLayout:
    """Sizes of the ring; ``fields`` turns them into byte offsets. S = num_slots,
    P = max_prompt_tokens, O = max_output_tokens, T = max_stop_ids, B = max_logit_bias
    (``logit_bias`` entries a request may carry), K = max_logprobs (top log-probabilities per
    token a request may ask for; 0: only the chosen token's). The output arenas take
    ``S * O * (8 + 8K)`` bytes: K is what makes a ring large."""

    num_slots: int = 4096  # S
    max_prompt_tokens: int = 2048  # P
    max_output_tokens: int = 1024  # O
    max_stop_ids: int = 4  # T
    max_logit_bias: int = 64  # B
    max_logprobs: int = 0  # K

    def __post_init__(self):
        for name in ("num_slots", "max_prompt_tokens", "max_output_tokens", "max_stop_ids"):
            if getattr(self, name) < 1:
                raise ValueError(f"RingLayout.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_logit_bias", "max_logprobs"):
            if getattr(self, name) < 0:
                raise ValueError(f"RingLayout.{name} must be >= 0, got {getattr(self, name)}")

    def slot_fields(self) -> dict[str, tuple[type, tuple[int, ...]]]:
        """Per-slot fields: name -> (dtype, shape). Who writes each is noted beside it."""
        S, P = self.num_slots, self.max_prompt_tokens
        O, T = self.max_output_tokens, self.max_stop_ids
        B, K = self.max_logit_bias, self.max_logprobs
        return {
            "state": (np.int32, (S,)),  # both sides, only through Ring.cas
            "request_id": (np.int64, (S,)),  # frontend: its own id for the request
            "arrival_ns": (np.int64, (S,)),  # frontend: time.monotonic_ns() at submit
            "claim_ns": (np.int64, (S,)),  # engine: when it claimed the slot
            "first_token_ns": (np.int64, (S,)),  # engine
            "last_token_ns": (np.int64, (S,)),  # engine
            "prompt_len": (np.int32, (S,)),  # frontend
            "max_tokens": (np.int32, (S,)),  # frontend
            "top_k": (np.int32, (S,)),  # frontend (0 = off)
            "seed": (np.int64, (S,)),  # frontend (-1 = no seed: the engine draws one)
            "temperature": (np.float32, (S,)),  # frontend (0 = greedy)
            "top_p": (np.float32, (S,)),  # frontend
            "stop_ids": (np.int32, (S, T)),  # frontend, -1 padded
            "ignore_eos": (np.int32, (S,)),  # frontend (0/1)
            "presence_penalty": (np.float32, (S,)),  # frontend
            "frequency_penalty": (np.float32, (S,)),  # frontend
            "logit_bias_ids": (np.int32, (S, B)),  # frontend, -1 padded
            "logit_bias_values": (np.float32, (S, B)),  # frontend
            "num_logprobs": (np.int32, (S,)),  # frontend: top logprobs wanted (-1: none)
            "cancel": (np.int32, (S,)),  # frontend only, even while the engine owns the slot
            "generated": (np.int32, (S,)),  # engine: how many output tokens are published
            "finish_reason": (np.int32, (S,)),  # engine: a FINISH_* code
            "prompt_tokens": (np.int32, (S, P)),  # frontend: the prompt arena
            "output_tokens": (np.int32, (S, O)),  # engine: the output arena, append-only
            # engine, when num_logprobs >= 0: each output token's log-probability and the
            # num_logprobs most likely (token, log-probability), written before `generated`
            "output_logprobs": (np.float32, (S, O)),
            "output_top_ids": (np.int32, (S, O, K)),
            "output_top_logprobs": (np.float32, (S, O, K)),
        }

    @cached_property
    def fields(self) -> dict[str, Field]:
        """Every named region of the buffer: the header, the counters, the engine's stats, the
        slot fields."""
        out = {"header": Field(0, np.dtype(np.int64), (len(HEADER),))}
        offset = _align(out["header"].nbytes)
        for name in COUNTERS:
            out[name] = Field(offset, np.dtype(np.int64), ())
            offset += ALIGN
        out["engine_stats"] = Field(offset, np.dtype(np.int64), (len(ENGINE_STATS),))
        offset = _align(offset + out["engine_stats"].nbytes)
        for name, (dtype, shape) in self.slot_fields().items():
            out[name] = Field(offset, np.dtype(dtype), shape)
            offset = _align(offset + out[name].nbytes)
        return out

    @property
    def nbytes(self) -> int:
        """Size of the buffer that holds the whole ring."""
        last = max(self.fields.values(), key=lambda f: f.offset)
        return _align(last.offset + last.nbytes)


def lock_path_for(name: str) -> str:
    """The lock file that makes ``cas`` atomic across processes sharing the ring called ``name``."""
    return os.path.join(tempfile.gettempdir(), f"blink_edu_ring.{name.lstrip('/')}.lock")


_CREATED_HERE: set[str] = set()  # shared-memory names this process created (see Ring.attach)


class Ring:
    """Numpy views of every field of a ring living in ``buffer`` (any writable buffer of at least
    ``layout.nbytes`` bytes). With a ``layout`` the buffer is formatted (zeroed: every slot EMPTY);
    without one, the layout is read from the header of an already formatted buffer.
    ``lock_path``: a file to ``flock`` so that ``cas`` is atomic across processes; without it
    ``cas`` is atomic only among the threads of this process."""

    def __init__(self, buffer, layout: RingLayout | None = None, lock_path: str | None = None,
                 shm: SharedMemory | None = None):
        raw = np.frombuffer(buffer, dtype=np.uint8)  # (bytes,)
        if not raw.flags.writeable:
            raise ValueError("the ring's buffer must be writable")
        if layout is None:
            layout = _read_layout(raw)
        else:
            _format(raw, layout)
        self.layout = layout
        self.raw = raw  # (bytes,) uint8, the whole buffer: every field below is a view of it
        self._shm = shm  # keeps a shared-memory block mapped for as long as the ring lives
        for name, f in layout.fields.items():
            view = raw[f.offset:f.offset + f.nbytes].view(f.dtype).reshape(f.shape)
            setattr(self, name, view)
        # self.state: (S,) int32, ..., self.prompt_tokens: (S, P) int32, self.doorbell: () int64
        self._thread_lock = threading.Lock()
        self._lock_fd = (os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                         if lock_path is not None else None)
        self._lock_path = lock_path

    # --- shared memory by name ---------------------------------------------------------------
    @classmethod
    def create(cls, layout: RingLayout, name: str | None = None) -> "Ring":
        """A new ring in a new shared-memory block (``name=None``: a fresh random name)."""
        shm = SharedMemory(name=name, create=True, size=layout.nbytes)
        _CREATED_HERE.add(shm.name)
        return cls(shm.buf, layout, lock_path_for(shm.name), shm)

    @classmethod
    def attach(cls, name: str) -> "Ring":
        """The ring that another process created as ``name``."""
        shm = SharedMemory(name=name)
        if shm.name not in _CREATED_HERE and multiprocessing.parent_process() is None:
            # Python < 3.13 registers even an *attached* block with this process's resource
            # tracker, which would destroy the ring when this process exits. Only the creator
            # owns it (see unlink). A multiprocessing child shares its parent's tracker, where the
            # creator's registration must stay (it unlinks the ring if the creator is killed).
            resource_tracker.unregister(shm._name, "shared_memory")
        return cls(shm.buf, None, lock_path_for(shm.name), shm)

    @property
    def name(self) -> str | None:
        """The shared-memory name other processes attach with (None for a plain buffer)."""
        return self._shm.name if self._shm is not None else None

    def close(self) -> None:
        """Drop this process's mapping. Views taken from the ring must not outlive it."""
        for name in (*self.layout.fields, "raw"):
            self.__dict__.pop(name, None)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._shm is not None:
            self._shm.close()

    def unlink(self) -> None:
        """Destroy the shared-memory block and its lock file (the creator, when all are done)."""
        if self._shm is not None:
            self._shm.unlink()
            _CREATED_HERE.discard(self._shm.name)
        if self._lock_path is not None and os.path.exists(self._lock_path):
            os.unlink(self._lock_path)

    def reset(self) -> None:
        """Format the ring again: every slot EMPTY, every counter 0 (the layout kept). Only
        for the ring's creator, when no engine is attached and no frontend is writing a slot
        (the server, after its engine died, before it starts the next one)."""
        _format(self.raw, self.layout)

    # --- the atomic primitives ---------------------------------------------------------------
    @contextmanager
    def lock(self):
        """Exclusive access among every thread and process using this ring (host only)."""
        with self._thread_lock:
            if self._lock_fd is None:
                yield
                return
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def cas(self, slot: int, expected: int, new: int) -> bool:
        """Compare-and-swap the state of ``slot``: if it is ``expected``, make it ``new`` and
        return True; otherwise change nothing and return False. ValueError for a move the state
        machine does not have. GPU: ``cuda.atomic.compas``; host: under ``self.lock()``."""
        if (expected, new) not in TRANSITIONS:
            raise ValueError(f"no transition {STATE_NAMES.get(expected, expected)} -> "
                             f"{STATE_NAMES.get(new, new)} in the slot state machine")
        with self.lock():
            if self.state[slot] != expected:
                return False
            self.state[slot] = new
            return True

    def advance(self, slot: int, expected: int, new: int) -> None:
        """``cas`` by the slot's owner, which must succeed: nobody else may move an owned slot."""
        if not self.cas(slot, expected, new):
            raise RuntimeError(f"slot {slot} is {STATE_NAMES.get(int(self.state[slot]))}, not "
                               f"{STATE_NAMES[expected]}: someone moved a slot it did not own")

    def ring_doorbell(self) -> None:
        """Tell the engine that a slot became PREFILL_PENDING (an atomic add: several frontends)."""
        with self.lock():
            self.doorbell[...] += 1


def _format(raw: np.ndarray, layout: RingLayout) -> None:
    if raw.nbytes < layout.nbytes:
        raise ValueError(f"buffer of {raw.nbytes} bytes is too small for the ring "
                         f"({layout.nbytes} bytes)")
    raw[:layout.nbytes] = 0  # every slot EMPTY, every counter 0
    header = raw[:len(HEADER) * 8].view(np.int64)
    header[:] = (MAGIC, layout.num_slots, layout.max_prompt_tokens, layout.max_output_tokens,
                 layout.max_stop_ids, layout.max_logit_bias, layout.max_logprobs)


def _read_layout(raw: np.ndarray) -> RingLayout:
    header = raw[:len(HEADER) * 8].view(np.int64)
    if header[0] != MAGIC:
        raise ValueError("the buffer does not hold a blink_edu ring (bad magic number)")
    layout = RingLayout(*(int(v) for v in header[1:]))
    if raw.nbytes < layout.nbytes:
        raise ValueError(f"buffer of {raw.nbytes} bytes is smaller than its ring's header says "
                         f"({layout.nbytes} bytes)")
    return layout
