"""Configuration: the model's shape (from a Hugging Face ``config.json``), sampling, and the engine.

docs/design.md §2–3. ``ModelConfig`` is read from the same ``config.json`` that Hugging Face
``transformers`` reads, for the Llama family: Llama, Mistral and Qwen2. They share one block —
RMSNorm -> attention with rotary positions (RoPE) and grouped-query heads (GQA) -> RMSNorm ->
SwiGLU MLP — and differ in a few switches that this file turns into plain fields:

=================  ======================================  ==============================
switch             Llama / Mistral                         Qwen2
=================  ======================================  ==============================
q/k/v bias         ``attention_bias`` (usually false)      always true
o_proj bias        ``attention_bias``                      false
MLP bias           ``mlp_bias`` (usually false)            false
=================  ======================================  ==============================

Anything this project does not implement (another architecture, sliding-window attention, an
unknown RoPE scaling, a non-SiLU activation) fails loudly with an error that names it, instead
of silently computing something else.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
    """A config.json this project cannot run, with the file and the reason in the message."""


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``default``: none. ``linear``: positions divided by ``factor``.
    ``llama3``: Llama 3.1's smooth per-frequency rescaling (low frequencies slowed by ``factor``)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder. Shapes in the code use these letters:
    V vocab, D hidden, F intermediate (FFN), L layers, H query heads, K kv heads, E head dim."""

    architecture: str  # "llama" | "mistral" | "qwen2"
    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_layers: int  # L
    num_heads: int  # H
    num_kv_heads: int  # K  (GQA: each kv head serves H // K query heads)
    head_dim: int  # E
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"

    @property
    def q_per_kv(self) -> int:
        """How many query heads share one kv head (1 = plain multi-head attention)."""
        return self.num_heads // self.num_kv_heads

    def num_parameters(self) -> int:
        D, F, E, H, K, V = (self.hidden_size, self.intermediate_size, self.head_dim,
                            self.num_heads, self.num_kv_heads, self.vocab_size)
        attn = D * H * E + 2 * D * K * E + H * E * D
        attn += (H * E + 2 * K * E) * self.qkv_bias + D * self.o_bias
        mlp = 3 * D * F + (2 * F + D) * self.mlp_bias
        per_layer = attn + mlp + 2 * D
        head = 0 if self.tie_word_embeddings else V * D
        return V * D + self.num_layers * per_layer + D + head

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        def fail(why: str) -> ConfigError:
            return ConfigError(f"{source}: {why}")

        arch = _architecture(raw, fail)
        try:
            D = int(raw["hidden_size"])
            H = int(raw["num_attention_heads"])
            cfg = dict(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=D,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=H,
                num_kv_heads=int(raw.get("num_key_value_heads") or H),
                head_dim=int(raw.get("head_dim") or D // H),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            )
        except KeyError as missing:
            raise fail(f"missing required field {missing.args[0]!r}") from None
        except (TypeError, ValueError) as bad:
            raise fail(f"a size field is not a number ({bad})") from None
        _check_supported(raw, arch, fail)
        theta, scaling = _rope(raw, fail)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        qwen = arch == "qwen2"
        config = cls(
            **cfg,
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=True if qwen else bool(raw.get("attention_bias", False)),
            o_bias=False if qwen else bool(raw.get("attention_bias", False)),
            mlp_bias=False if qwen else bool(raw.get("mlp_bias", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        )
        if config.num_heads % config.num_kv_heads:
            raise fail(f"num_attention_heads={H} is not a multiple of "
                       f"num_key_value_heads={config.num_kv_heads}")
        if config.head_dim % 2:
            raise fail(f"head_dim={config.head_dim} must be even for rotary embeddings")
        return config

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no config.json in the model folder {folder}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object at the top level")
        return cls.from_dict(raw, source=str(path))


def _architecture(raw: dict, fail) -> str:
    archs = raw.get("architectures") or []
    for name in archs:
        if name in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[name]
    model_type = raw.get("model_type")
    if not archs and model_type in SUPPORTED_ARCHITECTURES.values():
        return model_type
    named = ", ".join(archs) if archs else f"model_type={model_type!r}"
    raise fail(f"unsupported architecture {named}; supported: "
               f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def _check_supported(raw: dict, arch: str, fail) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise fail(f"unsupported hidden_act={act!r}; only 'silu' (SwiGLU) is implemented")
    window = raw.get("sliding_window")
    uses_window = raw.get("use_sliding_window", arch == "mistral")
    if window is not None and uses_window:
        raise fail(f"sliding_window={window} attention is not implemented")
    if raw.get("attn_logit_softcapping") or raw.get("final_logit_softcapping"):
        raise fail("logit soft-capping is not implemented")


def _rope(raw: dict, fail) -> tuple[float, RopeScaling]:
    """RoPE settings: transformers 5 writes ``rope_parameters``; older files ``rope_theta`` and
    ``rope_scaling``. Both are read."""
    params = dict(raw.get("rope_parameters") or {})
    legacy = raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    spec = {**legacy, **{k: v for k, v in params.items() if k != "rope_theta"}}
    rope_type = spec.get("rope_type", spec.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise fail(f"unsupported RoPE scaling rope_type={rope_type!r}; supported: "
                   f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return theta, RopeScaling()
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return theta, RopeScaling(rope_type=rope_type, **{k: spec[k] for k in keys if k in spec})


def rope_inverse_frequencies(config: ModelConfig):
    """inv_freq[i] = theta ** (-2i / E) for i < E/2, after the configured scaling. (E/2,) float64."""
    import numpy as np

    E = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, E, 2, dtype=np.float64) / E)  # (E/2,)
    s = config.rope_scaling
    if s.rope_type == "linear":
        inv_freq = inv_freq / s.factor
    elif s.rope_type == "llama3":
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor)
        scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv_freq = np.where(mid, (1 - smooth) * inv_freq / s.factor + smooth * inv_freq, scaled)
    return inv_freq


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. ``temperature == 0`` is greedy. ``top_k <= 0`` and
    ``top_p >= 1`` switch those filters off. ``seed`` makes sampling reproducible on every
    backend (a counter-based RNG: the n-th token of a request draws from (seed, n)).

    Before any of that, OpenAI's logit adjustments (``model/sampling.py``): ``logit_bias``,
    ``(token id, bias)`` pairs, adds each bias to its token's logit (-100 bans it, +100 forces
    it); for a token generated ``c`` times so far, ``frequency_penalty`` subtracts
    ``c * penalty`` and ``presence_penalty`` subtracts ``penalty`` once if ``c > 0``.
    ``logprobs``: also report the chosen token's log-probability and the ``logprobs`` most
    likely ones (None: none; 0: the chosen token's only)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None

    def __post_init__(self):
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (-2 <= value <= 2):
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if len({token for token, _ in self.logit_bias}) != len(self.logit_bias):
            raise ValueError("logit_bias names a token twice")
        for token, bias in self.logit_bias:
            if token < 0 or not (-100 <= bias <= 100):
                raise ValueError(f"logit_bias: token {token} must be >= 0 and its bias in "
                                 f"[-100, 100], got {bias}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0 (or None), got {self.logprobs}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts_logits(self) -> bool:
        """Whether any logit adjustment is asked for (else the sampler sees the raw logits)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


def padded_step_shape(num_seqs: int, num_tokens: int) -> tuple[int, int]:
    """(S_b, T_b): the shape the eager and graph executors run a step of ``num_seqs`` sequences
    and ``num_tokens`` tokens at (their ``BucketTable``, one CUDA graph per shape; the
    simulator's cost model prices a step at it too): each rounded up to a power of two, and at
    least as many tokens as sequences."""
    s_b = 1 << max(num_seqs - 1, 0).bit_length()
    return s_b, max(s_b, 1 << max(num_tokens - 1, 0).bit_length())


#: The checkout's published benchmark results (``bench/results/``: measured on the GPU machine,
#: read by the chapters and by the simulator's bundled-model preset). Absent from an installed
#: package: readers fall back and say so. Benchmarks write elsewhere unless told (bench/results.py).
PUBLISHED_RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench" / "results"


# "persistent": Blink's scheduler kernel, the forward pass inline; "persistent-graph": the same
# kernel launching a CUDA graph per step from the GPU (executors/graph_dispatch.py).
EXECUTORS = ("auto", "reference", "eager", "graph", "persistent", "persistent-graph")
PERSISTENT_EXECUTORS = ("persistent", "persistent-graph")
POLICY_NAMES = ("fcfs", "lvf", "waiting-first", "swapped-first")  # sched/policies.py's POLICIES


KV_TRANSPORTS = ("mapped", "staged")  # kv/transfer.py's MappedTransport, DeviceTransport


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches and where KV lives.

    ``max_num_batched_tokens`` is the per-step token budget: decodes (1 token each) are scheduled
    first, then prompt chunks fill what is left (inline/chunked prefill). ``num_kv_blocks`` of
    ``block_size`` tokens each make the paged KV pool. ``executor="auto"`` lets the backend pick
    (the GPU's kernels when there is one, the NumPy reference on a CPU).
    """

    block_size: int = 16
    num_kv_blocks: int = 512
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    executor: str = "auto"
    weight_dtype: str = "auto"  # kernels' weights: float32 | float16 | auto (as on disk; bf16 -> fp16)
    # What preemption does with a victim's KV: drop and recompute it later, or rotate it to host
    # memory and back (DuplexKV, kv/rotation.py). num_host_kv_blocks: the host arena for rotate
    # (None: 2 x num_kv_blocks -- room for a mirror of every GPU block plus as many rotated out).
    preemption: str = "recompute"
    num_host_kv_blocks: int | None = None
    # How the kernel executors' rotations move blocks (kv/transfer.py): "mapped" (zero-copy, one
    # kernel per batch: a few microseconds of host time) or "staged" (gather + one cudaMemcpy
    # per run of host blocks: more bandwidth, more host time).
    kv_transport: str = "mapped"
    # Who runs, waits or rotates out each step (SuperInfer §3): "fcfs" is the scheduler's own
    # FCFS with recompute preemption (vLLM v1); "lvf" (Largest-VLT-First), "waiting-first" and
    # "swapped-first" are sched/policies.py's, best with preemption="rotate".
    policy: str = "fcfs"

    def __post_init__(self):
        for name in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.weight_dtype not in ("auto", "float32", "float16"):
            raise ValueError(f"weight_dtype must be auto, float32 or float16, got {self.weight_dtype!r}")
        if self.preemption not in ("recompute", "rotate"):
            raise ValueError(f"preemption must be recompute or rotate, got {self.preemption!r}")
        if self.kv_transport not in KV_TRANSPORTS:
            raise ValueError(f"kv_transport must be one of {', '.join(KV_TRANSPORTS)}, got "
                             f"{self.kv_transport!r}")
        if self.num_host_kv_blocks is not None and self.num_host_kv_blocks < 1:
            raise ValueError(f"EngineConfig.num_host_kv_blocks must be >= 1, got {self.num_host_kv_blocks}")
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"unknown scheduling policy {self.policy!r}; choose from "
                             f"{', '.join(POLICY_NAMES)}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"unknown executor {self.executor!r}; choose from {', '.join(EXECUTORS)}")

    def max_model_len_for(self, model: ModelConfig) -> int:
        """The longest request (prompt + output, tokens) an engine of this config admits for
        ``model``: ``max_model_len``, or the model's ``max_position_embeddings`` when None.
        ValueError when it exceeds the model's (RoPE tables and the HF model end there)."""
        length = self.max_model_len or model.max_position_embeddings
        if length > model.max_position_embeddings:
            raise ValueError(f"max_model_len={length} exceeds the model's "
                             f"max_position_embeddings={model.max_position_embeddings}")
        return length


def resolve_executor(name: str, policy: str = "fcfs", *, serves_ring: bool = False,
                     on_gpu: bool | None = None) -> str:
    """The executor that ``name`` (``EngineConfig.executor``, a ``--executor`` flag) stands for.

    ``auto`` is the fastest executor that can run the job on this machine: on a CPU the NumPy
    reference (the kernels would run in Numba's simulator, far too slow to serve); on a GPU the
    persistent scheduler kernel (Blink's design) when serving a ring (``serves_ring``: the
    server) under FCFS, and otherwise the CUDA-graph executor -- ``LLMEngine`` drives each step
    from the host. (The persistent kernel runs the other policies too, RotaSched's decisions
    made on the device, when asked for by name: ``--executor persistent --policy lvf``.) Any
    other name is returned as it is. ``on_gpu`` answers "is there a GPU?" for a process that
    must not ask the backend (the server's frontend: ``backend.will_use_gpu``); by default the
    backend is asked."""
    if name != "auto":
        return name
    if on_gpu is None:
        from .backend import get_backend  # here: choosing the backend may import numba.cuda

        on_gpu = not get_backend().is_simulator
    if not on_gpu:
        return "reference"
    return "persistent" if serves_ring and policy == "fcfs" else "graph"
