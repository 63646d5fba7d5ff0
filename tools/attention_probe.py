"""Time prompt attention on a GPU: the per-token path against the tensor-core tile, one prompt at
the SmolLM2-135M shape (9 query / 3 KV heads of 64), inside a CUDA graph.

    python tools/attention_probe.py [--tokens 128 512 2048] [--chunks 16 32 64] [--replays 20] [--json F]
    python tools/attention_probe.py --decode [--batches 1 8 64] [--contexts 48 512] [--spans 0 64 128]
    ncu -k regex:paged_attention --section ... python tools/attention_probe.py --once --tokens 512

For each prompt length P (a whole prompt in one step, positions 0..P-1, KV in scattered blocks of
16) it checks the two kernels against each other (relative difference below 1e-2: the tile rounds
q, k, v and the probabilities to fp16), then times ``--replays`` launches of each captured in one
CuPy graph (a launch from Python costs ~55 µs, more than a short prompt's attention).
``--chunks``: the tile's KV positions a chunk (``BLINK_EDU_ATTENTION_CHUNK``, a compile-time
constant; the default is what the executors run), each value timed in a process of its own.
``--decode``: decode batches instead (one token a sequence, contexts ``--contexts``), the
per-token path built with each of ``--spans`` (``BLINK_EDU_DECODE_SPAN``: the fewest positions a
split walks; 0, never split), each against the NumPy reference. Prints the table; with
``--json`` writes it with the machine and the commit (``BLINK_EDU_COMMIT``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np

os.environ.setdefault("BLINK_EDU_BACKEND", "gpu")
from tc_matmul_probe import time_in_graph  # noqa: E402  (tools/, beside this script)

from blink_edu.bench.results import commit, machine  # noqa: E402
from blink_edu.kernels import attention, attention_tc  # noqa: E402
from blink_edu.kernels.attention import (attention_scratch, attention_work_items,  # noqa: E402
                                         paged_attention_kernel, paged_attention_tc_kernel)
from blink_edu.kernels.reduce import THREADS, cuda, grid_for  # noqa: E402

H, K, E, B = 9, 3, 64, 16
LAYERS = 8  # layers in the probe's KV pool: the kernels read layer 7, with 7 layers' strides before it


def probe(P: int, replays: int, rng, once: bool = False) -> dict:
    """One prompt of P tokens: both kernels checked against each other and timed (``once``: each
    launched once, untimed — for Nsight Compute)."""
    blocks = -(-P // B)
    # Numba device arrays: a CuPy array handed to a Numba kernel is synchronised through its
    # stream at every launch, which a stream capture refuses (cudaErrorStreamCaptureIsolation).
    qkv = cuda.to_device(rng.standard_normal((P, (H + 2 * K) * E)).astype(np.float32))
    pool = cuda.to_device(rng.standard_normal((blocks + 4, LAYERS, 2, B, K, E)).astype(np.float32))
    tables = cuda.to_device(rng.permutation(blocks + 4)[:blocks][None].astype(np.int32))
    positions = cuda.to_device(np.arange(P, dtype=np.int32))
    seq_rows = cuda.to_device(np.zeros(P, np.int32))
    outs = {}
    row = {"tokens": P}
    for name, kernel, tiles in (("per_token", paged_attention_kernel, False),
                                ("tile", paged_attention_tc_kernel, True)):
        out = cuda.to_device(np.full((P, H * E), np.nan, np.float32))
        grid = grid_for(attention_work_items(P, H, K, E, tiles))

        def launch(stream, _, kernel=kernel, out=out, grid=grid, scratch=attention_scratch(E)):
            kernel[grid, THREADS, stream](qkv, positions, seq_rows, tables, pool, 7, H, K, out,
                                          *scratch)

        if once:
            launch(0, 0)
        else:
            row[f"{name}_us"] = time_in_graph(launch, replays, runs=5)
        outs[name] = out.copy_to_host()
    a, b = outs["tile"], outs["per_token"]
    row["rel_diff"] = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    if once:
        return row
    flop = 4 * H * E * P * (P + 1) / 2  # q.k and p.v over the causal triangle
    row["tile_tflops"] = flop / row["tile_us"] / 1e6
    row["speedup"] = row["per_token_us"] / row["tile_us"]
    return row


def probe_decode(batch: int, context: int, replays: int, rng) -> dict:
    """A decode step's attention: ``batch`` sequences, one token each at position context - 1,
    through ``paged_attention_kernel`` (the per-token path this process was built with), checked
    against the NumPy reference and timed."""
    from blink_edu.model import reference as ref

    width = -(-context // B)
    q = rng.standard_normal((batch, H, E)).astype(np.float32)  # (T, H, E)
    qkv = np.concatenate([q.reshape(batch, -1), rng.standard_normal((batch, 2 * K * E))], 1)
    pool = rng.standard_normal((batch * width + 4, LAYERS, 2, B, K, E)).astype(np.float32)
    tables = rng.permutation(batch * width + 4)[:batch * width].reshape(batch, width).astype(np.int32)
    positions = np.full(batch, context - 1, np.int32)
    seq_rows = np.arange(batch, dtype=np.int32)
    args = [cuda.to_device(np.ascontiguousarray(a, dtype=a.dtype)) for a in
            (qkv.astype(np.float32), positions, seq_rows, tables, pool)]
    out = cuda.to_device(np.full((batch, H * E), np.nan, np.float32))
    grid = grid_for(attention_work_items(batch, H, K, E, False))
    scratch = attention_scratch(E)

    def launch(stream, _):
        paged_attention_kernel[grid, THREADS, stream](*args[:5], 7, H, K, out, *scratch)

    us = time_in_graph(launch, replays, runs=5)
    expected = ref.paged_attention(q, positions, seq_rows, pool, 7, tables).reshape(batch, -1)
    got = out.copy_to_host()
    return {"span": attention.span_from_environment(os.environ.get("BLINK_EDU_DECODE_SPAN")),
            "splits": attention.attention_splits(batch * H), "batch": batch, "context": context, "us": us,
            "rel_err": float(np.linalg.norm(got - expected) / np.linalg.norm(expected))}


def rows_in_children(args, variable: str, values: list, own_rows) -> list[dict]:
    """``own_rows()`` in a child process for each value of the environment variable ``variable``
    (a compile-time constant, read when the kernels' modules are imported). A child does not
    outlive this process: killed (``timeout``'s SIGTERM, Ctrl-C), it takes its child with it —
    one left running would share the GPU with whatever is timed next."""
    if os.environ.get("ATTENTION_PROBE_CHILD"):
        return own_rows()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind through the finally below
    rows = []
    for value in values:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            child = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--json", f.name],
                                     env={**os.environ, variable: str(value),
                                          "ATTENTION_PROBE_CHILD": "1"},
                                     stdout=subprocess.DEVNULL)
            try:
                if child.wait() != 0:
                    raise subprocess.CalledProcessError(child.returncode, child.args)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            rows += json.load(open(f.name))["rows"]
    return rows


def print_rows(rows: list[dict], decode: bool) -> bool:
    """The table; whether every row agrees with its reference."""
    if decode:
        print(f"{'span':>5s} {'splits':>6s} {'batch':>6s} {'context':>8s} {'µs':>8s} {'rel err':>9s}")
        for r in rows:
            print(f"{r['span']:5d} {r['splits']:6d} {r['batch']:6d} {r['context']:8d} {r['us']:8.1f} "
                  f"{r['rel_err']:9.1e}")
        return all(r["rel_err"] < 1e-4 for r in rows)
    print(f"{'chunk':>5s} {'tokens':>7s} {'per-token µs':>13s} {'tile µs':>9s} {'speedup':>8s} "
          f"{'tile TFLOP/s':>13s} {'rel diff':>9s}")
    for r in rows:
        print(f"{r['chunk']:5d} {r['tokens']:7d} {r['per_token_us']:13.1f} {r['tile_us']:9.1f} "
              f"{r['speedup']:8.1f} {r['tile_tflops']:13.2f} {r['rel_diff']:9.1e}")
    return all(r["rel_diff"] < 1e-2 for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--chunks", type=int, nargs="+",
                        default=[attention_tc.chunk_positions(None)])  # the default: what runs
    parser.add_argument("--decode", action="store_true",
                        help="decode batches instead: the per-token path at each of --spans")
    parser.add_argument("--spans", type=int, nargs="+", default=[0, 64, 128])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[48, 512])
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--once", action="store_true",
                        help="launch each kernel once at the first --tokens, untimed (for ncu -k "
                             "regex:paged_attention)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if args.once:
        row = probe(args.tokens[0], 0, rng, once=True)
        print(f"chunk {attention_tc.KC}, {row['tokens']} tokens: rel diff {row['rel_diff']:.1e}")
        return 0 if row["rel_diff"] < 1e-2 else 1
    if args.decode:
        rows = rows_in_children(args, "BLINK_EDU_DECODE_SPAN", args.spans, lambda: [
            probe_decode(b, c, args.replays, rng) for c in args.contexts for b in args.batches])
    else:
        rows = rows_in_children(args, "BLINK_EDU_ATTENTION_CHUNK", args.chunks, lambda: [
            {**probe(P, args.replays, rng), "chunk": attention_tc.KC} for P in args.tokens])
    ok = print_rows(rows, args.decode)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "commit": commit(), "heads": [H, K, E],
                       "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
