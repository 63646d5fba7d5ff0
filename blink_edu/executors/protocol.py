"""What an executor is: the one interface the host engine and the benchmarks rely on.

docs/design.md §2 (three executors, one model; they differ only in who drives the loop). nano-vllm
calls this part the ModelRunner; vLLM v1 its executor and worker. Two kinds share this project:

* ``Executor`` -- **host-driven** (``reference``, ``eager``, ``graph``): ``LLMEngine`` calls
  ``step(batch)`` once per iteration with a ``StepBatch`` and gets one sampled token per
  sequence back. The executor owns the KV pool (the scheduler owns the block tables), so a
  DuplexKV rotation engine (``kv/rotation.py``) copies blocks of ``kv_pool``, ordered against
  ``compute_stream``. ``buckets``: the captured step shapes a kernel executor pads each step to
  (``config.padded_step_shape``), or None when steps run at their own shape.
* ``RingExecutor`` -- **GPU-driven** (``persistent``, ``persistent-graph``, Blink §3): the
  scheduler is a kernel that serves a ring on its own; the host only starts it, watches its
  counters (``stats``, read from host memory without a CUDA call) and stops it. There is no
  ``step``: nobody on the host decides a step.

Declared as ``typing.Protocol``s, so an executor needs no base class: a lab's executor, or a
benchmark's wrapper (``bench.replay.BatchRecorder``), is one as soon as it has these members.
``tests/executors/test_executor.py`` checks that every executor class has them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from .step import StepBatch


@runtime_checkable
class Executor(Protocol):
    """A host-driven executor: ``LLMEngine`` calls ``step`` once per iteration."""

    name: str  # "reference" | "eager" | "graph" (EngineConfig.executor)
    kv_pool: object  # (N, L, 2, B, K, E) the paged KV cache: a NumPy or device array
    block_size: int  # tokens per KV block

    @property
    def compute_stream(self) -> object | None:
        """The stream the model's kernels run on (KV copies order against it); None when
        there is none (NumPy, the simulator)."""

    @property
    def buckets(self) -> object | None:
        """The captured step shapes (``kernel_executor.BucketTable``: ``buckets(S, T)`` gives
        the padded shape), or None when a step runs at its own shape."""

    def step(self, batch: StepBatch) -> np.ndarray:
        """Run the model over the flat batch and sample: (S,) int32, one token per sequence."""


@runtime_checkable
class RingExecutor(Protocol):
    """A GPU-driven executor: a kernel that serves a ring until it is stopped."""

    name: str  # "persistent"
    num_kv_blocks: int  # the kernel's KV pool, in blocks
    max_model_len: int  # the longest request (prompt + output) it admits
    grid_blocks: int | None  # thread blocks of the kernel's grid (None: as many as co-reside)

    def start(self) -> None:
        """Launch the scheduler kernel over the ring (it returns at once)."""

    def alive(self) -> bool:
        """Whether the kernel is still running."""

    def stats(self) -> dict[str, int]:
        """The kernel's counters (steps, running, free_blocks, ...), read from host memory."""

    def stop(self, timeout_s: float = 60.0) -> None:
        """Raise the stop flag and wait for the kernel to return; re-raises its failure."""
