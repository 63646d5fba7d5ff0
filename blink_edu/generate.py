"""``python -m blink_edu.generate``: stream a continuation of a prompt from the bundled model.

The smallest end-to-end path through the project: tokenizer -> engine (scheduler + executor) ->
incremental detokenizer -> your terminal. With no flags it runs the bundled model (``data/``) on
whatever this machine has: the GPU kernels on a GPU, the NumPy reference on a CPU.

    python -m blink_edu.generate --prompt "Once upon a time"
    python -m blink_edu.generate --chat --prompt "Tell me about the sea." --temperature 0.8
"""

from __future__ import annotations

import argparse
import sys
import time

from .backend import describe
from .config import EXECUTORS, EngineConfig, SamplingParams
from .engine.llm_engine import LLMEngine
from .model.bundled import resolve_model_dir
from .model.tokenizer import Tokenizer, stop_ids


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m blink_edu.generate",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--prompt", default="Once upon a time", help="the text to continue")
    p.add_argument("--model", default=None,
                   help="a Hugging Face model folder; None means the bundled one")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=80, help="most new tokens")
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling: 1 = off")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest: 0 = off")
    p.add_argument("--seed", type=int, default=None, help="sampling seed; None draws a fresh one")
    p.add_argument("--executor", choices=EXECUTORS, default="auto",
                   help="who runs each step (auto: the CUDA-graph executor on a GPU, the NumPy "
                        "reference on a CPU; a kernel executor on a CPU runs in the slow "
                        "simulator)")
    p.add_argument("--quiet", action="store_true", help="no statistics line on stderr")
    return p.parse_args(argv)


def timing_line(count: int, total_s: float, first_s: float) -> str:
    """"N tokens in T s; first token F ms, then R tokens/s" — R with three significant digits,
    as seconds per token when slower than one a second, and left out with fewer than 2 tokens."""
    line = f"{count} tokens in {total_s:.2f} s; first token {1e3 * first_s:.0f} ms"
    if count < 2:
        return line
    per_token = (total_s - first_s) / (count - 1)
    if per_token <= 0:
        return line
    if per_token > 1:
        return f"{line}, then {per_token:.3g} s per token"
    return f"{line}, then {1 / per_token:.3g} tokens/s"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        folder = resolve_model_dir(args.model)
        tokenizer = Tokenizer.from_folder(folder)
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, seed=args.seed)
        text = (tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
                if args.chat else args.prompt)
        prompt_ids = tokenizer.encode(text)
        engine = LLMEngine(folder, EngineConfig(executor=args.executor),
                           eos_token_ids=stop_ids(folder, tokenizer))
        request = engine.add_request(prompt_ids, params)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    detok = tokenizer.detokenizer(prompt_ids)
    print(args.prompt if not args.chat else "", end="", flush=True)
    start, first, count = time.perf_counter(), None, 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id != request:
                continue
            first = first or time.perf_counter()
            count += 1
            print(detok.push(out.token_id), end="", flush=True)
    print(detok.flush(), flush=True)
    if not args.quiet:
        total = time.perf_counter() - start
        first = first or start
        print(f"[{timing_line(count, total, first - start)}; executor={engine.executor.name}, "
              f"{describe()}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
