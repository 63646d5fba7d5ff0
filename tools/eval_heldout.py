#!/usr/bin/env python3
"""Held-out cross-entropy of a model folder, next to a unigram baseline of the same tokenizer.

  python tools/eval_heldout.py data/<model-folder> [--json out.json]

Model: build/corpus/heldout.txt is tokenized with the folder's tokenizer into the stream
<|bos|> doc <|eos|> <|bos|> doc <|eos|> ... (as in training), cut into non-overlapping windows
of --context tokens (up to --max-tokens), and each window is scored on its own: the mean
negative log-likelihood, in nats per token, of tokens 2..n of the window given the tokens
before them. <|bos|> targets are skipped (they always follow <|eos|>).

Baseline: unigram frequencies of the training token stream (build/corpus/train.txt with the
same tokenizer) with add-one smoothing over the whole vocabulary, scored on exactly the same
target tokens. The difference is how much the model gains from context.

Runs on CPU in about a minute (torch, float32). Writes the numbers as JSON (default:
build/eval/<folder name>.json).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_model as tm  # noqa: E402  (shared tokenization and scoring code)

ROOT = tm.ROOT
tm.LOG_PREFIX = "eval"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="Hugging Face model folder (config.json, model.safetensors, tokenizer)")
    ap.add_argument("--corpus", default=str(ROOT / "build/corpus"))
    ap.add_argument("--cache-dir", default=str(ROOT / "build/tokens"))
    ap.add_argument("--max-tokens", type=int, default=200_000, help="cap on held-out tokens scored")
    ap.add_argument("--context", type=int, default=None, help="window (default: the model's context)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="where to write the results")
    args = ap.parse_args()

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    folder, corpus, cache = Path(args.model), Path(args.corpus), Path(args.cache_dir)
    tok, _, special = tm.load_backend_tokenizer(folder)
    bos = special["bos_token"]
    vocab = tok.get_vocab_size()

    held = tm.heldout_stream(corpus, folder, cache)
    train = tm.train_stream(corpus, folder, cache)

    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    device = torch.device(args.device)
    model.to(device).eval()
    context = args.context or int(model.config.max_position_embeddings)
    if model.config.vocab_size < vocab:
        raise SystemExit(f"model vocab {model.config.vocab_size} < tokenizer vocab {vocab}")

    windows = tm.eval_windows(held, context, args.max_tokens)
    t1 = time.time()
    nll_sum, n = tm.windows_nll(model, windows, device, args.batch_size, bos)
    model_ce = nll_sum / n
    t_model = time.time() - t1

    # unigram baseline, add-one smoothing, on exactly the same targets
    counts = np.bincount(train.astype(np.int64), minlength=vocab).astype(np.float64)
    logp = np.log(counts + 1.0) - math.log(counts.sum() + vocab)
    targets = windows[:, 1:].reshape(-1)
    targets = targets[targets != bos]
    assert len(targets) == n
    unigram_ce = float(-logp[targets].mean())

    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    result = dict(
        model=str(folder), parameters=n_params, heldout_file=str(corpus / "heldout.txt"),
        heldout_stream_tokens=int(len(held)), scored_tokens=int(n), windows=int(len(windows)),
        context=context, model_nats_per_token=round(model_ce, 5),
        unigram_nats_per_token=round(unigram_ce, 5),
        improvement_nats_per_token=round(unigram_ce - model_ce, 5),
        model_perplexity=round(math.exp(model_ce), 3), unigram_perplexity=round(math.exp(unigram_ce), 3),
        unigram_train_tokens=int(len(train)), unigram_smoothing="add-one over the full vocabulary",
        method="non-overlapping windows; targets are tokens 2..n of each window; BOS targets skipped",
        device=str(device), torch=torch.__version__,
        transformers=__import__("transformers").__version__,
        seconds=round(time.time() - t0, 1),
    )
    print(f"held-out tokens scored : {n:,} ({len(windows)} windows of {context})")
    print(f"model   cross-entropy  : {model_ce:.4f} nats/token (perplexity {math.exp(model_ce):.1f})"
          f"  [{t_model:.1f}s]")
    print(f"unigram cross-entropy  : {unigram_ce:.4f} nats/token (perplexity {math.exp(unigram_ce):.1f})")
    print(f"difference (unigram - model): {unigram_ce - model_ce:.4f} nats/token")
    out = Path(args.json) if args.json else ROOT / "build/eval" / f"{folder.resolve().name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
