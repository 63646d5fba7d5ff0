"""Simulator presets: a model on a machine — its step-time model, KV geometry, link and load.

docs/design.md §4 and §6; SuperInfer §5 (evaluation: Qwen2.5-32B on a GH200, ShareGPT). What each
figure rests on is written next to it; where the paper text we hold gives no number, the figure
is derived from the hardware and the model's shape, and says so.

* ``qwen2.5-32b-gh200``    — the paper's setting: 64 layers, 8 KV heads, head_dim 128, 16-token
                             blocks (4 MiB per block); GH200 (96 GB HBM3, NVLink-C2C).
* ``qwen2.5-32b-h200-pcie`` — the same model on this project's H200 (141 GB HBM3e, PCIe Gen5).
* ``bundled-h200``          — the bundled 7.3M-parameter model on the H200, with a KV pool small
                             enough to force rotation (the real-engine experiment's setting).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..config import PUBLISHED_RESULTS_DIR
from ..sched.vlt import RotaSchedConfig
from .costs import GB, KiB, MiB, BandwidthCurve, CostModel, fit_linear, kv_block_bytes
from .workload import LengthModel

# --- links (one-way GB/s against copy size; both-ways total) ------------------------------------

#: PCIe Gen5 x16 on the H200, pinned host memory (docs/design.md §4, measured): 64 KiB 14–21 GB/s,
#: 1 MiB 48–50, >= 8 MiB 54–55; both ways at once 95–100 total. Mid-points of the ranges.
PCIE_H200 = BandwidthCurve(sizes_bytes=(64 * KiB, 1 * MiB, 8 * MiB), gbps=(17.5, 49.0, 54.5),
                           duplex_total_gbps=97.5)

#: NVLink-C2C on the GH200 for block-first, batched copies (SuperInfer Table 1 via docs/design.md §6):
#: a lone 64 KiB segment ~10 GB/s, merged 4 MiB blocks 80–134, batched copies (>= 8 MiB)
#: 239–270 one way; both ways at once 181 + 179.
C2C_GH200 = BandwidthCurve(sizes_bytes=(64 * KiB, 4 * MiB, 8 * MiB, 64 * MiB),
                           gbps=(10.0, 107.0, 239.0, 254.5), duplex_total_gbps=360.0)

# --- Qwen2.5-32B --------------------------------------------------------------------------------

QWEN32B_PARAMS = 32.8e9
QWEN32B_WEIGHT_BYTES = QWEN32B_PARAMS * 2  # bf16
QWEN32B_BLOCK_BYTES = kv_block_bytes(num_layers=64, num_kv_heads=8, head_dim=128, block_size=16,
                                     dtype_bytes=2)  # = 4 MiB
HOPPER_BF16_TFLOPS = 989.0  # dense, H100/H200/GH200


def qwen32b_cost(hbm_tb_per_s: float, link: BandwidthCurve, hbm_efficiency: float = 0.8,
                 mfu: float = 0.5) -> CostModel:
    """Step-time model from the hardware (not from a measurement; the paper text we hold has no
    step-time table): a = weights / effective HBM bandwidth; b = 2 * params FLOPs per token at
    ``mfu`` of dense bf16 peak; c = one token's KV (256 KiB) per effective HBM bandwidth."""
    hbm = hbm_tb_per_s * 1e12 * hbm_efficiency
    return CostModel(fixed_s=QWEN32B_WEIGHT_BYTES / hbm,
                     per_token_s=2 * QWEN32B_PARAMS / (HOPPER_BF16_TFLOPS * 1e12 * mfu),
                     per_context_token_s=QWEN32B_BLOCK_BYTES / 16 / hbm,
                     block_bytes=QWEN32B_BLOCK_BYTES, link=link)


