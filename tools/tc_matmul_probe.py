"""Time the tensor-core matmul tile at the SmolLM2-135M shapes on a GPU, inside a CUDA graph.

    python tools/tc_matmul_probe.py [--rows 64 512] [--replays 50] [--runs 20] [--bk 32] [--json F]
    ncu -k regex:tc_matmul --section ... python tools/tc_matmul_probe.py --once   # the tile profiled

For each token count R and each linear layer of the 135M shape (hidden 576, intermediate 1536,
9 query / 3 KV heads of 64, vocab 49152) it first checks ``launch_tc_linear`` (prologue and
tile, the k range split as the executors split it) against a float64 NumPy reference (exit 1 if
the relative error is not below 1e-2), then times it, and the tile alone with other splits of
the k range (``--steps``: k steps a work item; 0 = all of them, no split). A launch from
Python costs ~55 µs of host time, more than these kernels take, so ``--replays`` launches are
captured into one CuPy graph and the graph is replayed ``--runs`` times between two CUDA events
(the ~0.5 µs a graph node costs is included). Beside it, the same for the FMA tile (``tiled_matmul``),
and cuBLAS (CuPy fp16 ``matmul``, which cannot be captured: it is timed queued behind a kernel that
holds the stream, so that only GPU time is counted). ``--bk`` sets the tile's k step before it is
compiled (one value a process: run the script once per value to compare). Beside them,
``matmul_tc_decode``'s linear kernel and, up to ``--gemv-max`` tokens, the GEMV; for gate/up,
the tile followed by ``swiglu_kernel`` against the tile with SwiGLU in its epilogue
(``launch_tc_swiglu``, also checked against the reference) and ``tc_decode_swiglu``.

The timed launches cycle through ``--weight-copies`` copies of each weight matrix (30 by default,
as a decode step streams its 30 layers): one matrix replayed again and again sits in the H200's
50 MB L2 cache and flatters every kernel, which is how a probe at 732a3be predicted a faster
batch-64 step than the step measured. Prints one table, and with ``--json`` writes it with the
machine and the commit (pass ``BLINK_EDU_COMMIT`` on a machine whose tree is a copy).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("BLINK_EDU_BACKEND", "gpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from blink_edu.backend import get_backend  # noqa: E402
from blink_edu.kernels.linear import gemv_kernel, gemv_work_items, linear_work_items, tiled_matmul  # noqa: E402
from blink_edu.kernels.elementwise import elementwise_items, swiglu_kernel  # noqa: E402
from blink_edu.kernels.matmul_tc_decode import (  # noqa: E402
    tc_decode_items, tc_decode_linear_kernel, tc_decode_swiglu_kernel)
from blink_edu.kernels import matmul_tc, matmul_tc_decode  # noqa: E402
from blink_edu.kernels.matmul_tc import (  # noqa: E402
    QUAD, launch_tc_linear, launch_tc_swiglu, require_tc_operands, tc_steps_per_split,
    tile_geometry)
from blink_edu.kernels.reduce import THREADS, cuda, grid_for  # noqa: E402
from blink_edu.kernels.sync import spin_for_ns  # noqa: E402

# name: (O, I, fused norm, residual add), as the 135M decoder uses them (no biases in Llama)
SHAPES = {"qkv": (960, 576, True, False), "o": (576, 576, False, True),
          "gate_up": (3072, 576, True, False), "down": (576, 1536, False, True),
          "lm_head": (49152, 576, True, False)}
EPS = np.float32(1e-5)
TOLERANCE = 1e-2


@cuda.jit
def fma_tile_kernel(x, x_rows, norm_w, eps, w, bias, out, accumulate):
    """The FMA tile alone (``linear_kernel`` takes the tensor-core tile for float16 weights)."""
    tiled_matmul(x, x_rows, norm_w, eps, w, bias, out, accumulate, cuda.blockIdx.x, cuda.gridDim.x)


def operands(rng, R, O, I, norm, residual):
    """Device arrays for one layer, in ``launch_tc_linear``'s order: x (R + 5, I), x_rows (R,),
    norm_w (I,) or (0,), eps, w (O, I) f16, bias (0,), out (R, O), accumulate, row_scale (R,) —
    and the starting ``out`` and the float64 reference product (R, O)."""
    x = rng.standard_normal((R + 5, I)).astype(np.float32)
    x_rows = rng.permutation(R + 5)[:R].astype(np.int32)
    g = (1 + 0.2 * rng.standard_normal(I)).astype(np.float32) if norm else np.zeros(0, np.float32)
    w = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float16)
    start = rng.standard_normal((R, O)).astype(np.float32)
    h = x[x_rows].astype(np.float64)
    if norm:
        h = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + EPS) * g
    reference = h @ w.astype(np.float64).T  # (R, O), without the residual
    require_tc_operands(x_rows, w, start)
    args = [cuda.to_device(a) for a in (x, x_rows, g)] + [EPS] + \
        [cuda.to_device(w), cuda.to_device(np.zeros(0, np.float32)), cuda.to_device(start)]
    return args + [int(residual), cuda.device_array(R, np.float32)], start, reference


def time_in_graph(launch, replays: int, runs: int) -> float:
    """Microseconds per launch: ``replays`` launches captured into a graph, replayed ``runs`` times.
    ``launch(stream, i)`` is the i-th launch (it picks its weight copy from i)."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    on_stream = cuda.external_stream(stream.ptr)
    launch(on_stream, 0)  # compile outside the capture
    stream.synchronize()
    stream.begin_capture()
    for i in range(replays):
        launch(on_stream, i)
    graph = stream.end_capture()
    graph.launch(stream)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(runs):
        graph.launch(stream)
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / (replays * runs)


