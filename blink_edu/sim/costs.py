"""Cost model of one serving step and of KV transfers, for the discrete-event simulator.

docs/design.md §4 (PCIe H200 copy bandwidth measured by this project) and §6 (SuperInfer Table 1:
GH200 NVLink-C2C bandwidth for batched, block-first copies; DuplexKV's both-ways figures).

* **step time** — a linear model of one forward pass over a flat batch:
  ``a + b * batched_tokens + s * sequences + c * context_tokens`` seconds, where ``a`` is the
  fixed cost (reading the weights, launches), ``b`` the cost per token in the batch (GEMMs),
  ``s`` the cost per sequence (its logits row and sampling) and ``c`` the cost per token of KV
  that attention reads (all running requests' context). An executor that runs each step at a
  captured shape (``padded``: this project's eager and graph executors, one CUDA graph per
  power-of-two shape) pays for the padded tokens and sequences: 9 sequences cost what 16 do.
* **transfer time** — KV blocks moved in one batched copy per direction per step (DuplexKV). The
  bandwidth of a copy depends on its size (small copies are launch-bound): a piecewise-linear
  curve in log(size) through measured points. When both directions move at once each gets at most
  half of the measured both-ways total.

Steps and transfers overlap (SuperInfer's cross-iteration pipeline), so a step lasts
``max(compute, transfer)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..config import padded_step_shape

KiB, MiB, GB = 1024, 1024 ** 2, 1e9


@dataclass(frozen=True)
class BandwidthCurve:
    """One-way copy bandwidth (GB/s) against copy size (bytes): measured points, interpolated
    linearly in log(size), flat beyond the ends. ``duplex_total_gbps``: both ways at once."""

    sizes_bytes: tuple[float, ...]  # (P,) increasing
    gbps: tuple[float, ...]  # (P,)
    duplex_total_gbps: float

    def bandwidth_gbps(self, size_bytes: float) -> float:
        x = math.log(max(size_bytes, 1.0))
        return float(np.interp(x, np.log(self.sizes_bytes), self.gbps))

    def one_way_s(self, size_bytes: float) -> float:
        if size_bytes <= 0:
            return 0.0
        return size_bytes / (self.bandwidth_gbps(size_bytes) * GB)

    def both_ways_s(self, in_bytes: float, out_bytes: float) -> float:
        """Time to move ``in_bytes`` host->GPU and ``out_bytes`` GPU->host, one batched copy each,
        on two streams at once."""
        if in_bytes <= 0 or out_bytes <= 0:
            return self.one_way_s(in_bytes) + self.one_way_s(out_bytes)
        half = self.duplex_total_gbps / 2
        t_in = in_bytes / (min(self.bandwidth_gbps(in_bytes), half) * GB)
        t_out = out_bytes / (min(self.bandwidth_gbps(out_bytes), half) * GB)
        return max(t_in, t_out)


@dataclass(frozen=True)
class CostModel:
    """Seconds for one step and for the KV transfers that overlap it."""

    fixed_s: float  # a: per step
    per_token_s: float  # b: per batched token
    per_context_token_s: float  # c: per token of KV read by attention
    block_bytes: int  # one KV block (all layers, K and V)
    link: BandwidthCurve
    # host time per request the policy moves (preempt, rotate out, rotate in): bookkeeping on the
    # host's critical path, added to the step, not overlapped (fitted by bench.slo --real)
    per_move_s: float = 0.0
    # host time of a step where a policy the engine describes its requests to decided
    # (``Policy.described``: describe every live request; LVF under pressure also computes VLTs
    # and sorts), also on the critical path (fitted likewise)
    per_decision_s: float = 0.0
    # host time per step of a policy that rotates: DuplexKV's host mirror (land the copies
    # that finished, note the blocks written, issue the eager copy-out of those that filled),
    # also on the critical path (fitted likewise)
    per_mirror_step_s: float = 0.0
    # per sequence in the batch (fitted by bench.slo --real; 0 for the paper-scale presets,
    # where a step's weights and KV reads dwarf a row of logits)
    per_seq_s: float = 0.0
    # steps run at a captured shape: tokens and sequences rounded up (``padded_step_shape``)
    padded: bool = False

    def compute_s(self, batched_tokens: int, context_tokens: int, seqs: int = 0) -> float:
        if batched_tokens <= 0:
            return 0.0
        if self.padded:
            seqs, batched_tokens = padded_step_shape(seqs, batched_tokens)
        return (self.fixed_s + self.per_token_s * batched_tokens + self.per_seq_s * seqs
                + self.per_context_token_s * context_tokens)

    def transfer_s(self, blocks_in: int, blocks_out: int) -> float:
        return self.link.both_ways_s(blocks_in * self.block_bytes, blocks_out * self.block_bytes)

    def step_s(self, batched_tokens: int, context_tokens: int, blocks_in: int = 0,
               blocks_out: int = 0, moves: int = 0, decided: bool = False,
               mirrored: bool = False, seqs: int = 0) -> float:
        """One iteration of ``seqs`` sequences: compute and transfers overlap (cross-iteration
        pipeline); the host's bookkeeping of ``moves`` requests changing state, of a policy's
        decision (``decided``) and of the host mirror (``mirrored``) comes on top."""
        return (max(self.compute_s(batched_tokens, context_tokens, seqs),
                    self.transfer_s(blocks_in, blocks_out)) + self.per_move_s * moves
                + self.per_decision_s * decided + self.per_mirror_step_s * mirrored)


def kv_block_bytes(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                   dtype_bytes: int) -> int:
    """Bytes of one KV block: layers x (K, V) x block_size tokens x kv_heads x head_dim."""
    return num_layers * 2 * block_size * num_kv_heads * head_dim * dtype_bytes


def fit_linear(batch_sizes, step_times_s) -> tuple[float, float]:
    """Least-squares (a, b) of ``step = a + b * batch`` (decode: one token per sequence)."""
    b, a = np.polyfit(np.asarray(batch_sizes, float), np.asarray(step_times_s, float), 1)
    return float(max(a, 0.0)), float(max(b, 0.0))