def kv_blocks_left(hbm_gb: float, block_bytes: int, utilization: float = 0.9,
                   activations_gb: float = 4.0) -> int:
    """vLLM's sizing: ``utilization`` of HBM, less the weights and an activation reserve."""
    return int((hbm_gb * 1e9 * utilization - QWEN32B_WEIGHT_BYTES - activations_gb * 1e9)
               // block_bytes)


#: ShareGPT-like lengths for the Qwen presets (log-normal; means close to ShareGPT's
#: conversation turns with long prompts kept, as SuperInfer's memory-pressure runs need).
QWEN_LENGTHS = LengthModel(input_mean=1024, input_sigma=0.9, output_mean=384, output_sigma=0.8,
                           max_model_len=8192)


@dataclass(frozen=True)
class Preset:
    """A model on a machine, and the load to sweep."""

    name: str
    description: str
    cost: CostModel
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    transfer_budget_blocks: int  # B_xfer for the RotaSched policies on this link
    lengths: LengthModel
    rates: tuple[float, ...]  # the request rates a sweep visits (req/s)
    num_requests: int  # requests per run of a sweep
    block_size: int = 16
    ttft_slo_s: float = 5.0  # S_F (SuperInfer's default)
    tbt_slo_s: float = 0.1  # S_B
    sources: dict = field(default_factory=dict)  # where each figure comes from

    def rotasched_config(self, **changes) -> RotaSchedConfig:
        """RotaSched parameters for this preset: the paper's alpha/betas, this preset's SLOs and
        transfer budget; ``changes`` override any of them."""
        base = RotaSchedConfig(ttft_slo_s=self.ttft_slo_s, tbt_slo_s=self.tbt_slo_s,
                               transfer_budget_blocks=self.transfer_budget_blocks)
        return base.replace(**changes)

    @property
    def drain_s(self) -> float:
        """How long after the last arrival a run may go on: S_F + mean output length x S_B,
        the time a last request of average length needs when served exactly at both SLOs.
        A run with requests left by then has not *completed* (they count as misses)."""
        return self.ttft_slo_s + self.lengths.output_mean * self.tbt_slo_s

    def as_dict(self) -> dict:
        c = self.cost
        return {"name": self.name, "description": self.description,
                "num_gpu_blocks": self.num_gpu_blocks, "block_size": self.block_size,
                "block_bytes": c.block_bytes, "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "transfer_budget_blocks": self.transfer_budget_blocks,
                "step_fixed_s": c.fixed_s, "step_per_token_s": c.per_token_s,
                "step_per_context_token_s": c.per_context_token_s,
                "step_per_move_s": c.per_move_s, "step_per_decision_s": c.per_decision_s,
                "step_per_mirror_step_s": c.per_mirror_step_s,
                "step_per_seq_s": c.per_seq_s, "step_padded": c.padded,
                "link_sizes_bytes": list(c.link.sizes_bytes), "link_gbps": list(c.link.gbps),
                "link_duplex_total_gbps": c.link.duplex_total_gbps,
                "lengths": self.lengths.__dict__, "rates": list(self.rates),
                "num_requests": self.num_requests, "ttft_slo_s": self.ttft_slo_s,
                "tbt_slo_s": self.tbt_slo_s, "drain_s": self.drain_s, "sources": self.sources}


def qwen_gh200() -> Preset:
    blocks = kv_blocks_left(96, QWEN32B_BLOCK_BYTES)
    return Preset(
        name="qwen2.5-32b-gh200",
        description="Qwen2.5-32B (bf16) on a GH200: 96 GB HBM3 at 4 TB/s, NVLink-C2C to Grace",
        cost=qwen32b_cost(4.0, C2C_GH200), num_gpu_blocks=blocks, max_num_seqs=256,
        max_num_batched_tokens=512, transfer_budget_blocks=2400, lengths=QWEN_LENGTHS,
        rates=(2.0, 2.5, 2.75, 3.0, 3.25, 3.5, 4.0), num_requests=300,
        sources={
            "geometry": "SuperInfer §5 via docs/design.md §6: 64 layers, 8 KV heads, head_dim 128, "
                        "16-token blocks -> 4 MiB per block",
            "kv_blocks": "derived: 0.9 x 96 GB - 65.6 GB bf16 weights - 4 GB activations",
            "step_time": "derived from the hardware (qwen32b_cost): not in the paper text we hold",
            "link": "SuperInfer Table 1 via docs/design.md §6 (batched 239-270 GB/s, duplex 181+179)",
            "transfer_budget": "SuperInfer default B_xfer = 2400 blocks/iteration (docs/design.md §6)",
            "max_num_batched_tokens": "assumed: a chunked-prefill budget that keeps a mixed step "
                                      "under the 100 ms TBT SLO",
            "lengths": "assumed ShareGPT-like log-normal (see QWEN_LENGTHS)"})


def qwen_h200_pcie() -> Preset:
    cost = qwen32b_cost(4.8, PCIE_H200)
    blocks = kv_blocks_left(141, QWEN32B_BLOCK_BYTES)
    # B_xfer: blocks the link moves in one fixed step time (transfers hide under compute).
    budget = int(cost.fixed_s * PCIE_H200.gbps[-1] * GB // QWEN32B_BLOCK_BYTES)
    return Preset(
        name="qwen2.5-32b-h200-pcie",
        description="Qwen2.5-32B (bf16) on an H200: 141 GB HBM3e at 4.8 TB/s, PCIe Gen5 x16",
        cost=cost, num_gpu_blocks=blocks, max_num_seqs=256, max_num_batched_tokens=512,
        transfer_budget_blocks=budget, lengths=QWEN_LENGTHS,
        rates=(3.0, 4.0, 5.0, 6.0, 7.0, 8.0), num_requests=300,
        sources={"link": "measured on this project's H200 (docs/design.md §4)",
                 "kv_blocks": "derived: 0.9 x 141 GB - weights - 4 GB",
                 "step_time": "derived from the hardware (qwen32b_cost)",
                 "transfer_budget": "derived: blocks the link moves in one fixed step time"})


# --- the bundled model --------------------------------------------------------------------------

BUNDLED_LAYERS, BUNDLED_HIDDEN = 8, 256
BUNDLED_BLOCK_BYTES = kv_block_bytes(num_layers=8, num_kv_heads=4, head_dim=32, block_size=16,
                                     dtype_bytes=4)  # float32 KV pool = 128 KiB


def bundled_step_model(results_dir: Path = PUBLISHED_RESULTS_DIR) -> tuple[float, float, str]:
    """(a, b, how) for the bundled model's graph-executor decode step on the H200.

    Calibrated from ``bench/results/decode.json``: its rows for the bundled model when it has
    them (a key whose label names the bundled model); otherwise from the 135M-shape rows, with
    a and b scaled by the ratio of per-step weight work (layers x hidden^2) — an assumption, said
    so in the returned ``how``."""
    path = results_dir / "decode.json"
    raw = json.loads(path.read_text())["raw"] if path.exists() else {}
    for key, entry in raw.items():
        label = str(entry.get("label", key)).lower()
        if "bundled" in label or "7m" in label or "7.3m" in label:
            rows = [r for r in entry.get("rows", []) if r.get("executor") == "graph" and r.get("batch")]
            if rows:
                a, b = fit_linear([r["batch"] for r in rows], [r["tpot_us"] * 1e-6 for r in rows])
                return a, b, f"fitted to decode.json[{key!r}] graph rows"
    for key, entry in raw.items():
        rows = [r for r in entry.get("rows", []) if r.get("executor") == "graph" and r.get("batch")]
        if rows and "135m" in str(entry.get("label", key)).lower():
            a, b = fit_linear([r["batch"] for r in rows], [r["tpot_us"] * 1e-6 for r in rows])
            scale = (BUNDLED_LAYERS * BUNDLED_HIDDEN ** 2) / (30 * 576 ** 2)
            return (a * scale, b * scale,
                    f"decode.json[{key!r}] graph rows (SmolLM2-135M shape), fitted, scaled by "
                    f"layers x hidden^2 = {scale:.3f}: no bundled-model rows yet")
    # Nothing measured: docs/design.md §4's minimal torch + CUDA graph step for this very shape.
    return 773e-6, 2e-6, "docs/design.md §4 (773 us/step, 8 layers x hidden 256): no decode.json"


def bundled_h200(results_dir: Path = PUBLISHED_RESULTS_DIR) -> Preset:
    a, b, how = bundled_step_model(results_dir)
    cost = CostModel(fixed_s=a, per_token_s=b, per_context_token_s=BUNDLED_BLOCK_BYTES / 16 / 4.3e12,
                     block_bytes=BUNDLED_BLOCK_BYTES, link=PCIE_H200)
    budget = max(1, int(a * PCIE_H200.bandwidth_gbps(8 * MiB) * GB // BUNDLED_BLOCK_BYTES))
    return Preset(
        name="bundled-h200", description="the bundled 7.3M-parameter model on the H200 (PCIe), "
                                         "a 96-block KV pool that forces rotation",
        cost=cost, num_gpu_blocks=96, max_num_seqs=64, max_num_batched_tokens=512,
        transfer_budget_blocks=budget,
        lengths=LengthModel(input_mean=128, input_sigma=0.7, output_mean=96, output_sigma=0.7,
                            max_model_len=512),
        rates=(80.0, 100.0, 120.0, 140.0, 160.0, 180.0), num_requests=300,
        tbt_slo_s=round(5 * a, 4), ttft_slo_s=round(250 * a, 3),
        sources={"slos": "scaled like the paper's to the step: S_B = 5 x fixed step (100 ms vs "
                         "~20 ms for Qwen2.5-32B), S_F = 50 x S_B (5 s vs 100 ms)",
                 "step_time": how, "link": "measured PCIe (docs/design.md §4)",
                 "kv_pool": "assumed: small enough to force rotation (as in ``bench.slo --real``)",
                 "block_bytes": "8 layers x 2 x 16 x 4 KV heads x 32 x float32 = 128 KiB",
                 "per_context_token_s": "assumed: KV bytes at the H200's 4.3 TB/s copy bandwidth"})


PRESETS = {"qwen2.5-32b-gh200": qwen_gh200, "qwen2.5-32b-h200-pcie": qwen_h200_pcie,
           "bundled-h200": bundled_h200}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown simulator preset {name!r}; choose one of "
                         f"{', '.join(PRESETS)}") from None
