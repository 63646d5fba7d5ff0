"""The micro model: a Llama shape small enough for Numba's CUDA simulator.

docs/design.md §5: in the simulator every CUDA thread is a Python thread, so a kernel test or a
chapter that runs the kernels needs a hidden size of a few dozen, one layer and a vocabulary of
a few dozen tokens. This is that shape, written once for the tests, the chapters and the labs;
any field can be changed per use (``micro_config(num_attention_heads=4)``). The weights are
random (``random_weights``): the micro model exists to check kernels and engines against the
NumPy reference, not to write English.
"""

from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from .weights import ModelWeights, random_weights

#: config.json fields of the micro model: 1 layer, hidden 32, 2 query heads sharing 1 KV head
#: (GQA), head_dim 16, a 64-token vocabulary and context, tied embeddings, BOS 1 and EOS 2.
MICRO_FIELDS = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def micro_config(**changes) -> ModelConfig:
    """The micro model's config, with ``changes`` to any of ``MICRO_FIELDS`` (config.json
    names)."""
    unknown = set(changes) - set(MICRO_FIELDS)
    if unknown:
        raise ValueError(f"micro_config: unknown field(s) {sorted(unknown)}; known: "
                         f"{', '.join(MICRO_FIELDS)}")
    return ModelConfig.from_dict({**MICRO_FIELDS, **changes}, source="micro_config")


def micro_weights(seed: int = 0, scale: float = 0.4, dtype=np.float32, **changes) -> ModelWeights:
    """Random weights of the micro model (``micro_config(**changes)``), ~ N(0, scale^2)."""
    return random_weights(micro_config(**changes), seed=seed, scale=scale, dtype=dtype)
