"""The CPU executor: runs each step through the NumPy reference model (docs/design.md §3).

It is what ``generate`` and the server use on a machine without a GPU — the simulator would be far
too slow for interactive use — and the oracle the kernel executors are compared with.

BLAS runs single-threaded here by default: a decode step multiplies a handful of rows by small
matrices, where handing work to other threads costs more than it saves (measured on a 2-core
machine: 85 tokens/s with one thread, 31 with two while another process was busy).
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import ThreadpoolController

from ..kv.pool import allocate_kv_pool
from ..model import reference
from ..model.sampling import sample
from ..model.weights import ModelWeights
from .step import StepBatch


class ReferenceExecutor:
    """An ``Executor`` (``executor.py``) over the NumPy reference model."""

    name = "reference"
    compute_stream = None  # NumPy: no stream to order KV copies against
    buckets = None  # a step runs at its own shape: nothing captured, nothing padded

    def __init__(self, weights: ModelWeights, num_blocks: int, block_size: int = 16,
                 blas_threads: int = 1):
        self.weights = weights
        self.blas_threads = blas_threads
        self._threadpools = ThreadpoolController()
        self.block_size = block_size
        self.kv_pool = allocate_kv_pool(weights.config, num_blocks, block_size,
                                        dtype=weights.embed.dtype)  # (N, L, 2, B, K, E)
        self.logits_out = None  # (S, V) the last step's logits, when it asked for logprobs

    def step(self, batch: StepBatch) -> np.ndarray:
        """Run the model over the flat batch; one sampled token per sequence, (S,) int32."""
        with self._threadpools.limit(limits=self.blas_threads, user_api="blas"):
            logits = reference.forward(self.weights, self.kv_pool, batch.token_ids, batch.positions,
                                       batch.seq_rows, batch.block_tables, batch.logit_rows)  # (S, V)
        logits = batch.adjusted_logits(logits)  # logit_bias and penalties, if any
        self.logits_out = logits if batch.num_logprobs is not None else None
        return np.array([sample(logits[s], batch.sampling_params(s), int(batch.seeds[s]),
                                int(batch.counters[s])) for s in range(batch.num_seqs)], np.int32)
