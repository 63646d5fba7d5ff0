"""Weights: read a Hugging Face checkpoint (``model.safetensors`` or a sharded index) into NumPy.

docs/design.md §3 and §8. A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {dtype, shape, data_offsets}}``) and then the raw tensor bytes, so loading is a
memory-map plus a reshape. The ``safetensors`` library reads every dtype NumPy knows; NumPy has no
bfloat16, so bf16 tensors are read from their raw bytes (a bf16 number is the top 16 bits of a
float32, so ``uint16 << 16`` viewed as float32 is exact).

Names follow the Hugging Face layout: ``model.embed_tokens.weight``,
``model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}``, ``model.layers.{i}.mlp.{gate,up,
down}_proj.weight``, ``model.layers.{i}.{input,post_attention}_layernorm.weight``,
``model.norm.weight`` and ``lm_head.weight`` (absent when the embeddings are tied). Linear
weights are stored ``(out_features, in_features)``: ``y = x @ W.T``.

Every problem — a missing tensor, a wrong shape, a truncated or corrupt file — is a
``WeightsError`` naming the file and the tensor.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from ..config import ModelConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry; recomputed


class WeightsError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the problem."""


@dataclass
class LayerWeights:
    """One decoder layer. Biases are None when the architecture has none."""

    attn_norm: np.ndarray  # (D,)
    wq: np.ndarray  # (H*E, D)
    wk: np.ndarray  # (K*E, D)
    wv: np.ndarray  # (K*E, D)
    wo: np.ndarray  # (D, H*E)
    bq: np.ndarray | None  # (H*E,)
    bk: np.ndarray | None  # (K*E,)
    bv: np.ndarray | None  # (K*E,)
    bo: np.ndarray | None  # (D,)
    mlp_norm: np.ndarray  # (D,)
    w_gate: np.ndarray  # (F, D)
    w_up: np.ndarray  # (F, D)
    w_down: np.ndarray  # (D, F)
    b_gate: np.ndarray | None  # (F,)
    b_up: np.ndarray | None  # (F,)
    b_down: np.ndarray | None  # (D,)


