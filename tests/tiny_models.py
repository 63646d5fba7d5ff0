"""Tiny Hugging Face checkpoints for parity tests, written with ``save_pretrained``."""

from __future__ import annotations

# Each tiny architecture: (transformers classes, config overrides). Shapes are micro on purpose.
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
ARCHS = {
    # GQA (2 query heads per kv head) and tied embeddings
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500.0)),
    # q/k/v biases, untied embeddings, 4 query heads per kv head
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(num_key_value_heads=1, tie_word_embeddings=False, rope_theta=10000.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(num_key_value_heads=2, tie_word_embeddings=False, sliding_window=None)),
    # Llama 3.1-style RoPE scaling, explicit head_dim different from hidden/heads, biases
    "llama3rope": ("LlamaConfig", "LlamaForCausalLM",
                   dict(num_key_value_heads=4, head_dim=32, attention_bias=True, mlp_bias=True,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 32},
                        rope_theta=500000.0)),
}


def make_checkpoint(folder, arch: str, seed: int, dtype: str = "float32", **save_kwargs):
    """Write a random tiny ``arch`` model with ``save_pretrained``; returns the torch model."""
    import torch
    import transformers

    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(**TINY, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger than the default init: decisive, diverse logits
            p.normal_(0.0, 0.15)
    model.to(getattr(torch, dtype)).save_pretrained(folder, **save_kwargs)
    return model