def time_cublas(R: int, O: int, I: int, repeats: int, copies: int) -> float:
    """Microseconds per fp16 cuBLAS matmul (R, I) @ (I, O), GPU time only, cycling through
    ``copies`` weight matrices as the other kernels do."""
    import cupy as cp

    x = cp.random.standard_normal((R, I), dtype=cp.float32).astype(cp.float16)
    ws = [cp.random.standard_normal((O, I), dtype=cp.float32).astype(cp.float16)
          for _ in range(copies)]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cp.matmul(x, ws[0].T)  # plan and warm up
        stream.synchronize()
        # a 50 ms spin holds the stream: the host queues everything below before any of it runs
        spin_for_ns[1, 1, cuda.external_stream(stream.ptr)](50_000_000)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for i in range(repeats):
            cp.matmul(x, ws[i % copies].T)
        end.record(stream)
        end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / repeats


def check_swiglu_tile(kernel_args, reference) -> float:
    """The tile with SwiGLU in its epilogue (``launch_tc_swiglu``) once, against the float64
    reference gate/up (R, 2F): its relative error."""
    R, F = reference.shape[0], reference.shape[1] // 2
    act = cuda.to_device(np.full((R, F), np.nan, np.float32))
    launch_tc_swiglu(*kernel_args[:6], act)
    gate, up = reference[:, :F], reference[:, F:]
    expected = gate / (1 + np.exp(-gate)) * up
    return float(np.linalg.norm(act.copy_to_host() - expected) / np.linalg.norm(expected))