@dataclass
class ModelWeights:
    config: ModelConfig
    embed: np.ndarray  # (V, D)
    layers: list[LayerWeights]
    final_norm: np.ndarray  # (D,)
    lm_head: np.ndarray  # (V, D); the same array as ``embed`` when tied

    def nbytes(self) -> int:
        arrays = [self.embed, self.final_norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            arrays += [a for a in vars(layer).values() if a is not None]
        return sum(a.nbytes for a in arrays)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the checkpoint must hold, with its shape."""
    D, F, E = config.hidden_size, config.intermediate_size, config.head_dim
    H, K, V = config.num_heads, config.num_kv_heads, config.vocab_size
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, D)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (D,),
            p + "post_attention_layernorm.weight": (D,),
            p + "self_attn.q_proj.weight": (H * E, D),
            p + "self_attn.k_proj.weight": (K * E, D),
            p + "self_attn.v_proj.weight": (K * E, D),
            p + "self_attn.o_proj.weight": (D, H * E),
            p + "mlp.gate_proj.weight": (F, D),
            p + "mlp.up_proj.weight": (F, D),
            p + "mlp.down_proj.weight": (D, F),
        })
        if config.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (H * E,), p + "self_attn.k_proj.bias": (K * E,),
                           p + "self_attn.v_proj.bias": (K * E,)})
        if config.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (D,)
        if config.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (F,), p + "mlp.up_proj.bias": (F,),
                           p + "mlp.down_proj.bias": (D,)})
    return shapes


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Map each tensor name to the safetensors file that holds it."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise WeightsError(f"{index}: not a valid safetensors index ({err!r})") from None
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise WeightsError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} in the model folder")
    with _open(single) as f:
        return {name: single for name in f.keys()}


def _open(path: Path):
    if not path.is_file():
        raise WeightsError(f"{path}: file not found (named by the checkpoint index)")
    try:
        return safe_open(str(path), framework="numpy")
    except (SafetensorError, OSError) as err:
        size = path.stat().st_size
        raise WeightsError(f"{path}: not a readable safetensors file, truncated or corrupt "
                           f"({size} bytes; {err})") from None


def _read_bf16(path: Path, name: str) -> np.ndarray:
    """bfloat16 -> float32 from the raw bytes (NumPy has no bfloat16)."""
    with open(path, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        info = json.loads(fh.read(header_len))[name]
        begin, end = info["data_offsets"]
        fh.seek(8 + header_len + begin)
        raw = np.frombuffer(fh.read(end - begin), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


def _read_tensor(f, path: Path, name: str) -> np.ndarray:
    try:
        if f.get_slice(name).get_dtype() == "BF16":
            return _read_bf16(path, name)
        return f.get_tensor(name)
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise WeightsError(f"{path}: tensor {name!r} could not be read ({err})") from None


def load_tensors(folder: str | Path, config: ModelConfig, dtype=np.float32) -> dict[str, np.ndarray]:
    """Read and check every tensor the model needs, converted to ``dtype``."""
    folder = Path(folder)
    shapes = expected_shapes(config)
    where = checkpoint_files(folder)
    missing = [n for n in shapes if n not in where]
    if missing:
        files = sorted({str(p) for p in where.values()}) or [str(folder)]
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise WeightsError(f"{', '.join(files)}: missing tensor(s) {', '.join(missing[:3])}{more} "
                           f"needed by the {config.architecture} config")
    tensors: dict[str, np.ndarray] = {}
    for path in sorted({where[n] for n in shapes}):
        with _open(path) as f:
            for name in (n for n in shapes if where[n] == path):
                array = _read_tensor(f, path, name)
                if tuple(array.shape) != shapes[name]:
                    raise WeightsError(f"{path}: tensor {name!r} has shape {tuple(array.shape)}, "
                                       f"expected {shapes[name]} from config.json")
                tensors[name] = np.ascontiguousarray(array, dtype=dtype)
    return tensors


def load_weights(folder: str | Path, config: ModelConfig | None = None, dtype=np.float32) -> ModelWeights:
    """Load a Hugging Face Llama/Mistral/Qwen2 checkpoint folder into ``ModelWeights``."""
    config = config or ModelConfig.from_folder(folder)
    return _assemble(config, load_tensors(folder, config, dtype))


def _assemble(config: ModelConfig, t: dict[str, np.ndarray]) -> ModelWeights:
    """Arrange named tensors into ``ModelWeights``."""

    def get(name: str):
        return t.get(name)

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layers.append(LayerWeights(
            attn_norm=t[p + "input_layernorm.weight"],
            wq=t[a + "q_proj.weight"], wk=t[a + "k_proj.weight"], wv=t[a + "v_proj.weight"],
            wo=t[a + "o_proj.weight"],
            bq=get(a + "q_proj.bias"), bk=get(a + "k_proj.bias"), bv=get(a + "v_proj.bias"),
            bo=get(a + "o_proj.bias"),
            mlp_norm=t[p + "post_attention_layernorm.weight"],
            w_gate=t[m + "gate_proj.weight"], w_up=t[m + "up_proj.weight"],
            w_down=t[m + "down_proj.weight"],
            b_gate=get(m + "gate_proj.bias"), b_up=get(m + "up_proj.bias"),
            b_down=get(m + "down_proj.bias"),
        ))
    embed = t["model.embed_tokens.weight"]
    lm_head = embed if config.tie_word_embeddings else t["lm_head.weight"]
    return ModelWeights(config, embed, layers, t["model.norm.weight"], lm_head)


def random_weights(config: ModelConfig, seed: int = 0, scale: float = 0.15,
                   dtype=np.float32) -> ModelWeights:
    """Random weights of the right shapes (for chapters, tests and benchmarks of a model shape
    that has no checkpoint). Norm weights are near 1, everything else ~ N(0, scale^2)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        mean = 1.0 if name.endswith("norm.weight") else 0.0
        tensors[name] = (mean + scale * rng.standard_normal(shape)).astype(dtype)
    return _assemble(config, tensors)
