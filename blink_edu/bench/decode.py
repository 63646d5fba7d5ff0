"""``python -m blink_edu.bench.decode``: decode speed of the eager and graph executors, against
Hugging Face ``transformers`` on the same weights and against the HBM roofline.

docs/design.md §4 (peers measured on the H200). For each model — the bundled one and a
random-weight model of SmolLM2-135M's shape in fp16 — and each batch size, ``B`` sequences with
``P``-token prompts are prefilled, then ``steps`` decode steps are timed one by one (each step ends
with its sampled tokens back on the host). TPOT is the median step time; throughput ``B / TPOT``.

The roofline: a batch-1 decode step must read every weight once, so it cannot beat
``weight bytes / HBM bandwidth`` (bandwidth measured here with a large device-to-device copy).
The eager executor's host launch time is measured too (issuing one step's launches, no sync),
which is the chapter's "where does the time go" figure. Beside them, on the same weights and
batches, the PyTorch peer (``torch_peer``: a minimal Llama in a CUDA graph, plain and compiled),
whose rows give the summary's ``ours_over_torch_*`` ratios; ``peers`` says which of it ran.
Prefill too: one ``--prefill-tokens`` prompt at batch 1 through the graph executor and the peers
(``prefill_ms_{M}_{P}``, ``ours_over_torch_*_prefill_{M}_{P}``), and the achieved TFLOP/s of
the linear layers from the eager executor's per-op GPU time (``matmul_tflops_{M}_b{B}``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..config import EngineConfig, ModelConfig, SamplingParams
from ..executors.forward_ops import DOWN, GATE_UP, LM_HEAD, O_PROJ, OP_NAMES, QKV, linear_shape
from ..executors.kernel_executor import EagerExecutor, GraphExecutor
from ..executors.step import pack_step
from ..kernels.linear import FUSED_GEMV_MAX_ROWS, TENSOR_CORES
from ..kv.block_manager import BlockManager
from ..model.bundled import resolve_model_dir
from ..model.weights import ModelWeights, load_weights, random_weights
from .cli import bench_parser
from .results import print_table, write_results

SMOLLM2_135M = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def weight_bytes(config: ModelConfig, itemsize: int = 2) -> int:
    return config.num_parameters() * itemsize


def hbm_copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (CuPy, 1 GiB)."""
    import cupy

    a = cupy.empty(1 << 30, dtype=cupy.uint8)
    b = cupy.empty_like(a)
    b[...] = a
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(10):
        start.record()
        b[...] = a
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * a.nbytes / statistics.median(times)


class DecodeRun:
    """B sequences prefilled in one executor, then driven one decode step at a time."""

    def __init__(self, executor, batch: int, prompt_len: int, vocab: int, rng):
        self.executor, self.batch = executor, batch
        self.blocks = BlockManager(executor.scratch_block, executor.block_size)
        self.tokens = [rng.integers(3, vocab, size=prompt_len).tolist() for _ in range(batch)]
        self.cached = [0] * batch
        self.params = [SamplingParams(temperature=0)] * batch

    def step(self) -> float:
        chunks = []
        for s in range(self.batch):
            self.blocks.grow(s, len(self.tokens[s]))
            chunks.append((self.tokens[s][self.cached[s]:], self.cached[s]))
        batch = pack_step(chunks, self.blocks.block_table_array(list(range(self.batch))),
                          self.params, [0] * self.batch, [0] * self.batch)
        start = time.perf_counter()
        out = self.executor.step(batch)
        elapsed = time.perf_counter() - start
        for s in range(self.batch):
            self.cached[s] = len(self.tokens[s])
            self.tokens[s].append(int(out[s]))
        return elapsed

    def free(self):
        for s in range(self.batch):
            self.blocks.free(s)


