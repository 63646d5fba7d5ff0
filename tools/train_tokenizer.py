#!/usr/bin/env python3
"""Train the bundled model's tokenizer: byte-level BPE, 4096 ids, on build/corpus/train.txt.

Writes a Hugging Face tokenizer folder (default build/tokenizer/):
  tokenizer.json           the `tokenizers` model: ByteLevel pre-tokenizer/decoder (no prefix space),
                           BPE merges, special tokens, and a post-processor that prepends <|bos|>
  tokenizer_config.json    tokenizer_class PreTrainedTokenizerFast, bos/eos/pad tokens,
                           model_max_length, and a Jinja chat template using the role markers
  special_tokens_map.json

Special tokens get the first ids, in this order:
  0 <|pad|>  1 <|bos|>  2 <|eos|>  3 <|system|>  4 <|user|>  5 <|assistant|>  6 <|tool|>  7 <|end|>

The chat template renders
  <|bos|><|system|>\\n...<|end|>\\n<|user|>\\n...<|end|>\\n<|assistant|>\\n
so a reply ends with <|end|> (generation_config.json lists it as an EOS id beside <|eos|>).

Usage:  python tools/train_tokenizer.py [--corpus build/corpus] [--out build/tokenizer]
        [--vocab-size 4096] [--force]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
END = "<|end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS, END]
MODEL_MAX_LENGTH = 512

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def log(msg: str) -> None:
    print(f"[tokenizer] {msg}", flush=True)


def read_documents(path: Path) -> list[str]:
    """train.txt / heldout.txt -> documents (separated by two blank lines, see tools/corpus.py)."""
    text = path.read_text(encoding="utf-8")
    return [d.strip("\n") for d in text.split("\n\n\n") if d.strip()]


def build_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    return tok


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict:
    return {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}


def verify(folder: Path, sample: str) -> None:
    """Load with transformers and check round trips, BOS handling and the chat template."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder))
    ids = hf(sample)["input_ids"]
    assert ids[0] == hf.bos_token_id and ids[1] != hf.bos_token_id, ids[:4]
    back = hf.decode(ids, skip_special_tokens=True)
    assert back == sample, (back[:200], sample[:200])
    assert hf.decode(hf.encode(sample, add_special_tokens=False)) == sample
    msgs = [{"role": "system", "content": "You are a storyteller."},
            {"role": "user", "content": "Tell me about the sea."}]
    text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    want = ("<|bos|><|system|>\nYou are a storyteller.<|end|>\n<|user|>\nTell me about the sea."
            "<|end|>\n<|assistant|>\n")
    assert text == want, repr(text)
    chat_ids = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):  # transformers 5 returns a BatchEncoding
        chat_ids = chat_ids["input_ids"]
    assert chat_ids[0] == hf.bos_token_id and chat_ids.count(hf.bos_token_id) == 1, chat_ids[:5]
    for t in SPECIAL_TOKENS:
        assert hf.convert_tokens_to_ids(t) == SPECIAL_TOKENS.index(t), t
        assert len(hf.encode(t, add_special_tokens=False)) == 1, t
    log(f"transformers {__import__('transformers').__version__}: AutoTokenizer loads it; round trip, "
        f"BOS and chat template OK ({len(chat_ids)} ids for a 2-message chat)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(ROOT / "build/corpus"), help="folder with train.txt")
    ap.add_argument("--out", default=str(ROOT / "build/tokenizer"), help="output folder")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--force", action="store_true", help="retrain even if up to date")
    ap.add_argument("--no-verify", action="store_true", help="skip the transformers checks")
    args = ap.parse_args()
    corpus, out = Path(args.corpus), Path(args.out)
    train = corpus / "train.txt"
    if not train.exists():
        raise SystemExit(f"{train} not found: run python tools/corpus.py first")

    t0 = time.time()
    train_sha = hashlib.sha256(train.read_bytes()).hexdigest()
    stamp = {"train_sha256": train_sha, "vocab_size": args.vocab_size,
             "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    stamp_path = out / "build_info.json"
    if not args.force and stamp_path.exists() and (out / "tokenizer.json").exists():
        try:
            if json.loads(stamp_path.read_text()) == stamp:
                log(f"up to date: {out}; use --force to retrain")
                if not args.no_verify:
                    verify(out, read_documents(corpus / "heldout.txt")[0][:1200])
                return 0
        except json.JSONDecodeError:
            pass

    docs = read_documents(train)
    log(f"training byte-level BPE (vocab {args.vocab_size}) on {train} "
        f"({train.stat().st_size / 1e6:.1f} MB, {len(docs)} documents)")
    tok = build_tokenizer(docs, args.vocab_size)
    log(f"trained in {time.time() - t0:.1f}s; vocab size {tok.get_vocab_size()}")

    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special_tokens_map(), indent=2) + "\n")

    # bytes per token on held-out text: a quick health check of the merges
    held = read_documents(corpus / "heldout.txt")
    n_bytes = sum(len(d.encode()) for d in held)
    n_tok = sum(len(e.ids) for e in tok.encode_batch(held, add_special_tokens=False))
    log(f"held-out: {n_bytes} bytes -> {n_tok} tokens ({n_bytes / n_tok:.2f} bytes/token)")
    stamp["heldout_bytes_per_token"] = round(n_bytes / n_tok, 4)
    if not args.no_verify:
        verify(out, held[0][:1200])
    stamp_path.write_text(json.dumps({k: stamp[k] for k in ("train_sha256", "vocab_size",
                                                            "script_sha256")}, indent=2) + "\n")
    log(f"wrote {out} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
