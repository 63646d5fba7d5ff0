"""The model: Hugging Face config and weights, tokenizer, and the NumPy reference forward pass."""