def time_executor(executor, batches, prompt_len, steps, vocab, rng, label=None) -> list[dict]:
    """Decode TPOT of ``executor`` at each batch size; rows labelled ``label`` (its name)."""
    label = label or executor.name
    rows = []
    for batch in batches:
        run = DecodeRun(executor, batch, prompt_len, vocab, rng)
        run.step()  # prefill
        for _ in range(3):  # warm-up (compiles kernels, captures graphs)
            run.step()
        times = [run.step() for _ in range(steps)]
        tpot = statistics.median(times)
        row = {"executor": label, "batch": batch, "tpot_us": tpot * 1e6,
               "tokens_per_s": batch / tpot, "step_times_us": [t * 1e6 for t in times]}
        if executor.name == "eager":
            row["host_launch_us"] = host_launch_time(executor, batch) * 1e6
            row["op_gpu_us"] = op_breakdown(executor, batch)
            row["matmul_tflops"] = matmul_tflops(executor.config, batch, row["op_gpu_us"])
            ops = ", ".join(f"{k} {v:.0f}" for k, v in sorted(row["op_gpu_us"].items(), key=lambda kv: -kv[1]))
            print(f"    GPU us per op kind (isolated): {ops}", flush=True)
        run.free()
        rows.append(row)
        print(f"  {label:6s} B={batch:4d}  TPOT {tpot * 1e6:9.1f} us  {batch / tpot:9.0f} tok/s",
              flush=True)
    return rows


def prefill_breakdown(executor: EagerExecutor, prompt_len: int, vocab: int, rng) -> dict:
    """GPU microseconds per op kind of a ``prompt_len``-token prefill (the eager executor)."""
    run = DecodeRun(executor, 1, prompt_len, vocab, rng)
    run.step()  # compiles, and leaves the prompt's positions and blocks in the buffers
    ops = op_breakdown(executor, 1, tokens=prompt_len)
    run.free()
    listed = ", ".join(f"{k} {v:.0f}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1]))
    print(f"    prefill {prompt_len}: GPU us per op kind (isolated): {listed}", flush=True)
    return {"executor": executor.name, "prefill_tokens": prompt_len, "op_gpu_us": ops}


def time_prefill(executor, prompt_len: int, vocab: int, rng, repeats: int = 5) -> dict:
    """One ``prompt_len``-token prompt at batch 1: the step that prefills it (host time, the
    input copies and the sampled token included, as the peers' prefill), median of ``repeats``;
    a first run before them compiles its kernels and captures its graph."""
    times = []
    for i in range(repeats + 1):
        run = DecodeRun(executor, 1, prompt_len, vocab, rng)
        elapsed = run.step()
        run.free()
        if i > 0:
            times.append(elapsed)
    row = {"executor": executor.name, "prefill_tokens": prompt_len,
           "prefill_ms": statistics.median(times) * 1e3}
    print(f"  {executor.name:6s} prefill {prompt_len}  {row['prefill_ms']:.3f} ms", flush=True)
    return row


def host_launch_time(executor: EagerExecutor, batch: int) -> float:
    """Host time to issue one decode step's launches (no synchronisation)."""
    s_b, t_b = executor.buckets(batch, batch)
    times = []
    for _ in range(5):
        executor.synchronize()
        start = time.perf_counter()
        executor.launch_forward(s_b, t_b)
        times.append(time.perf_counter() - start)
    executor.synchronize()
    return statistics.median(times)


def hold_stream(stream, seconds: float) -> None:
    """Enqueue a kernel that keeps ``stream`` busy for about ``seconds`` (see ``op_breakdown``)."""
    from numba import cuda

    from ..kernels.sync import spin_for_ns

    spin_for_ns[1, 1, cuda.external_stream(stream.ptr)](int(seconds * 1e9))


def op_breakdown(executor: EagerExecutor, batch: int, repeats: int = 5,
                 tokens: int | None = None) -> dict[str, float]:
    """GPU microseconds per op kind in one decode step (or a step of ``tokens`` tokens: a
    prefill), summed over layers (median of repeats). The step's inputs are whatever the last
    step left in the executor's buffers: run that step first.

    Timing a kernel with events around it would also count the host's ~60 µs launch gap. So the
    stream is first held by a spin kernel long enough for the host to queue the whole step
    behind it, with an event between consecutive kernels; when the spin ends the kernels run back
    to back and the events measure GPU time only."""
    import cupy

    s_b, t_b = executor.buckets(batch, tokens or batch)
    stream = executor._cupy_stream
    runs: list[dict[str, float]] = []
    for _ in range(repeats):
        marks: list[tuple[str | None, object]] = []

        def probe(op):
            event = cupy.cuda.Event()
            event.record(stream)
            marks.append((op, event))

        executor.synchronize()
        hold_stream(stream, 0.05)
        executor.launch_forward(s_b, t_b, probe)
        executor.synchronize()
        totals: dict[str, float] = {}
        for (op, start), (_, end) in zip(marks, marks[1:]):
            totals[op] = totals.get(op, 0.0) + cupy.cuda.get_elapsed_time(start, end) * 1e3
        runs.append(totals)
    return {op: statistics.median(r[op] for r in runs) for op in runs[0]}


def matmul_tflops(config: ModelConfig, batch: int, op_gpu_us: dict[str, float]) -> float | None:
    """Achieved TFLOP/s of one step's linear layers at ``batch`` tokens (one sampled row each),
    from their GPU time in ``op_breakdown``: 2 x tokens x O x I flops per matrix."""
    flops, seconds = 0, 0.0
    for op in (QKV, O_PROJ, GATE_UP, DOWN, LM_HEAD):
        if OP_NAMES[op] not in op_gpu_us:
            return None
        O, I = linear_shape(op, config)
        flops += 2 * batch * O * I * (1 if op == LM_HEAD else config.num_layers)
        seconds += op_gpu_us[OP_NAMES[op]] * 1e-6
    return flops / seconds / 1e12


def graph_gpu_time(executor: GraphExecutor, batch: int) -> float:
    """GPU time of one replayed decode graph (CUDA events), seconds."""
    import cupy

    s_b, t_b = executor.buckets(batch, batch)
    graph = executor.graphs[(s_b, t_b)]
    stream = executor._cupy_stream
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(10):
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times)