def time_gate_up_with_swiglu(with_copy, R: int, F: int, num_sms: int, args) -> dict:
    """µs of the gate/up projection followed by SwiGLU, three ways: the tile as a plain linear
    layer (the k range split as the executors split it: with its prologue) and then
    ``swiglu_kernel`` (the (R, 2F) gate_up through memory); the tile with SwiGLU in its epilogue
    (``launch_tc_swiglu``, one kernel, k never split); ``tc_decode_swiglu`` (one kernel)."""
    act = cuda.device_array((R, F), np.float32)
    swiglu_grid = grid_for(elementwise_items(R * F))

    def tile_then_swiglu(s, i):
        launch_tc_linear(*with_copy(i), stream=s, num_sms=num_sms)
        swiglu_kernel[swiglu_grid, THREADS, s](with_copy(i)[6], act)

    def tile_swiglu(s, i):
        launch_tc_swiglu(*with_copy(i)[:6], act, stream=s)

    def fused(s, i):
        x, x_rows, norm_w, eps, w, bias = with_copy(i)[:6]
        tc_decode_swiglu_kernel[grid_for(tc_decode_items("swiglu", R, F)), THREADS, s](
            x, x_rows, norm_w, eps, w, bias, act)

    out = {"tile_then_swiglu_us": time_in_graph(tile_then_swiglu, args.replays, args.runs),
           "tile_swiglu_us": time_in_graph(tile_swiglu, args.replays, args.runs)}
    if not args.tile_only:
        out["tc_decode_swiglu_us"] = time_in_graph(fused, args.replays, args.runs)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--decode-mt", type=int, help="m16 tiles a row group of matmul_tc_decode")
    parser.add_argument("--weight-copies", type=int, default=30,
                        help="weight matrices the timed launches cycle through (30: the 135M "
                             "model's layers, more than the L2 cache holds, as in a decode step; "
                             "1: the same matrix every launch, L2-resident)")
    parser.add_argument("--gemv-max", type=int, default=16,
                        help="also time the GEMV up to this many rows")
    parser.add_argument("--steps", type=int, nargs="*", default=[1, 2, 3, 0],
                        help="k steps a work item to time beside the executors' choice (0: all)")
    parser.add_argument("--replays", type=int, default=50, help="launches captured in one graph")
    parser.add_argument("--runs", type=int, default=20, help="graph replays timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bk", type=int, choices=[32, 64], help="k step (default: the module's)")
    parser.add_argument("--warp-tile", type=int, nargs=2, metavar=("MI", "NI"),
                        help="mma tiles a warp along m and n (default: the module's 2 4; the "
                             "block tile follows: 2 x 2 warps)")
    parser.add_argument("--json", default=None, help="also write the table here (JSON)")
    parser.add_argument("--tile-only", action="store_true",
                        help="time the tile alone: no FMA tile, cuBLAS, matmul_tc_decode or GEMV "
                             "beside it (to compare two trees of the tile in one call)")
    parser.add_argument("--once", action="store_true",
                        help="only the checked launch of each shape, nothing timed (for ncu)")
    args = parser.parse_args(argv)
    rows = []
    if args.warp_tile:  # before the first launch compiles the kernel with the module's constants
        mi, ni = args.warp_tile
        if mi < 1 or ni < 2 or ni % 2:
            parser.error(f"--warp-tile {mi} {ni}: MI >= 1 and an even NI >= 2 (B fragments load "
                         "by pairs of column tiles)")
        matmul_tc.MI, matmul_tc.NI, matmul_tc.WM, matmul_tc.WN = mi, ni, 16 * mi, 8 * ni
        matmul_tc.ACC_SHAPE, matmul_tc.A_FRAG, matmul_tc.B_FRAG = (mi, ni, 4), (mi, 4), (ni, 2)
    if args.bk or args.warp_tile:
        try:
            geometry = tile_geometry(THREADS, args.bk or matmul_tc.BK)
        except AssertionError:
            parser.error(f"this block tile cannot be staged by {THREADS} threads in k steps of "
                         f"{args.bk or matmul_tc.BK}")
        for name, value in geometry._asdict().items():
            setattr(matmul_tc, name, value)
        matmul_tc.A_VALUES, matmul_tc.B_WORDS = QUAD * geometry.A_LOADS, QUAD * geometry.B_LOADS
        matmul_tc.LOADS = geometry.A_LOADS + geometry.B_LOADS
        matmul_tc.SQ_SHAPE = (geometry.BM, geometry.A_QUADS)
        shared = 4 * (geometry.A_TILE + geometry.B_TILE + geometry.BM * (geometry.A_QUADS + 1))
        if shared > 48 * 1024:
            parser.error(f"this tile needs {shared / 1024:.0f} KB of shared memory a block, over "
                         "the 48 KB of a static allocation: take a smaller tile or --bk 32")
    if args.decode_mt:  # before the first launch compiles the kernels
        mt = args.decode_mt
        matmul_tc_decode.MT, matmul_tc_decode.ROWS = mt, 16 * mt
        matmul_tc_decode.ACC_SHAPE = (mt, matmul_tc_decode.NJ, 4)
        matmul_tc_decode.A_SHAPE, matmul_tc_decode.SQ_SHAPE = (mt, 2, 4), (mt, 2)
    num_sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    rng = np.random.default_rng(args.seed)
    print(f"tile {matmul_tc.BM}x{matmul_tc.BN}, k step {matmul_tc.BK}, {THREADS} threads; "
          f"{get_backend().device_name}, {num_sms} SMs")
    variants = " ".join(f"{f'k/{s}' if s else 'k all':>7}" for s in args.steps)
    print(f"{'shape':>8} {'R':>4} {'O x I':>12} {'err':>8} | {'steps':>5} {'tc µs':>7} "
          f"{'TFLOP/s':>7} {'W GB/s':>7} | {variants} | {'fma µs':>7} {'cuBLAS µs':>9} "
          f"{'tc/cuBLAS':>9} | {'dec err':>8} {'dec µs':>7} {'gemv µs':>7}")
    for R in args.rows:
        for name, (O, I, norm, residual) in SHAPES.items():
            kernel_args, start, reference = operands(rng, R, O, I, norm, residual)
            out = kernel_args[6]
            launch_tc_linear(*kernel_args, num_sms=num_sms)
            got = out.copy_to_host() - (start if residual else 0)
            err = np.linalg.norm(got - reference) / np.linalg.norm(reference)
            if not err < TOLERANCE:
                print(f"{name} at R={R}: relative error {err:.2e} >= {TOLERANCE}: not timed")
                return 1
            steps = tc_steps_per_split(R, O, I, num_sms)
            copies = [kernel_args[4]]  # the same weights again: one matrix a layer
            for _ in range(args.weight_copies - 1):
                copies.append(cuda.device_array_like(kernel_args[4]))
                copies[-1].copy_to_device(kernel_args[4])

            def with_copy(i, kernel_args=kernel_args, copies=copies):
                """The launch's arguments with weight copy i (mod the copies)."""
                return kernel_args[:4] + [copies[i % len(copies)]] + kernel_args[5:]

            # the decode-batch kernel (matmul_tc_decode), from the same starting out
            out.copy_to_device(start)
            dec_grid = grid_for(tc_decode_items("linear", R, O))
            tc_decode_linear_kernel[dec_grid, THREADS](*kernel_args[:8])
            got = out.copy_to_host() - (start if residual else 0)
            dec_err = np.linalg.norm(got - reference) / np.linalg.norm(reference)
            if not dec_err < TOLERANCE:
                print(f"{name} at R={R}: tc_decode relative error {dec_err:.2e} >= {TOLERANCE}")
                return 1
            if name == "gate_up":
                swiglu_err = check_swiglu_tile(kernel_args, reference)
                if not swiglu_err < TOLERANCE:
                    print(f"gate_up + SwiGLU at R={R}: the tile's relative error {swiglu_err:.2e}")
                    return 1
            if args.once:
                print(f"{name:>8} {R:>4} {f'{O}x{I}':>12} {err:8.1e} | {steps:>5}", flush=True)
                continue
            tc_us = time_in_graph(lambda s, i: launch_tc_linear(*with_copy(i), stream=s,
                                                                num_sms=num_sms),
                                  args.replays, args.runs)
            by_steps = {}
            k_steps = -(-I // matmul_tc.BK)
            for variant in args.steps:
                by_steps[variant] = time_in_graph(
                    lambda s, i: launch_tc_linear(*with_copy(i), stream=s,
                                                  steps_per_split=variant or k_steps),
                    args.replays, args.runs)
            fma_us = blas_us = dec_us = gemv_us = float("nan")
            if not args.tile_only:
                fma_grid = grid_for(linear_work_items(R, O))
                fma_us = time_in_graph(lambda s, i: fma_tile_kernel[fma_grid, THREADS, s](
                    *with_copy(i)[:8]), args.replays, args.runs)
                blas_us = time_cublas(R, O, I, args.replays, args.weight_copies)
                dec_us = time_in_graph(lambda s, i: tc_decode_linear_kernel[dec_grid, THREADS, s](
                    *with_copy(i)[:8]), args.replays, args.runs)
            if R <= args.gemv_max and not args.tile_only:
                gemv_grid = grid_for(gemv_work_items(O))
                gemv_us = time_in_graph(lambda s, i: gemv_kernel[gemv_grid, THREADS, s](
                    *with_copy(i)[:8]), args.replays, args.runs)
            fused = {}
            if name == "gate_up":  # SwiGLU after the tile, or in an epilogue
                fused = time_gate_up_with_swiglu(with_copy, R, O // 2, num_sms, args)
            tflops = 2 * R * O * I / (tc_us * 1e-6) / 1e12
            weight_gbs = 2 * O * I / (tc_us * 1e-6) / 1e9
            cells = " ".join(f"{by_steps[v]:7.1f}" for v in args.steps)
            print(f"{name:>8} {R:>4} {f'{O}x{I}':>12} {err:8.1e} | {steps:>5} {tc_us:7.1f} "
                  f"{tflops:7.1f} {weight_gbs:7.0f} | {cells} | {fma_us:7.1f} {blas_us:9.1f} "
                  f"{tc_us / blas_us:9.2f} | {dec_err:8.1e} {dec_us:7.1f} {gemv_us:7.1f}",
                  flush=True)
            rows.append({"shape": f"{name} R={R}", "O": O, "I": I, "R": R, "error": float(err),
                         "steps_per_split": steps, "us": tc_us, "tflops": tflops,
                         "us_by_steps_per_split": {str(v or k_steps): t for v, t in by_steps.items()},
                         "fma_us": fma_us, "fma_tflops": 2 * R * O * I / (fma_us * 1e-6) / 1e12,
                         "cublas_us": blas_us, "tc_decode_us": dec_us,
                         "tc_decode_error": float(dec_err), "gemv_us": gemv_us, **fused})
            if fused:
                print(f"{'':>8} {R:>4} gate_up + SwiGLU: tile then swiglu_kernel "
                      f"{fused['tile_then_swiglu_us']:.1f} µs, the tile's epilogue "
                      f"{fused['tile_swiglu_us']:.1f} µs, matmul_tc_decode's "
                      f"{fused.get('tc_decode_swiglu_us', float('nan')):.1f} µs", flush=True)
    if args.json:
        import json

        from blink_edu.bench.results import commit, machine
        with open(args.json, "w") as f:
            json.dump({"name": "tc_matmul", "commit": commit(), "machine": machine(),
                       "weight_copies": args.weight_copies,
                       "tile": {"BM": matmul_tc.BM, "BN": matmul_tc.BN, "BK": matmul_tc.BK},
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
