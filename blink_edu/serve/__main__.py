"""``python -m blink_edu.serve``: an OpenAI-compatible server, frontend and engine in two processes.

docs/design.md §1, §2 and Blink §3: the frontend (this process: HTTP, SSE, tokenizer) writes requests
into a shared-memory ring; the engine (a spawned process: model, scheduler, KV) polls the ring,
runs the model and publishes tokens back into it. See ``launcher.py`` for the lifecycle.

    python -m blink_edu.serve                      # the bundled model on 127.0.0.1:8000
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "Once upon a time", "max_tokens": 32, "stream": true}'

A full ring (or ``--max-queue`` requests already in it) answers 429 with ``Retry-After: 1``.
"""

from __future__ import annotations

import argparse
import sys

from ..config import EXECUTORS, POLICY_NAMES


def port_number(text: str) -> int:
    """A TCP port for argparse: an integer in 1..65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer in 1..65535, got {text!r}")
    return port


class HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in --help, unless its help names the default itself."""

    def _get_help_string(self, action):
        if "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m blink_edu.serve",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=HelpWithDefaults)
    p.add_argument("--model", default=None, help="a Hugging Face model folder (default: bundled)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients send as `model` (default: blink-edu-7m, or the "
                        "folder's name)")
    p.add_argument("--executor", default="auto",
                   choices=EXECUTORS,
                   help="who runs each step (auto: the backend picks; persistent: the scheduler "
                        "kernel runs the model inline; persistent-graph: it launches a CUDA graph "
                        "per step from the GPU)")
    p.add_argument("--policy", default="fcfs", choices=POLICY_NAMES,
                   help="scheduling under memory pressure: fcfs (recompute preemption, vLLM v1), "
                        "lvf (SuperInfer's Largest-VLT-First, KV rotated to host memory), "
                        "waiting-first, swapped-first")
    p.add_argument("--ring-slots", type=int, default=4096, help="ring buffer slots")
    p.add_argument("--max-logprobs", type=int, default=5,
                   help="most top logprobs per token a request may ask for (the ring keeps "
                        "room for them in every slot: 8 bytes x slots x context each)")
    p.add_argument("--kv-blocks", type=int, default=512, help="KV cache blocks (16 tokens each)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests per step")
    p.add_argument("--max-queue", type=int, default=None,
                   help="most requests in the ring at once; more get 429 (default: ring size)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port, 1..65535")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>'")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGINT/SIGTERM")
    p.add_argument("--max-engine-restarts", type=int, default=5,
                   help="engine deaths in a row the server restarts it after (with backoff); "
                        "one more and the server exits with status 3")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="log level; info and below also log every request (access log)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # Imported here, not at the top: the spawned engine process re-imports this module (as
    # multiprocessing's __mp_main__) and needs none of the frontend's web stack.
    from .launcher import serve

    try:
        return serve(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