def save_as_hf_folder(weights: ModelWeights, raw_config: dict, folder: Path) -> Path:
    """Write random weights as a fp16 Hugging Face folder so transformers loads the same numbers."""
    from safetensors.numpy import save_file

    from ..model.weights import expected_shapes

    cfg = weights.config
    tensors = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.final_norm}
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": lw.attn_norm,
                        p + "post_attention_layernorm.weight": lw.mlp_norm,
                        p + "self_attn.q_proj.weight": lw.wq, p + "self_attn.k_proj.weight": lw.wk,
                        p + "self_attn.v_proj.weight": lw.wv, p + "self_attn.o_proj.weight": lw.wo,
                        p + "mlp.gate_proj.weight": lw.w_gate, p + "mlp.up_proj.weight": lw.w_up,
                        p + "mlp.down_proj.weight": lw.w_down})
    assert set(tensors) == set(expected_shapes(cfg))
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, np.float16) for k, v in tensors.items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(
        {**raw_config, "architectures": ["LlamaForCausalLM"], "torch_dtype": "float16"}))
    return folder


def time_hf(folder: Path, batches, prompt_len, steps, vocab, rng, compile_batches,
            compile_timeout_s: float = 240) -> list[dict]:
    """transformers' generate: plain, and static cache + torch.compile where it runs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16).cuda().eval()
    rows = []

    def tpot(b: int) -> float:
        ids = torch.tensor(rng.integers(3, vocab, size=(b, prompt_len)), device="cuda")

        def run(n: int) -> float:
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.no_grad():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                               pad_token_id=0, attention_mask=torch.ones_like(ids))
            torch.cuda.synchronize()
            return time.perf_counter() - start

        run(4)
        n = steps + 1
        return (statistics.median(run(n) for _ in range(3)) - run(1)) / steps

    for batch in batches:
        t = tpot(batch)
        rows.append({"executor": "hf_eager", "batch": batch, "tpot_us": t * 1e6, "tokens_per_s": batch / t})
        print(f"  hf_eager B={batch:4d}  TPOT {t * 1e6:9.1f} us", flush=True)
    if compile_batches is not None:  # in a child process: this path has crashed the process
        rows += time_hf_compiled_in_child(folder, batches=compile_batches, prompt_len=prompt_len,
                                          steps=steps, vocab=vocab, timeout_s=compile_timeout_s)
    else:
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        for batch in batches:
            t = tpot(batch)
            rows.append({"executor": "hf_static_compile", "batch": batch, "tpot_us": t * 1e6,
                         "tokens_per_s": batch / t})
            print(f"  hf_static_compile B={batch:4d}  TPOT {t * 1e6:9.1f} us", flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


def _hf_compiled_child(queue, folder, batches, prompt_len, steps, vocab):
    try:
        rows = time_hf(Path(folder), batches, prompt_len, steps, vocab, np.random.default_rng(1),
                       compile_batches=None)
        queue.put([r for r in rows if r["executor"] == "hf_static_compile"])
    except Exception as err:  # noqa: BLE001 - reported by the parent
        queue.put([{"executor": "hf_static_compile", "error": f"{type(err).__name__}: {err}"[:500]}])


def time_hf_compiled_in_child(folder, batches, prompt_len, steps, vocab, timeout_s=240) -> list[dict]:
    """transformers with a static cache + ``torch.compile`` (CUDA graphs), in a child process:
    on the H200 this path has killed its process outright (docs/design.md §4), which must not take
    the benchmark down with it. Returns its rows, or one row saying how it failed."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_hf_compiled_child,
                        args=(queue, str(folder), batches, prompt_len, steps, vocab))
    child.start()
    try:
        rows = queue.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: the child died or hung
        rows = [{"executor": "hf_static_compile",
                 "error": f"child process gave no result (exit code {child.exitcode})"}]
    child.join(5)
    if child.is_alive():
        child.kill()
    for r in rows:
        if "error" in r:
            print(f"  hf_static_compile failed: {r['error'][:200]}", flush=True)
    return rows


