#!/usr/bin/env python3
"""Train the bundled model: a ~7 M-parameter Llama (RMSNorm, RoPE, GQA, SwiGLU) on build/corpus.

Pipeline:  python tools/corpus.py && python tools/train_tokenizer.py && \
           python tools/train_model.py --out <folder>

What it does
  1. Tokenizes build/corpus/{train,heldout}.txt with build/tokenizer (the `tokenizers` library,
     batched, multi-threaded) into streams  <|bos|> doc <|eos|> <|bos|> doc <|eos|> ...  and caches
     them as uint16 .npy files in build/tokens/ (keyed by the text's and tokenizer's sha256).
     It also renders a small set of chat-formatted examples from training paragraphs (a user
     turn with the first sentence, an assistant turn with the rest, ended by <|end|>) so the
     model learns the chat template's role markers; --chat-fraction of each batch's rows come
     from them (0 turns this off).
  2. Trains transformers.LlamaForCausalLM from scratch: AdamW, linear warmup + cosine decay,
     bf16 autocast on CUDA, optional torch.compile (falls back to eager if it fails), epochs
     over shuffled non-overlapping windows of --context tokens. Stops at --max-steps (default:
     --epochs worth of steps) or at the --time-budget-min wall-clock budget, whichever first.
  3. Evaluates held-out cross-entropy every --eval-every steps, keeps the best weights.
  4. Saves --out: model.safetensors (fp16) + config.json + generation_config.json, the tokenizer
     files, training_log.jsonl (one JSON object per log/eval line) and train_summary.json
     (config, parameter count, tokens seen, losses, versions, sample generations).

CPU smoke test (a couple of minutes on 2 cores):
  python tools/train_model.py --device cpu --max-steps 30 --batch-size 8 --out build/smoke_model

Everything is seeded (--seed): data order, initialisation, dropout and sampling. On CUDA the
kernels are not bitwise deterministic, so two GPU runs agree closely but not exactly.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path

T_START = time.time()
ROOT = Path(__file__).resolve().parent.parent
TOKEN_CACHE_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SAMPLE_PROMPTS = ("Once upon a time", "It was a dark and stormy night, and", "The old man said")
SAMPLE_TEMPERATURES = (0.0, 0.7, 1.0)


LOG_PREFIX = "train"


def log(msg: str) -> None:
    print(f"[{LOG_PREFIX} {time.time() - T_START:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Data: documents -> token streams (shared with tools/eval_heldout.py)
# ---------------------------------------------------------------------------------------------

def read_documents(path: Path) -> list[str]:
    """train.txt / heldout.txt -> documents (separated by two blank lines; see tools/corpus.py)."""
    text = path.read_text(encoding="utf-8")
    return [d.strip("\n") for d in text.split("\n\n\n") if d.strip()]


def load_backend_tokenizer(folder: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    ids = {k: tok.token_to_id(cfg[k]) for k in ("bos_token", "eos_token", "pad_token")}
    return tok, cfg, ids


def encode_documents(tok, docs: list[str], bos_id: int, eos_id: int):
    """Documents -> one uint16 stream  bos d1 eos bos d2 eos ...  (batched, multi-threaded)."""
    import numpy as np

    parts = []
    step = 256
    for i in range(0, len(docs), step):
        for enc in tok.encode_batch(docs[i:i + step], add_special_tokens=False):
            parts.append(np.asarray([bos_id, *enc.ids, eos_id], dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def cached_stream(cache_dir: Path, name: str, key_parts: list[str], build) -> "np.ndarray":
    """np.load(cache) if present for this key, else build() and save it."""
    import numpy as np

    key = hashlib.sha256("\0".join([str(TOKEN_CACHE_VERSION), *key_parts]).encode()).hexdigest()[:16]
    path = cache_dir / f"{name}-{key}.npy"
    if path.exists():
        arr = np.load(path)
        log(f"{name}: {len(arr):,} tokens from cache {path}")
        return arr
    t0 = time.time()
    arr = build()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, arr)
    tmp.replace(path)
    log(f"{name}: {len(arr):,} tokens, tokenized in {time.time() - t0:.1f}s -> {path}")
    return arr


def file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def heldout_stream(corpus: Path, tok_dir: Path, cache_dir: Path):
    tok, _, ids = load_backend_tokenizer(tok_dir)
    path = corpus / "heldout.txt"
    return cached_stream(cache_dir, "heldout", [file_sha(path), file_sha(tok_dir / "tokenizer.json")],
                         lambda: encode_documents(tok, read_documents(path), ids["bos_token"],
                                                  ids["eos_token"]))


def train_stream(corpus: Path, tok_dir: Path, cache_dir: Path):
    tok, _, ids = load_backend_tokenizer(tok_dir)
    path = corpus / "train.txt"
    return cached_stream(cache_dir, "train", [file_sha(path), file_sha(tok_dir / "tokenizer.json")],
                         lambda: encode_documents(tok, read_documents(path), ids["bos_token"],
                                                  ids["eos_token"]))


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"']?\s+(?=[\"']?[A-Z])")
_CHAT_USER_FORMS = ("{s}", "Continue: {s}", "Continue the story: {s}", "Please go on. {s}",
                    "What comes next? {s}")
_CHAT_SYSTEM = ("You are a helpful assistant.", "You are a storyteller.", None, None, None)


def chat_examples(docs: list[str], n: int, seed: int) -> list[list[dict]]:
    """Up to n deterministic single-turn chats made from prose paragraphs of the training text."""
    import random

    rng = random.Random(seed)
    paras = [p for d in docs for p in d.split("\n\n")
             if 160 <= len(p) <= 1400 and "\n" not in p and p[:1].isupper()]
    rng.shuffle(paras)
    out = []
    for p in paras:
        parts = _SENTENCE_END.split(p, maxsplit=1)
        if len(parts) != 2 or len(parts[0]) < 20 or len(parts[1]) < 40:
            continue
        first = p[:len(p) - len(parts[1])].strip()
        msgs = []
        system = rng.choice(_CHAT_SYSTEM)
        if system:
            msgs.append({"role": "system", "content": system})
        msgs.append({"role": "user", "content": rng.choice(_CHAT_USER_FORMS).format(s=first)})
        msgs.append({"role": "assistant", "content": parts[1].strip()})
        out.append(msgs)
        if len(out) >= n:
            break
    return out


def compile_chat_template(template_src: str):
    """The chat template compiled the way transformers does (sandboxed Jinja)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template_src)


