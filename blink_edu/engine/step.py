"""One engine step, as plain arrays: the contract between the scheduler and every executor.

docs/design.md §2. The scheduler decides *what* runs this step and packs it into a ``StepBatch``:
a flat batch of tokens (prefill chunks and decode tokens of several sequences, mixed), each
sequence's block table, and how each sequence samples. An executor — the NumPy reference, eager
kernel launches, replayed CUDA graphs, or a persistent kernel — runs the model over it and returns
one sampled token per sequence. Executors own the KV pool; the scheduler owns the block tables.

Letters: T tokens, S sequences, W block-table width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import SamplingParams, padded_step_shape  # noqa: F401 (the executors' import)


@dataclass
class StepBatch:
    token_ids: np.ndarray  # (T,) int32 the tokens to run
    positions: np.ndarray  # (T,) int32 each token's position in its sequence
    seq_rows: np.ndarray  # (T,) int32 each token's sequence, as a row of block_tables
    block_tables: np.ndarray  # (S, W) int32 block ids, -1 padded
    logit_rows: np.ndarray  # (S,) int32 index into the T tokens of each sequence's last token
    temperature: np.ndarray  # (S,) float32; 0 = greedy
    top_p: np.ndarray  # (S,) float32
    top_k: np.ndarray  # (S,) int32; 0 = off
    seeds: np.ndarray  # (S,) uint32
    counters: np.ndarray  # (S,) int32 how many tokens each sequence has generated so far

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.block_tables.shape[0])

    def sampling_params(self, row: int) -> SamplingParams:
        return SamplingParams(temperature=float(self.temperature[row]), top_p=float(self.top_p[row]),
                              top_k=int(self.top_k[row]))


def pack_step(chunks: list[tuple[list[int], int]], block_tables: np.ndarray,
              params: list[SamplingParams], seeds: list[int], counters: list[int]) -> StepBatch:
    """Build a StepBatch from per-sequence ``(tokens, first_position)`` chunks, in row order."""
    ids, pos, rows, last = [], [], [], []
    for row, (tokens, start) in enumerate(chunks):
        ids += tokens
        pos += range(start, start + len(tokens))
        rows += [row] * len(tokens)
        last.append(len(ids) - 1)
    i32 = np.int32
    return StepBatch(
        token_ids=np.asarray(ids, i32), positions=np.asarray(pos, i32), seq_rows=np.asarray(rows, i32),
        block_tables=np.ascontiguousarray(block_tables, i32), logit_rows=np.asarray(last, i32),
        temperature=np.asarray([p.temperature for p in params], np.float32),
        top_p=np.asarray([p.top_p for p in params], np.float32),
        top_k=np.asarray([p.top_k for p in params], i32),
        seeds=np.asarray(seeds, np.uint32), counters=np.asarray(counters, i32),
    )