def executor_classes(names: str) -> list:
    """Our executors to time, from ``--executors`` ("eager,graph"): a measurement that only
    needs the graph executor's figures skips the eager one's launch-bound minutes."""
    known = {"eager": EagerExecutor, "graph": GraphExecutor}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(known))
    if unknown or not wanted:
        raise ValueError(f"--executors takes eager and/or graph, got {names!r}")
    return [cls for name, cls in known.items() if name in wanted]


def bench_model(label: str, weights: ModelWeights, hf_folder: Path | None, args, rng) -> dict:
    cfg = weights.config
    batches = [int(b) for b in args.batches.split(",")]
    max_b = max(batches)
    per_seq = -(-(args.prompt_len + args.steps + 8) // 16)
    prefill_blocks = -(-(args.prefill_tokens + 1) // 16)
    engine = EngineConfig(block_size=16, num_kv_blocks=max(max_b * per_seq, prefill_blocks) + 8,
                          max_num_seqs=max_b,
                          max_num_batched_tokens=max(max_b * args.prompt_len, args.prefill_tokens),
                          max_model_len=max(args.prompt_len + args.steps + 64,
                                            args.prefill_tokens + 8))
    print(f"{label}: {cfg.num_parameters() / 1e6:.1f} M parameters, fp16 weights", flush=True)
    rows = []
    for cls in executor_classes(args.executors):
        executor = cls(weights, engine, weight_dtype=np.float16)
        rows += time_executor(executor, batches, args.prompt_len, args.steps, cfg.vocab_size, rng)
        if cls is EagerExecutor:
            rows.append(prefill_breakdown(executor, args.prefill_tokens, cfg.vocab_size, rng))
        if cls is GraphExecutor:
            for r in rows:
                if r["executor"] == "graph":
                    r["gpu_us"] = graph_gpu_time(executor, r["batch"]) * 1e6
            # the best host-driven executor's prefill, beside the peers'
            rows.append(time_prefill(executor, args.prefill_tokens, cfg.vocab_size, rng))
            rows.append({"executor": "graph", "graphs_captured": len(executor.graphs),
                         "capture_seconds": executor.capture_seconds})
        del executor
    decode_batches = [b for b in batches if b <= FUSED_GEMV_MAX_ROWS]
    if decode_batches and GraphExecutor in executor_classes(args.executors):
        # the ladder's previous rung: RoPE and SwiGLU as kernels of their own
        executor = GraphExecutor(weights, engine, weight_dtype=np.float16, fuse_epilogues=False)
        rows += time_executor(executor, decode_batches, args.prompt_len, args.steps,
                              cfg.vocab_size, rng, label="graph_unfused")
        del executor
    if args.peers:
        from .torch_peer import PeerSettings, peer_rows

        settings = PeerSettings(args.prompt_len, args.steps, args.prefill_tokens,
                                args.peer_compile_mode, args.peer_timeout)
        rows += peer_rows(hf_folder or weights, batches, settings, kinds=args.peers.split(","))
    return {"label": label, "params": cfg.num_parameters(), "weight_bytes_fp16": weight_bytes(cfg),
            "vocab_size": cfg.vocab_size, "rows": rows}


def hf_rows(hf_folder: Path, vocab: int, args, rng) -> list[dict]:
    """The ``transformers`` baselines on the same weights (eager, and static cache + compile)."""
    batches = [int(b) for b in args.batches.split(",")]
    return time_hf(hf_folder, batches, args.prompt_len, args.steps, vocab, rng,
                   compile_batches=[1], compile_timeout_s=args.hf_compile_timeout)


def tpot_of(result: dict, executor: str, batch: int) -> float | None:
    for r in result["rows"]:
        if r.get("executor") == executor and r.get("batch") == batch and "tpot_us" in r:
            return r["tpot_us"]
    return None


def ratio(a, b):
    return None if a is None or b is None else a / b


def main(argv=None) -> int:
    parser = bench_parser("decode", __doc__)
    parser.add_argument("--batches", default="1,8,16,32,64,128", help="batch sizes, comma-separated")
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per sequence")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed")
    parser.add_argument("--models", default="bundled,135m",
                        help="bundled (the 7.3M model) and/or 135m (SmolLM2-135M's shape, random)")
    parser.add_argument("--skip-hf", action="store_true", help="no Hugging Face baseline")
    parser.add_argument("--hf-compile-timeout", type=float, default=240,
                        help="seconds for the static-cache + torch.compile child process")
    parser.add_argument("--peers", default="torch_graph,torch_compiled",
                        help="PyTorch peers to run beside our executors ('' for none)")
    parser.add_argument("--peer-timeout", type=float, default=240,
                        help="seconds for each peer measurement's child process (compiles included)")
    parser.add_argument("--peer-compile-mode", default="default",
                        help="torch.compile mode of the compiled peer (one without its own CUDA graphs)")
    parser.add_argument("--prefill-tokens", type=int, default=512,
                        help="prompt length of the prefill timing (batch 1): ours and the peers'")
    parser.add_argument("--executors", default="eager,graph",
                        help="our executors to time: eager (with its per-op breakdown) and/or graph")
    args = parser.parse_args(argv)
    try:
        executor_classes(args.executors)
    except ValueError as err:
        parser.error(str(err))
    rng = np.random.default_rng(0)
    bandwidth = hbm_copy_bandwidth()
    print(f"HBM copy bandwidth: {bandwidth / 1e12:.2f} TB/s", flush=True)
    results, hf_folders = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        # Slowest and least telling last: a run cut by a time limit keeps what it measured
        # (the file is rewritten after every stage, "complete": false until the end).
        if "bundled" in args.models:
            folder = hf_folders["bundled"] = resolve_model_dir()
            results["bundled"] = bench_model("bundled", load_weights(folder), folder, args, rng)
            write_decode_results(results, args, bandwidth, complete=False)
        if "135m" in args.models:
            cfg = ModelConfig.from_dict(SMOLLM2_135M)
            weights = random_weights(cfg, seed=0, scale=0.02)
            weights.final_norm[:] = 1.0
            for lw in weights.layers:
                lw.attn_norm[:] = 1.0
                lw.mlp_norm[:] = 1.0
            folder = hf_folders["135m"] = save_as_hf_folder(weights, SMOLLM2_135M,
                                                            Path(tmp) / "smollm2-135m-random")
            results["135m"] = bench_model("smollm2-135m-shape", weights, folder, args, rng)
            write_decode_results(results, args, bandwidth, complete=False)
        if not args.skip_hf:
            for key, folder in hf_folders.items():
                results[key]["rows"] += hf_rows(folder, results[key]["vocab_size"], args, rng)
                write_decode_results(results, args, bandwidth, complete=False)
    path, summary = write_decode_results(results, args, bandwidth, complete=True)
    print("\nsummary:", json.dumps(summary, indent=1))
    print(f"wrote {path}")
    return 0


def write_decode_results(results: dict, args, bandwidth: float, complete: bool):
    """Summarise what ``results`` holds so far and write ``decode.json``; returns (path, summary)."""
    for r in results.values():
        r["roofline_us"] = r["weight_bytes_fp16"] / bandwidth * 1e6
    if complete:
        table = []
        for key, r in results.items():
            for row in r["rows"]:
                if "tpot_us" in row:
                    table.append({"model": key, **{k: row.get(k) for k in ("executor", "batch", "tpot_us", "tokens_per_s", "host_launch_us", "gpu_us")},
                                  "roofline_frac": r["roofline_us"] / row["tpot_us"] if row["batch"] == 1 else None})
        print()
        print_table(table, ["model", "executor", "batch", "tpot_us", "tokens_per_s", "host_launch_us", "gpu_us", "roofline_frac"])
    small = results.get("bundled") or results.get("135m")
    big = results.get("135m")
    best_hf = lambda r: min(filter(None, [tpot_of(r, "hf_eager", 1), tpot_of(r, "hf_static_compile", 1)]), default=None)  # noqa: E731
    summary = {
        "complete": complete,
        "graph_over_eager_b1": ratio(tpot_of(small, "eager", 1), tpot_of(small, "graph", 1)),
        "graph_over_hf_eager_b1": ratio(tpot_of(small, "hf_eager", 1), tpot_of(small, "graph", 1)),
        "graph_over_hf_eager_b1_135m": ratio(tpot_of(big, "hf_eager", 1), tpot_of(big, "graph", 1)) if big else None,
        "graph_over_hf_best_b1": ratio(best_hf(small), tpot_of(small, "graph", 1)),
        "graph_over_hf_best_b1_135m": ratio(best_hf(big), tpot_of(big, "graph", 1)) if big else None,
        "small_model": small["label"], "hbm_copy_tb_per_s": bandwidth / 1e12,
    }
    from .torch_peer import comparison, peer_status, prefill_comparison

    batches = [int(b) for b in args.batches.split(",")]
    for key, r in results.items():
        summary.update(comparison(key, r["rows"], batches))
        summary.update(prefill_comparison(key, r["rows"], args.prefill_tokens))
        summary.update({f"matmul_tflops_{key}_b{row['batch']}": row["matmul_tflops"]
                        for row in r["rows"] if "matmul_tflops" in row})
    summary["roofline_fraction_135m_b1"] = ratio(big["roofline_us"], summary.get("tpot_us_135m_b1")) if big else None
    summary["roofline_fraction_135m_b1_graph"] = ratio(big["roofline_us"], tpot_of(big, "graph", 1)) if big else None
    summary["peers"] = ({key: peer_status(r["rows"]) for key, r in results.items()} if args.peers
                        else "not run: --peers was empty")
    path = write_results("decode", {**vars(args), "tensor_cores": TENSOR_CORES}, results, summary,
                         args.out)
    return path, summary


if __name__ == "__main__":
    raise SystemExit(main())