def chat_stream(corpus: Path, tok_dir: Path, cache_dir: Path, n: int, seed: int):
    import numpy as np

    tok, cfg, _ = load_backend_tokenizer(tok_dir)
    path = corpus / "train.txt"

    def build():
        convs = chat_examples(read_documents(path), n, seed)
        special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token")}
        template = compile_chat_template(cfg["chat_template"])
        texts = [template.render(messages=m, add_generation_prompt=False, **special) for m in convs]
        encs = tok.encode_batch(texts, add_special_tokens=False)
        return np.concatenate([np.asarray(e.ids, np.uint16) for e in encs])

    return cached_stream(cache_dir, "chat", [file_sha(path), file_sha(tok_dir / "tokenizer.json"),
                                             str(n), str(seed), cfg["chat_template"]], build)


def eval_windows(stream, context: int, max_tokens: int | None = None, spread: bool = False):
    """Non-overlapping windows of `context` tokens, as an int64 array (n_windows, context).

    spread=False: the first max_tokens tokens.  spread=True: windows evenly spaced over the stream.
    """
    import numpy as np

    n_all = len(stream) // context
    n = n_all if max_tokens is None else min(n_all, max(1, max_tokens // context))
    if spread and n < n_all:
        starts = (np.linspace(0, n_all - 1, n).astype(np.int64)) * context
    else:
        starts = np.arange(n, dtype=np.int64) * context
    return np.stack([stream[s:s + context] for s in starts]).astype(np.int64)


def windows_nll(model, windows, device, batch_size: int, bos_id: int, autocast_dtype=None):
    """Sum of next-token negative log-likelihoods (nats) over windows[:, 1:], skipping BOS targets.

    Each window is scored independently: its first token is context only. Returns (sum, count).
    """
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(windows), batch_size):
            w = torch.as_tensor(windows[i:i + batch_size], device=device)
            ctx = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype
                   else _nullcontext())
            with ctx:
                logits = model(input_ids=w[:, :-1], use_cache=False).logits
            y = w[:, 1:]
            nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                  reduction="none")
            mask = (y.reshape(-1) != bos_id)
            total += float(nll[mask].sum())
            count += int(mask.sum())
    model.train(was_training)
    return total, count


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------

