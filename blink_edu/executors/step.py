"""One engine step, as plain arrays: the contract between the scheduler and every executor.

docs/design.md §2. The scheduler decides *what* runs this step and packs it into a ``StepBatch``:
a flat batch of tokens (prefill chunks and decode tokens of several sequences, mixed), each
sequence's block table, and how each sequence samples. An executor — the NumPy reference, eager
kernel launches, replayed CUDA graphs, or a persistent kernel — runs the model over it and returns
one sampled token per sequence. Executors own the KV pool; the scheduler owns the block tables.

Letters: T tokens, S sequences, W block-table width, P logit adjustments of the row with most.

**Logit adjustments** (``logit_bias`` and the presence/frequency penalties, ``model/sampling.py``)
travel as a padded list of ``(token, delta)`` pairs per row -- ``adjust_ids`` / ``adjust_deltas``
(S, P) with ``adjust_len`` (S,) valid entries each, built on the host from each sequence's
generated tokens -- and every executor adds them to the logits before sampling. A step in which
no sequence asks for one carries ``adjust_len = None``: no arrays, no extra work.

**Log-probabilities**: when some row asks (``num_logprobs``), the executor also leaves the
step's (adjusted) logits, (S, V) float32 on the host, in its ``logits_out``; the engine computes
the log-probabilities there (``model.sampling.token_logprobs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import SamplingParams, padded_step_shape  # noqa: F401 (the executors' import)
from ..model.sampling import add_adjustments, logit_adjustments


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
    adjust_ids: np.ndarray | None = None  # (S, P) int32 tokens whose logit changes, each once
    adjust_deltas: np.ndarray | None = None  # (S, P) float32 what is added to them
    adjust_len: np.ndarray | None = None  # (S,) int32 valid pairs per row; None: none anywhere
    # (S,) int32 how many top log-probabilities each row reports (-1: none; 0: the chosen
    # token's only); None: no row asks, and the executor keeps no logits for them
    num_logprobs: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.block_tables.shape[0])

    def sampling_params(self, row: int) -> SamplingParams:
        return SamplingParams(temperature=float(self.temperature[row]), top_p=float(self.top_p[row]),
                              top_k=int(self.top_k[row]))

    def adjusted_logits(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (S, V) float32 with each row's adjustments added (itself when none)."""
        if self.adjust_len is None:
            return logits
        out = logits.astype(np.float32)  # (S, V)
        for row, n in enumerate(self.adjust_len.tolist()):
            out[row] = add_adjustments(out[row], self.adjust_ids[row, :n],
                                       self.adjust_deltas[row, :n])
        return out


def pack_adjustments(params: list[SamplingParams], outputs: list[list[int]]):
    """(adjust_ids (S, P), adjust_deltas (S, P), adjust_len (S,)) for these rows, or three Nones
    when no row adjusts its logits."""
    if not any(p.adjusts_logits for p in params):
        return None, None, None
    pairs = [logit_adjustments(p, out) if p.adjusts_logits else (np.empty(0, np.int32),) * 2
             for p, out in zip(params, outputs)]
    width = max(1, max(len(ids) for ids, _ in pairs))
    ids = np.zeros((len(pairs), width), np.int32)  # (S, P)
    deltas = np.zeros((len(pairs), width), np.float32)  # (S, P)
    for row, (row_ids, row_deltas) in enumerate(pairs):
        ids[row, :len(row_ids)], deltas[row, :len(row_ids)] = row_ids, row_deltas
    return ids, deltas, np.array([len(i) for i, _ in pairs], np.int32)


def pack_step(chunks: list[tuple[list[int], int]], block_tables: np.ndarray,
              params: list[SamplingParams], seeds: list[int], counters: list[int],
              outputs: list[list[int]] | None = None) -> StepBatch:
    """Build a StepBatch from per-sequence ``(tokens, first_position)`` chunks, in row order;
    ``outputs``: each sequence's generated tokens (needed only for the penalties)."""
    ids, pos, rows, last = [], [], [], []
    for row, (tokens, start) in enumerate(chunks):
        ids += tokens
        pos += range(start, start + len(tokens))
        rows += [row] * len(tokens)
        last.append(len(ids) - 1)
    i32 = np.int32
    adjust_ids, adjust_deltas, adjust_len = pack_adjustments(
        params, outputs if outputs is not None else [[] for _ in params])
    num_logprobs = None
    if any(p.logprobs is not None for p in params):
        num_logprobs = np.array([-1 if p.logprobs is None else p.logprobs for p in params], i32)
    return StepBatch(
        token_ids=np.asarray(ids, i32), positions=np.asarray(pos, i32), seq_rows=np.asarray(rows, i32),
        block_tables=np.ascontiguousarray(block_tables, i32), logit_rows=np.asarray(last, i32),
        temperature=np.asarray([p.temperature for p in params], np.float32),
        top_p=np.asarray([p.top_p for p in params], np.float32),
        top_k=np.asarray([p.top_k for p in params], i32),
        seeds=np.asarray(seeds, np.uint32), counters=np.asarray(counters, i32),
        adjust_ids=adjust_ids, adjust_deltas=adjust_deltas, adjust_len=adjust_len,
        num_logprobs=num_logprobs,
    )
