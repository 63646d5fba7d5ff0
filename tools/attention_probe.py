"""Time prompt attention on a GPU: the per-token path against the tensor-core tile, one prompt at
the SmolLM2-135M shape (9 query / 3 KV heads of 64), inside a CUDA graph.

    python tools/attention_probe.py [--tokens 128 512 2048] [--chunks 16 32 64] [--replays 20] [--json F]
    ncu -k regex:paged_attention --section ... python tools/attention_probe.py --once --tokens 512

For each prompt length P (a whole prompt in one step, positions 0..P-1, KV in scattered blocks of
16) it checks the two kernels against each other (relative difference below 1e-2: the tile rounds
q, k, v and the probabilities to fp16), then times ``--replays`` launches of each captured in one
CuPy graph (a launch from Python costs ~55 µs, more than a short prompt's attention).
``--chunks``: the tile's KV positions a chunk (``BLINK_EDU_ATTENTION_CHUNK``, a compile-time
constant), each value timed in a process of its own. Prints the table; with ``--json`` writes it
with the machine and the commit (``BLINK_EDU_COMMIT``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

os.environ.setdefault("BLINK_EDU_BACKEND", "gpu")
from tc_matmul_probe import time_in_graph  # noqa: E402  (tools/, beside this script)

from blink_edu.bench.results import commit, machine  # noqa: E402
from blink_edu.kernels import attention_tc  # noqa: E402
from blink_edu.kernels.attention import (attention_work_items, paged_attention_kernel,  # noqa: E402
                                         paged_attention_tc_kernel)
from blink_edu.kernels.reduce import THREADS, cuda, grid_for  # noqa: E402

H, K, E, B = 9, 3, 64, 16


def probe(P: int, replays: int, rng, once: bool = False) -> dict:
    """One prompt of P tokens: both kernels checked against each other and timed (``once``: each
    launched once, untimed — for Nsight Compute)."""
    blocks = -(-P // B)
    # Numba device arrays: a CuPy array handed to a Numba kernel is synchronised through its
    # stream at every launch, which a stream capture refuses (cudaErrorStreamCaptureIsolation).
    qkv = cuda.to_device(rng.standard_normal((P, (H + 2 * K) * E)).astype(np.float32))
    pool = cuda.to_device(rng.standard_normal((blocks + 4, 30, 2, B, K, E)).astype(np.float32))
    tables = cuda.to_device(rng.permutation(blocks + 4)[:blocks][None].astype(np.int32))
    positions = cuda.to_device(np.arange(P, dtype=np.int32))
    seq_rows = cuda.to_device(np.zeros(P, np.int32))
    outs = {}
    row = {"tokens": P}
    for name, kernel, tiles in (("per_token", paged_attention_kernel, False),
                                ("tile", paged_attention_tc_kernel, True)):
        out = cuda.to_device(np.full((P, H * E), np.nan, np.float32))
        grid = grid_for(attention_work_items(P, H, K, E, tiles))

        def launch(stream, _, kernel=kernel, out=out, grid=grid):
            kernel[grid, THREADS, stream](qkv, positions, seq_rows, tables, pool, 7, H, K, out)

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


def rows_with_chunks(args) -> list[dict]:
    """This process's rows for its own chunk size, or, with several ``--chunks``, one child
    process a chunk size (the constant is read when the module is imported)."""
    if len(args.chunks) == 1 and os.environ.get("BLINK_EDU_ATTENTION_CHUNK") == str(args.chunks[0]):
        rng = np.random.default_rng(0)
        return [{**probe(P, args.replays, rng), "chunk": attention_tc.KC} for P in args.tokens]
    rows = []
    for kc in args.chunks:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run([sys.executable, __file__, "--tokens", *map(str, args.tokens),
                            "--chunks", str(kc), "--replays", str(args.replays), "--json", f.name],
                           env={**os.environ, "BLINK_EDU_ATTENTION_CHUNK": str(kc)}, check=True,
                           stdout=subprocess.DEVNULL)
            rows += json.load(open(f.name))["rows"]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--chunks", type=int, nargs="+", default=[16])
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--once", action="store_true",
                        help="launch each kernel once at the first --tokens, untimed (for ncu -k "
                             "regex:paged_attention)")
    args = parser.parse_args()
    if args.once:
        row = probe(args.tokens[0], 0, np.random.default_rng(0), once=True)
        print(f"chunk {attention_tc.KC}, {row['tokens']} tokens: rel diff {row['rel_diff']:.1e}")
        return 0 if row["rel_diff"] < 1e-2 else 1
    rows = rows_with_chunks(args)
    print(f"{'chunk':>5s} {'tokens':>7s} {'per-token µs':>13s} {'tile µs':>9s} {'speedup':>8s} "
          f"{'tile TFLOP/s':>13s} {'rel diff':>9s}")
    ok = True
    for r in rows:
        print(f"{r['chunk']:5d} {r['tokens']:7d} {r['per_token_us']:13.1f} {r['tile_us']:9.1f} "
              f"{r['speedup']:8.1f} {r['tile_tflops']:13.2f} {r['rel_diff']:9.1e}")
        ok &= r["rel_diff"] < 1e-2
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "commit": commit(), "heads": [H, K, E],
                       "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