def make_config(args, vocab_size: int, special_ids: dict, end_id: int | None):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        hidden_act="silu", max_position_embeddings=args.context, initializer_range=0.02,
        rms_norm_eps=1e-5, use_cache=True, tie_word_embeddings=True, attention_bias=False,
        mlp_bias=False, attention_dropout=0.0,
        bos_token_id=special_ids["bos_token"], eos_token_id=special_ids["eos_token"],
        pad_token_id=special_ids["pad_token"],
    )
    try:  # transformers 5: rope_parameters
        return LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta})
    except TypeError:  # older transformers
        return LlamaConfig(**kw, rope_theta=args.rope_theta)


def add_dropout_hooks(model, p: float) -> list:
    """GPT-2 style dropout without changing the architecture: on the embedding output and on
    each block's attention and MLP outputs before they join the residual stream (training only).
    The hooks are not part of the saved model."""
    import torch.nn.functional as F

    if p <= 0:
        return []

    def hook(mod, inputs, output):
        return F.dropout(output, p, mod.training)

    core = model.model
    mods = [core.embed_tokens] + [m for layer in core.layers
                                  for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]
    return [m.register_forward_hook(hook) for m in mods]


def count_params(model) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def lr_at(step: int, args, max_steps: int) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, max_steps - args.warmup))
    lo = args.lr * args.min_lr_ratio
    return lo + 0.5 * (args.lr - lo) * (1 + math.cos(math.pi * progress))


