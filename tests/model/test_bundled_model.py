"""The bundled model in data/: loads in transformers and in blink_edu, and they agree token for token."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import torch

from blink_edu.config import SamplingParams
from blink_edu.model import reference as ref
from blink_edu.model.bundled import BUNDLED_DIR, resolve_model_dir
from blink_edu.model.tokenizer import Tokenizer
from blink_edu.model.weights import load_weights

PROMPTS = ["Once upon a time", "It was a dark and stormy night, and", "The old man said"]


def test_bundled_model_is_the_default_and_within_size_limits():
    folder = resolve_model_dir()
    assert folder == BUNDLED_DIR
    assert (folder / "model.safetensors").stat().st_size <= 16 * 2**20
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert total <= 20 * 2**20, f"data/ is {total / 2**20:.1f} MiB"


def test_greedy_continuations_match_transformers():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model_dir()
    hf_tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    hf.generation_config.eos_token_id = None  # compare 24 tokens whatever they are
    tok = Tokenizer.from_folder(folder)
    weights = load_weights(folder, dtype=np.float64)  # fp16 on disk: exact in float64 too
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert ids == hf_tok(prompt)["input_ids"]
        with torch.no_grad():
            expected = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                   pad_token_id=0)[0, len(ids):].tolist()
        ours = ref.generate(weights, [ids], SamplingParams(temperature=0, max_tokens=24,
                                                           ignore_eos=True))[0]
        assert ours == expected, prompt


def test_generate_command_prints_english_quickly():
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "blink_edu.generate", "--prompt", "Once upon a time",
                          "--max-tokens", "40", "--seed", "0"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "BLINK_EDU_BACKEND": "sim"})
    elapsed = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Once upon a time")
    words = out.stdout.split()
    common = {"the", "and", "of", "to", "a", "in", "his", "he", "was", "is", "that", "with", "it"}
    assert len(words) >= 15 and sum(w.lower().strip(",.;:") in common for w in words) >= 3
    assert "40 tokens" in out.stderr and "executor=reference" in out.stderr
    assert elapsed < 60, f"generate took {elapsed:.1f} s"


def test_generate_reports_a_missing_model_clearly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "blink_edu.generate", "--model", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no config.json" in out.stderr