class WindowSampler:
    """Epochs over shuffled, non-overlapping (context+1)-token windows of the training stream,
    each epoch with a fresh random phase; plus random windows of the chat stream."""

    def __init__(self, stream, chat, context: int, seed: int):
        import numpy as np

        self.np = np
        self.n, self.t, self.seed = len(stream), context + 1, seed
        self.chat_n = 0 if chat is None else len(chat)
        self.epoch, self.queue, self.pos = -1, None, 0
        self.chat_rng = np.random.default_rng([seed, 7])

    def _new_epoch(self):
        np = self.np
        self.epoch += 1
        rng = np.random.default_rng([self.seed, self.epoch])
        phase = int(rng.integers(0, self.t))
        starts = np.arange(phase, self.n - self.t + 1, self.t, dtype=np.int64)
        self.queue, self.pos = rng.permutation(starts), 0

    def next(self, rows: int, chat_rows: int):
        np = self.np
        out = []
        while len(out) < rows:
            if self.queue is None or self.pos >= len(self.queue):
                self._new_epoch()
            take = self.queue[self.pos:self.pos + rows - len(out)]
            self.pos += len(take)
            out.extend(take.tolist())
        chat = (self.chat_rng.integers(0, self.chat_n - self.t + 1, chat_rows) if chat_rows
                else np.zeros(0, np.int64))
        return np.asarray(out, np.int64), chat.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Train the bundled Llama model (see module docstring).",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", required=True, help="output model folder")
    ap.add_argument("--corpus", default=str(ROOT / "build/corpus"))
    ap.add_argument("--tokenizer", default=str(ROOT / "build/tokenizer"))
    ap.add_argument("--cache-dir", default=str(ROOT / "build/tokens"), help="token id cache (.npy)")
    ap.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    ap.add_argument("--seed", type=int, default=1234)
    g = ap.add_argument_group("model")
    g.add_argument("--hidden", type=int, default=256)
    g.add_argument("--layers", type=int, default=8)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--intermediate", type=int, default=768)
    g.add_argument("--context", type=int, default=512)
    g.add_argument("--rope-theta", type=float, default=10000.0)
    g = ap.add_argument_group("optimisation")
    g.add_argument("--batch-size", type=int, default=128, help="sequences per step")
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr")
    g.add_argument("--warmup", type=int, default=100, help="warmup steps")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--dropout", type=float, default=0.1,
                   help="dropout on embedding/attention/MLP outputs during training")
    g.add_argument("--epochs", type=float, default=40.0,
                   help="passes over the training tokens; sets --max-steps when that is not given")
    g.add_argument("--max-steps", type=int, default=None, help="step budget")
    g.add_argument("--time-budget-min", type=float, default=12.0,
                   help="wall-clock budget in minutes, counted from process start; training stops "
                        "when it is spent (the LR schedule is by steps)")
    g.add_argument("--chat-fraction", type=float, default=0.03,
                   help="fraction of each batch's rows taken from chat-formatted examples")
    g.add_argument("--chat-examples", type=int, default=40000)
    g.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="torch.compile the model (default: on for CUDA)")
    g.add_argument("--no-compile", dest="compile", action="store_false")
    g = ap.add_argument_group("logging and evaluation")
    g.add_argument("--log-every", type=int, default=None, help="steps (default 25 on GPU, 1 on CPU)")
    g.add_argument("--eval-every", type=int, default=None,
                   help="steps between held-out evaluations (default: ~twice per epoch)")
    g.add_argument("--eval-tokens", type=int, default=65536, help="held-out tokens per periodic eval")
    g.add_argument("--final-eval-tokens", type=int, default=200000)
    g.add_argument("--eval-batch-size", type=int, default=32)
    g.add_argument("--no-keep-best", dest="keep_best", action="store_false",
                   help="save the last weights instead of the best held-out ones")
    g.add_argument("--save-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    g.add_argument("--sample-tokens", type=int, default=60)
    g.add_argument("--prepare-only", action="store_true", help="tokenize and cache, then exit")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers

    corpus, tok_dir, cache_dir, out = (Path(args.corpus), Path(args.tokenizer),
                                       Path(args.cache_dir), Path(args.out))
    for f in [corpus / "train.txt", corpus / "heldout.txt", *[tok_dir / n for n in TOKENIZER_FILES]]:
        if not f.exists():
            raise SystemExit(f"{f} not found: run tools/corpus.py and tools/train_tokenizer.py first")

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    if args.compile is None:
        args.compile = on_cuda
    if args.log_every is None:
        args.log_every = 25 if on_cuda else 1
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    # ---- data -----------------------------------------------------------------------------
    tok, tok_cfg, special = load_backend_tokenizer(tok_dir)
    end_id = tok.token_to_id("<|end|>")
    bos_id = special["bos_token"]
    train_ids = train_stream(corpus, tok_dir, cache_dir)
    held_ids = heldout_stream(corpus, tok_dir, cache_dir)
    chat_ids = (chat_stream(corpus, tok_dir, cache_dir, args.chat_examples, args.seed)
                if args.chat_fraction > 0 else None)
    if args.prepare_only:
        log("prepared; exiting (--prepare-only)")
        return 0
    vocab = tok.get_vocab_size()
    assert int(train_ids.max()) < vocab

    B, T = args.batch_size, args.context
    chat_rows = 0
    if chat_ids is not None:
        chat_rows = int(round(B * args.chat_fraction))
        if chat_rows == 0 and B >= 2:
            chat_rows = 1
    text_rows = B - chat_rows
    tokens_per_step = B * T
    steps_per_epoch = len(train_ids) / (text_rows * (T + 1))
    max_steps = args.max_steps or max(1, int(math.ceil(args.epochs * steps_per_epoch)))
    eval_every = args.eval_every or max(1, int(steps_per_epoch // 2))
    log(f"train stream {len(train_ids):,} tokens; {text_rows}+{chat_rows} rows x {T} per step "
        f"= {tokens_per_step:,} tokens; {steps_per_epoch:.1f} steps/epoch; max_steps {max_steps}")

    # ---- model ----------------------------------------------------------------------------
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if on_cuda:
        torch.cuda.manual_seed_all(args.seed)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    from transformers import LlamaForCausalLM

    config = make_config(args, vocab, special, end_id)
    model = LlamaForCausalLM(config).to(device)
    model.train()
    n_params = count_params(model)
    log(f"LlamaForCausalLM: {n_params:,} parameters (hidden {args.hidden}, {args.layers} layers, "
        f"{args.heads} heads / {args.kv_heads} KV heads, MLP {args.intermediate}, vocab {vocab}, "
        f"tied embeddings); torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {torch.cuda.get_device_name(device) if on_cuda else 'cpu'}")
    hooks = add_dropout_hooks(model, args.dropout)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8)
    if on_cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        opt_kw["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kw)

    amp_dtype = torch.bfloat16 if on_cuda else None

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else _nullcontext()

    train_gpu = torch.from_numpy(train_ids.astype(np.int64)).to(device)
    chat_gpu = torch.from_numpy(chat_ids.astype(np.int64)).to(device) if chat_rows else None
    offs = torch.arange(T + 1, device=device)
    sampler = WindowSampler(train_ids, chat_ids, T, args.seed)

    def get_batch():
        s_text, s_chat = sampler.next(text_rows, chat_rows)
        rows = train_gpu[torch.as_tensor(s_text, device=device)[:, None] + offs]
        if chat_rows:
            rows = torch.cat([rows, chat_gpu[torch.as_tensor(s_chat, device=device)[:, None] + offs]])
        return rows[:, :-1], rows[:, 1:]

    def loss_fn(m, x, y):
        with autocast():
            logits = m(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    fwd = model
    compile_note = "off"
    if args.compile:
        try:
            t0 = time.time()
            fwd = torch.compile(model)
            x, y = get_batch()  # a throwaway batch: the sampler's state moves on, the weights don't
            loss_fn(fwd, x, y).backward()
            opt.zero_grad(set_to_none=True)
            if on_cuda:
                torch.cuda.synchronize()
            compile_note = f"on ({time.time() - t0:.1f}s to compile)"
            log(f"torch.compile: {compile_note}")
        except Exception as e:  # noqa: BLE001 - any compiler failure falls back to eager
            opt.zero_grad(set_to_none=True)
            fwd = model
            compile_note = f"failed, eager fallback: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"torch.compile {compile_note}")
            try:
                torch._dynamo.reset()
            except Exception:  # noqa: BLE001
                pass

    held_eval = eval_windows(held_ids, T, args.eval_tokens)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "training_log.jsonl"
    log_f = open(log_path, "w")

    def write_log(rec: dict):
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    def evaluate():
        s, c = windows_nll(model, held_eval, device, args.eval_batch_size, bos_id, amp_dtype)
        return s / c

    budget_s = args.time_budget_min * 60
    best = (float("inf"), -1, None)
    loss_acc = torch.zeros((), device=device)
    loss_n = 0
    t_train0 = time.time()
    t_last, tok_last = t_train0, 0
    step = 0
    stop_reason = "max_steps"
    log(f"training: lr {args.lr} warmup {args.warmup} cosine to {args.lr * args.min_lr_ratio:g}, "
        f"wd {args.weight_decay}, dropout {args.dropout}, budget {args.time_budget_min} min")
    while step < max_steps:
        lr = lr_at(step, args, max_steps)
        for grp in opt.param_groups:
            grp["lr"] = lr
        x, y = get_batch()
        loss = loss_fn(fwd, x, y)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        loss_acc += loss.detach()
        loss_n += 1
        tokens = step * tokens_per_step
        last = step == max_steps or time.time() - T_START > budget_s
        if step % args.log_every == 0 or last:
            train_loss = float(loss_acc) / loss_n  # syncs
            now = time.time()
            rec = dict(step=step, tokens=tokens, epoch=round(step / steps_per_epoch, 3),
                       train_loss=round(train_loss, 5), lr=lr,
                       elapsed_s=round(now - T_START, 2),
                       tok_per_s=round((tokens - tok_last) / max(1e-9, now - t_last)))
            write_log(rec)
            log(f"step {step:6d}/{max_steps} ep {rec['epoch']:6.2f} loss {train_loss:.4f} "
                f"lr {lr:.2e} {rec['tok_per_s'] / 1e6:.2f} Mtok/s")
            loss_acc.zero_()
            loss_n = 0
            t_last, tok_last = now, tokens
            if not math.isfinite(train_loss):
                stop_reason = "non-finite loss"
                break
        if step % eval_every == 0 or last:
            t_eval = time.time()
            h = evaluate()
            write_log(dict(step=step, tokens=tokens, epoch=round(step / steps_per_epoch, 3),
                           heldout_loss=round(h, 5), elapsed_s=round(time.time() - T_START, 2)))
            improved = h < best[0]
            if improved:
                best = (h, step, {k: v.detach().to("cpu", copy=True)
                                  for k, v in model.state_dict().items()})
            log(f"held-out loss {h:.4f} at step {step}{' (best)' if improved else ''}")
            t_last += time.time() - t_eval  # evaluation time is not training throughput
        if time.time() - T_START > budget_s:
            stop_reason = "time budget"
            log(f"time budget of {args.time_budget_min} min reached at step {step} of {max_steps}: "
                f"the LR schedule did not finish (lower --epochs or raise --time-budget-min)")
            break
    train_time = time.time() - t_train0
    log_f.close()

    # ---- pick weights, final evaluation ---------------------------------------------------
    for hk in hooks:
        hk.remove()
    last_h = evaluate()
    if args.keep_best and best[2] is not None and best[0] < last_h:
        model.load_state_dict(best[2])
        chosen = f"best held-out (step {best[1]})"
    else:
        chosen = f"last (step {step})"
    log(f"weights: {chosen}")
    final_held = eval_windows(held_ids, T, args.final_eval_tokens)
    hs, hc = windows_nll(model, final_held, device, args.eval_batch_size, bos_id, amp_dtype)
    tr_w = eval_windows(train_ids, T, args.final_eval_tokens, spread=True)
    ts, tc = windows_nll(model, tr_w, device, args.eval_batch_size, bos_id, amp_dtype)
    log(f"final: held-out {hs / hc:.4f} nats/token over {hc:,} tokens; train {ts / tc:.4f} over {tc:,}")

    # ---- save -----------------------------------------------------------------------------
    from transformers import GenerationConfig

    save_dtype = getattr(torch, args.save_dtype)
    model = model.to("cpu", dtype=save_dtype)
    model.eval()
    eos_ids = [special["eos_token"]] + ([end_id] if end_id is not None else [])
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_ids, pad_token_id=special["pad_token"],
        do_sample=False)
    save_kw = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kw["safe_serialization"] = True
    model.save_pretrained(str(out), **save_kw)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = args.save_dtype
    cfg["torch_dtype"] = args.save_dtype  # the pre-5.0 key, for older readers
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copy2(tok_dir / name, out / name)

    samples = generate_samples(out, args, device)

    st = out / "model.safetensors"
    folder_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    summary = dict(
        model=dict(architecture="LlamaForCausalLM", parameters=n_params, hidden_size=args.hidden,
                   num_hidden_layers=args.layers, num_attention_heads=args.heads,
                   num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                   intermediate_size=args.intermediate, vocab_size=vocab, context=T,
                   rope_theta=args.rope_theta, tie_word_embeddings=True, saved_dtype=args.save_dtype),
        training=dict(steps=step, max_steps=max_steps, stop_reason=stop_reason,
                      tokens_seen=step * tokens_per_step, tokens_per_step=tokens_per_step,
                      epochs=round(step / steps_per_epoch, 3), train_stream_tokens=int(len(train_ids)),
                      heldout_stream_tokens=int(len(held_ids)),
                      chat_stream_tokens=int(0 if chat_ids is None else len(chat_ids)),
                      chat_rows_per_step=chat_rows, train_seconds=round(train_time, 1),
                      wall_seconds=round(time.time() - T_START, 1),
                      tokens_per_second=round(step * tokens_per_step / max(train_time, 1e-9)),
                      compile=compile_note, weights=chosen,
                      best_periodic_heldout=dict(loss=round(best[0], 5), step=best[1])),
        final=dict(heldout_loss=round(hs / hc, 5), heldout_tokens=hc, train_loss=round(ts / tc, 5),
                   train_tokens=tc, metric="mean next-token cross-entropy, nats/token, "
                   "non-overlapping windows of context tokens, BOS targets excluded"),
        args=vars(args), seed=args.seed,
        versions=dict(python=platform.python_version(), torch=torch.__version__,
                      transformers=transformers.__version__, numpy=np.__version__,
                      tokenizers=__import__("tokenizers").__version__,
                      device=torch.cuda.get_device_name(device) if on_cuda else platform.processor()
                      or "cpu"),
        data=dict(corpus_manifest_sha256=file_sha(corpus / "manifest.json")
                  if (corpus / "manifest.json").exists() else None,
                  train_txt_sha256=file_sha(corpus / "train.txt"),
                  tokenizer_json_sha256=file_sha(tok_dir / "tokenizer.json")),
        sizes=dict(model_safetensors_bytes=st.stat().st_size, folder_bytes=folder_bytes),
        samples=samples,
    )
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    folder_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"saved {out}: model.safetensors {st.stat().st_size / 2**20:.2f} MiB, folder "
        f"{folder_bytes / 2**20:.2f} MiB")
    for smp in samples:
        log(f"sample T={smp['temperature']}: {smp['prompt']!r} -> {smp['completion'][:150]!r}")
    ok = st.stat().st_size <= 16 * 2**20 and folder_bytes <= 20 * 2**20
    if not ok:
        log("ERROR: size limits exceeded (model.safetensors <= 16 MiB, folder <= 20 MiB)")
        return 2
    log(f"done in {time.time() - T_START:.1f}s")
    return 0


def generate_samples(folder: Path, args, device) -> list[dict]:
    """Reload the saved folder the way users will and generate from a few prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    model.to(device).eval()
    out = []
    for prompt in SAMPLE_PROMPTS:
        enc = tok(prompt, return_tensors="pt").to(device)
        for temp in SAMPLE_TEMPERATURES:
            torch.manual_seed(args.seed)
            kw = dict(max_new_tokens=args.sample_tokens, pad_token_id=tok.pad_token_id)
            if temp > 0:
                kw.update(do_sample=True, temperature=temp, top_k=0, top_p=1.0)
            else:
                kw.update(do_sample=False)
            with torch.no_grad():
                ids = model.generate(**enc, **kw)
            text = tok.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            out.append(dict(prompt=prompt, temperature=temp, completion=text))
    return out


if __name__ == "__main__":
    sys.exit(main())
