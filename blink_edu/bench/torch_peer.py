"""A strong PyTorch peer for the decode benchmark: a minimal Llama with a static KV cache, replayed
as a CUDA graph, plain and ``torch.compile``d (gpt-fast's recipe).

What it teaches: the bar our kernels are measured against. A decode step of a small model is a few
hundred tiny kernels, so what a framework can do about it is (1) launch them without Python (a
CUDA graph) and (2) launch fewer, fused ones (``torch.compile``'s Inductor). This module does both
to the same weights our executors run, so that ``bench.decode`` can quote "ours over the peer" from
one run.

The model is the NumPy reference's forward (``model/reference.py``, the oracle the tests compare
it with) written in PyTorch, batched the simple way instead of paged:

* every sequence owns one row of a preallocated cache ``(B, K, S, E)`` per layer (``S`` = the
  longest context the run needs), and a token at position ``p`` writes its key and value at ``p``;
* attention reads the whole row through a causal mask (positions ``<= p``), with
  ``scaled_dot_product_attention``'s grouped-query mode (each kv head serves ``H / K`` query heads);
* q/k/v and gate/up are each one fused matrix (one GEMV instead of three or two);
* a step is ``decode_step(tokens (B,), positions (B,)) -> next tokens (B,)``, greedy.

For timing, the step is captured once in a ``torch.cuda.CUDAGraph`` that also feeds its output
back (``tokens <- next``, ``positions += 1``), so one replay is one whole decode step with nothing
on the host but the replay call. ``torch_compiled`` compiles the same step with Inductor first
(``fullgraph=True, dynamic=False``, one compile per batch size, attention through the math backend
so that Inductor generates and fuses it, as gpt-fast does) and captures the compiled step the same
way ("default mode + manual graph"); the compile mode is recorded in every row.

Compiling can take minutes (the 135M shape with ``max-autotune`` did not finish in four) and can
crash a process, so every measurement runs in a child process (``spawn``) with its own timeout;
the Inductor cache directory is shared by the children. The compiles of one model run first all
at once (``warm_cache``: CPU work, and nothing is timed meanwhile), then each measurement, one
after another, finds its kernels in the cache.
Each requested measurement comes back as a row with its figures or with an ``error`` that says why
it did not run — never a missing row.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..model.reference import rope_tables
from ..model.weights import LayerWeights, ModelWeights, load_weights

PEERS = ("torch_graph", "torch_compiled")
NO_CUDAGRAPH_MODES = ("default", "max-autotune-no-cudagraphs")  # we capture the graph ourselves
WARMUP = 3  # untimed calls before capture, and untimed replays after it


def _sdpa_has_gqa() -> bool:
    """Whether this torch's ``scaled_dot_product_attention`` takes ``enable_gqa`` (2.5 and later)."""
    q, kv = torch.ones(1, 2, 1, 2), torch.ones(1, 1, 1, 2)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


SDPA_GQA = _sdpa_has_gqa()


# --- the model ---------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., D) -> x / sqrt(mean(x^2) + eps) * weight, (..., D)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + E/2]) by each token's angle (Llama's "rotate half" convention).
    x (B, T, heads, E), cos/sin (B, T, 1, E/2) -> (B, T, heads, E)."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, heads, E/2) each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: query head h reads kv head h // (H / K).
    q (B, H, T, E), keys/values (B, K, S, E), mask (B, 1, T, S) True where allowed -> (B, H, T, E)."""
    if SDPA_GQA:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    group = q.shape[1] // keys.shape[1]
    return F.scaled_dot_product_attention(q, keys.repeat_interleave(group, dim=1),
                                          values.repeat_interleave(group, dim=1), attn_mask=mask)


def _concat(*arrays: np.ndarray | None) -> np.ndarray | None:
    """Stack matrices (or biases) along their output rows; None when the architecture has none."""
    return None if arrays[0] is None else np.concatenate(arrays)


class TorchLayer(torch.nn.Module):
    """One decoder layer and its slice of the static KV cache, (B, K, S, E) for keys and values."""

    def __init__(self, lw: LayerWeights, heads: int, kv_heads: int, head_dim: int, eps: float,
                 batch: int, max_len: int, to_tensor):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        buffers = {
            "attn_norm": lw.attn_norm,  # (D,)
            "w_qkv": _concat(lw.wq, lw.wk, lw.wv),  # ((H + 2K) * E, D)
            "b_qkv": _concat(lw.bq, lw.bk, lw.bv),  # ((H + 2K) * E,) or None
            "w_o": lw.wo, "b_o": lw.bo,  # (D, H * E), (D,) or None
            "mlp_norm": lw.mlp_norm,  # (D,)
            "w_gate_up": _concat(lw.w_gate, lw.w_up),  # (2F, D)
            "b_gate_up": _concat(lw.b_gate, lw.b_up),  # (2F,) or None
            "w_down": lw.w_down, "b_down": lw.b_down,  # (D, F), (D,) or None
        }
        for name, array in buffers.items():
            self.register_buffer(name, None if array is None else to_tensor(array))
        cache_shape = (batch, kv_heads, max_len, head_dim)  # zeroed: masked slots must not be NaN
        self.register_buffer("k_cache", self.w_o.new_zeros(cache_shape))
        self.register_buffer("v_cache", self.w_o.new_zeros(cache_shape))

    def forward(self, x, cos, sin, rows, positions, mask):
        """x (B, T, D) -> (B, T, D), after writing this layer's keys and values to the cache."""
        x = x + self.attention(rms_norm(x, self.attn_norm, self.eps), cos, sin, rows, positions, mask)
        return x + self.mlp(rms_norm(x, self.mlp_norm, self.eps))

    def attention(self, h, cos, sin, rows, positions, mask):
        """h (B, T, D); rows (B, 1) and positions (B, T) say where each token's K/V goes."""
        B, T, _ = h.shape
        H, K, E = self.heads, self.kv_heads, self.head_dim
        q, k, v = F.linear(h, self.w_qkv, self.b_qkv).split([H * E, K * E, K * E], dim=-1)
        q = apply_rope(q.unflatten(-1, (H, E)), cos, sin)  # (B, T, H, E)
        k = apply_rope(k.unflatten(-1, (K, E)), cos, sin)  # (B, T, K, E)
        self.k_cache[rows, :, positions] = k  # cache (B, K, S, E) at [b, :, positions[b, t]]
        self.v_cache[rows, :, positions] = v.unflatten(-1, (K, E))
        out = attend(q.transpose(1, 2), self.k_cache, self.v_cache, mask)  # (B, H, T, E)
        return F.linear(out.transpose(1, 2).reshape(B, T, H * E), self.w_o, self.b_o)  # (B, T, D)

    def mlp(self, h):
        """SwiGLU: down(silu(gate(h)) * up(h)). (B, T, D) -> (B, T, D)."""
        gate, up = F.linear(h, self.w_gate_up, self.b_gate_up).chunk(2, dim=-1)  # (B, T, F) each
        return F.linear(F.silu(gate) * up, self.w_down, self.b_down)


class TorchLlama(torch.nn.Module):
    """The reference model's forward in PyTorch, for ``batch`` sequences of up to ``max_len``
    tokens each (the static cache is allocated here, zeroed)."""

    def __init__(self, weights: ModelWeights, batch: int, max_len: int,
                 dtype: torch.dtype = torch.float16, device: str = "cuda"):
        super().__init__()
        cfg = weights.config
        self.eps = cfg.rms_norm_eps

        def to_tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

        self.register_buffer("embed", to_tensor(weights.embed))  # (V, D)
        self.layers = torch.nn.ModuleList(
            TorchLayer(lw, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps,
                       batch, max_len, to_tensor) for lw in weights.layers)
        self.register_buffer("final_norm", to_tensor(weights.final_norm))  # (D,)
        tied = weights.lm_head is weights.embed
        self.register_buffer("lm_head", self.embed if tied else to_tensor(weights.lm_head))  # (V, D)
        cos, sin = rope_tables(cfg, np.arange(max_len))  # (S, E/2) each, the reference's tables
        self.register_buffer("cos", to_tensor(cos))
        self.register_buffer("sin", to_tensor(sin))
        self.register_buffer("key_positions", torch.arange(max_len, device=device))  # (S,)

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions (B, T) -> the last layer's output (B, T, D)."""
        x = F.embedding(tokens, self.embed)  # (B, T, D)
        cos, sin = self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)  # (B, T, 1, E/2)
        rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]  # (B, 1)
        mask = (self.key_positions <= positions[..., None]).unsqueeze(1)  # (B, 1, T, S) causal
        for layer in self.layers:
            x = layer(x, cos, sin, rows, positions, mask)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> logits (..., V)."""
        return F.linear(rms_norm(x, self.final_norm, self.eps), self.lm_head)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions (B, T) -> logits (B, T, V); writes the tokens' K/V to the cache."""
        return self.logits(self.hidden(tokens, positions))

    def greedy(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions (B, T) -> each row's next token after its last one (B,), greedy
        (the first maximum on ties, as the reference)."""
        return self.logits(self.hidden(tokens, positions)[:, -1]).argmax(dim=-1)

    def prefill(self, prompts: torch.Tensor) -> torch.Tensor:
        """prompts (B, P), all starting at position 0 -> the first generated tokens (B,)."""
        positions = torch.arange(prompts.shape[1], device=prompts.device).expand_as(prompts)
        return self.greedy(prompts, positions)

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decode step: tokens, positions (B,) -> next tokens (B,)."""
        return self.greedy(tokens[:, None], positions[:, None])


# --- CUDA graphs and torch.compile ------------------------------------------------------------
class CapturedCall:
    """``fn(*inputs)`` captured in a CUDA graph: ``replay()`` runs it again on whatever the static
    ``inputs`` hold then, and leaves its result in ``output``. The warm-up calls run first on a
    side stream, as the PyTorch docs ask (they also trigger any compilation)."""

    def __init__(self, fn, *inputs: torch.Tensor, warmup: int = WARMUP):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = fn(*inputs)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


def feeding_back(step):
    """A decode loop's body: run ``step`` and make its output the next call's input
    (tokens <- next tokens, positions += 1, in place), so a replay needs nothing from the host."""

    def advance(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        tokens.copy_(step(tokens, positions))
        positions.add_(1)
        return tokens

    return advance


def compiled(fn, mode: str, math_attention: bool):
    """``torch.compile(fn)`` with static shapes and no CUDA graphs of its own (we capture one);
    ``math_attention``: trace attention through SDPA's math backend so that Inductor generates
    and fuses it (gpt-fast does so for decode)."""
    if mode not in NO_CUDAGRAPH_MODES:
        raise ValueError(f"compile mode {mode!r}: use one of {NO_CUDAGRAPH_MODES} (the peer captures "
                         "its own CUDA graph around the compiled step)")
    fn = torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)
    if not math_attention:
        return fn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def with_math_attention(*args):
        with sdpa_kernel(SDPBackend.MATH):
            return fn(*args)

    return with_math_attention


def describe_mode(kind: str, compile_mode: str) -> str:
    if kind == "torch_graph":
        return "eager ops in a torch.cuda.CUDAGraph"
    return f"torch.compile(mode={compile_mode!r}, fullgraph=True, dynamic=False) in a torch.cuda.CUDAGraph"


# --- measurements (run in a child process) ----------------------------------------------------
@dataclass(frozen=True)
class PeerSettings:
    """What the peer measures, shared by every child. ``timeout_s`` bounds each measurement,
    the child's start-up included."""

    prompt_len: int = 16
    steps: int = 32
    prefill_tokens: int = 512
    compile_mode: str = "default"
    timeout_s: float = 240.0
    cache_dir: str | None = None  # TORCHINDUCTOR_CACHE_DIR shared by the children
    warm_in_parallel: bool = True  # compile every torch_compiled item at once first (warm_cache)


def cache_length(prompt_len: int, steps: int) -> int:
    """Positions a timed decode run writes: the prompt, the warm-up calls and replays, the steps."""
    return prompt_len + 2 * WARMUP + steps


def random_prompts(batch: int, length: int, vocab: int, seed: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator).to(device)  # (B, P)


def time_replays(call: CapturedCall, n: int) -> tuple[list[float], list[float]]:
    """Seconds per replay: on the host around replay + synchronize, and on the GPU (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host, gpu = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        began = time.perf_counter()
        start.record()
        call.replay()
        end.record()
        end.synchronize()
        host.append(time.perf_counter() - began)
        gpu.append(start.elapsed_time(end) / 1e3)
    return host, gpu


def time_decode(weights: ModelWeights, kind: str, batch: int, settings: PeerSettings) -> dict:
    """TPOT of ``batch`` greedy sequences after a ``prompt_len``-token prefill: median of
    ``steps`` replays of the captured step (host time around replay + synchronize)."""
    P, steps, mode = settings.prompt_len, settings.steps, settings.compile_mode
    model = TorchLlama(weights, batch, cache_length(P, steps))
    with torch.no_grad():
        tokens = model.prefill(random_prompts(batch, P, weights.config.vocab_size, batch, "cuda"))
        positions = torch.full((batch,), P, dtype=torch.long, device="cuda")  # (B,)
        began = time.perf_counter()
        step = model.decode_step if kind == "torch_graph" else compiled(model.decode_step, mode, True)
        call = CapturedCall(feeding_back(step), tokens, positions)
        setup_s = time.perf_counter() - began
        for _ in range(WARMUP):
            call.replay()
        host, gpu = time_replays(call, steps)
    tpot = statistics.median(host)
    return {"executor": kind, "batch": batch, "tpot_us": tpot * 1e6, "tokens_per_s": batch / tpot,
            "gpu_us": statistics.median(gpu) * 1e6, "mode": describe_mode(kind, mode),
            "setup_s": setup_s, "sdpa_enable_gqa": SDPA_GQA, "prompt_len": P,
            "step_times_us": [t * 1e6 for t in host]}


def time_prefill(weights: ModelWeights, kind: str, settings: PeerSettings) -> dict:
    """One ``prefill_tokens``-token prompt, batch 1, captured: median of ``steps`` replays."""
    P, mode = settings.prefill_tokens, settings.compile_mode
    model = TorchLlama(weights, 1, P)
    prompt = random_prompts(1, P, weights.config.vocab_size, P, "cuda")  # (1, P)
    positions = torch.arange(P, device="cuda")[None]  # (1, P)
    with torch.no_grad():
        began = time.perf_counter()
        fn = model.greedy if kind == "torch_graph" else compiled(model.greedy, mode, False)
        call = CapturedCall(fn, prompt, positions)
        setup_s = time.perf_counter() - began
        host, gpu = time_replays(call, settings.steps)
    return {"executor": kind, "prefill_tokens": P, "prefill_ms": statistics.median(host) * 1e3,
            "gpu_ms": statistics.median(gpu) * 1e3, "mode": describe_mode(kind, mode),
            "setup_s": setup_s}


def measure(weights: ModelWeights, item: dict, settings: PeerSettings) -> dict:
    """One item: {"task": "decode", "executor", "batch"} or {"task": "prefill", "executor"}
    (with "cache_warmed" when ``warm_cache`` compiled it beforehand: then ``setup_s`` is the
    compile from a warm cache, carried into the row)."""
    if item["executor"] not in PEERS:
        raise ValueError(f"unknown peer {item['executor']!r}; peers: {', '.join(PEERS)}")
    if item["task"] == "decode":
        row = time_decode(weights, item["executor"], item["batch"], settings)
    else:
        row = time_prefill(weights, item["executor"], settings)
    return {**row, **({"cache_warmed": item["cache_warmed"]} if "cache_warmed" in item else {})}


def _child_main(sender, source, items: list[dict], settings: PeerSettings) -> None:
    """In the child: measure each item in turn and send its row (or its error) at once."""
    if settings.cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = settings.cache_dir  # read when Inductor first caches
    weights = None
    for item in items:
        try:
            if weights is None:
                weights = (load_weights(source, dtype=np.float16) if isinstance(source, str)
                           else source)
            row = measure(weights, item, settings)
        except Exception as err:  # noqa: BLE001 - reported in the row, the next item still runs
            row = {**item, "error": f"{type(err).__name__}: {err}"[:500],
                   "traceback": traceback.format_exc()[-2000:]}
        sender.send(row)
    sender.close()


def _next_row(receiver, child, item: dict, deadline: float, timeout_s: float) -> tuple[dict, str | None]:
    """The child's row for ``item`` if it comes before ``deadline`` (``time.monotonic()``);
    otherwise an error row, and why the child can give no more."""
    if receiver.poll(max(0.0, deadline - time.monotonic())):
        try:
            return receiver.recv(), None
        except EOFError:
            child.join(5)
            why = f"the child process ended (exit code {child.exitcode}) without a result"
    else:
        why = f"timed out after {timeout_s:g} s (child start-up included)"
    return {**item, "error": why}, why


def run_in_child(source: str | Path | ModelWeights, items: list[dict], settings: PeerSettings) -> list[dict]:
    """Measure ``items`` one after another in one spawned child; one row per item, always."""
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    source = str(source) if isinstance(source, Path) else source
    # not a daemon: Inductor's compile workers are the child's own children
    child = ctx.Process(target=_child_main, args=(sender, source, items, settings))
    began = time.monotonic()
    child.start()  # (sends the arguments: with weights rather than a folder this takes a while)
    sender.close()  # the child holds the only writing end: its exit reads as EOF here
    rows, stopped = [], None
    try:
        for item in items:
            if stopped:
                rows.append({**item, "error": f"not run: the child stopped at an earlier item ({stopped})"})
                continue
            row, stopped = _next_row(receiver, child, item, began + settings.timeout_s,
                                     settings.timeout_s)
            rows.append(row)
            began = time.monotonic()
    finally:
        if child.is_alive():
            child.kill()
        child.join()
    return rows


def warm_cache(source: str | Path | ModelWeights, items: list[dict], settings: PeerSettings) -> list[bool]:
    """Run every item at once, each in its own child, and throw the figures away: what is kept is
    the shared Inductor cache, so that the timed runs that follow, one at a time, find their
    kernels compiled. A compile is mostly CPU work, one core a kernel at a time; done one batch
    after another the 135M shape's four compiles took ~5 of the 10 minutes a benchmark call may
    run (decode_h200_f2829c2.log), in parallel they take about the longest one. Nothing is timed
    meanwhile. Returns, per item, whether its warm-up finished."""
    from concurrent.futures import ThreadPoolExecutor

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        rows = list(pool.map(lambda item: run_in_child(source, [item], settings)[0], items))
    ok = ["error" not in row for row in rows]
    print(f"  torch_compiled: {sum(ok)} of {len(items)} compiles warmed in parallel in "
          f"{time.monotonic() - began:.0f} s", flush=True)
    return ok


def peer_rows(source: str | Path | ModelWeights, batches: list[int], settings: PeerSettings,
              kinds=PEERS) -> list[dict]:
    """Every peer row for one model (a checkpoint folder, or weights): decode TPOT for each batch
    and one prefill, per kind. The plain graph runs in one child; each compiled measurement in its
    own (a compile is what may hang), and once one of those fails for lack of time the later
    compiled ones are not attempted — their rows say so. Without ``settings.cache_dir`` the
    children share a temporary Inductor cache for the length of this call."""
    unknown = [k for k in kinds if k not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; peers: {', '.join(PEERS)}")
    if settings.cache_dir is None:
        with tempfile.TemporaryDirectory(prefix="torch_peer_inductor_") as cache_dir:
            return peer_rows(source, batches, replace(settings, cache_dir=cache_dir), kinds)
    rows = []
    for kind in kinds:
        items = [{"task": "decode", "executor": kind, "batch": b} for b in batches]
        items.append({"task": "prefill", "executor": kind, "prefill_tokens": settings.prefill_tokens})
        if kind == "torch_compiled" and settings.warm_in_parallel:
            warmed = warm_cache(source, items, settings)
            items = [{**item, "cache_warmed": ok} for item, ok in zip(items, warmed)]
        groups = [items] if kind == "torch_graph" else [[item] for item in items]
        gave_up = None
        for group in groups:
            if gave_up:
                rows += [{**item, "error": f"not run: {gave_up}"} for item in group]
                continue
            got = run_in_child(source, group, settings)
            for row in got:
                _print_row(row)
            rows += got
            if any("timed out" in r.get("error", "") for r in got):
                gave_up = f"an earlier {kind} measurement timed out after {settings.timeout_s:g} s"
    return rows


def _what(row: dict) -> str:
    return f"batch {row['batch']}" if "batch" in row else f"prefill {row['prefill_tokens']}"


def _print_row(row: dict) -> None:
    what = _what(row)
    if "error" in row:
        print(f"  {row['executor']} {what}  failed: {row['error'][:200]}", flush=True)
    elif "batch" in row:
        print(f"  {row['executor']} {what}  TPOT {row['tpot_us']:9.1f} us  "
              f"{row['tokens_per_s']:9.0f} tok/s  (setup {row['setup_s']:.0f} s)", flush=True)
    else:
        print(f"  {row['executor']} {what}  {row['prefill_ms']:.3f} ms", flush=True)


# --- comparing with our executors --------------------------------------------------------------
def is_ours(executor: str) -> bool:
    """Our executors are every row that is not a peer's (torch_*) or transformers' (hf_*)."""
    return not executor.startswith(("torch_", "hf_"))


def _tpot(rows: list[dict], batch: int, which) -> float | None:
    times = [r["tpot_us"] for r in rows if r.get("batch") == batch and "tpot_us" in r
             and "executor" in r and which(r["executor"])]
    return min(times, default=None)


def comparison(model_key: str, rows: list[dict], batches: list[int]) -> dict:
    """Summary keys for one model: ``tpot_us_{M}_b{B}`` (our best executor) and
    ``ours_over_{peer}_{M}_b{B}`` (tokens/s of our best over the peer's: > 1 means we are faster),
    None where either side has no figure."""
    summary = {}
    for b in batches:
        ours = _tpot(rows, b, is_ours)
        summary[f"tpot_us_{model_key}_b{b}"] = ours
        for peer in PEERS:
            theirs = _tpot(rows, b, lambda e, peer=peer: e == peer)
            summary[f"ours_over_{peer}_{model_key}_b{b}"] = (
                None if ours is None or theirs is None else theirs / ours)
    return summary


def prefill_comparison(model_key: str, rows: list[dict], prefill_tokens: int) -> dict:
    """Summary keys for one model's ``prefill_tokens``-token prompt (batch 1):
    ``prefill_ms_{M}_{P}`` (our best executor) and ``ours_over_{peer}_prefill_{M}_{P}`` (the
    peer's time over ours: > 1 means we are faster), None where either side has no figure."""
    def best(which):
        times = [r["prefill_ms"] for r in rows if r.get("prefill_tokens") == prefill_tokens
                 and "prefill_ms" in r and which(r["executor"])]
        return min(times, default=None)

    ours = best(is_ours)
    summary = {f"prefill_ms_{model_key}_{prefill_tokens}": ours}
    for peer in PEERS:
        theirs = best(lambda e, peer=peer: e == peer)
        summary[f"ours_over_{peer}_prefill_{model_key}_{prefill_tokens}"] = (
            None if ours is None or theirs is None else theirs / ours)
    return summary


def peer_status(rows: list[dict]) -> dict[str, str]:
    """For each peer: "ran" or which of its measurements failed and why."""
    status = {}
    for peer in PEERS:
        mine = [r for r in rows if r.get("executor") == peer]
        if not mine:
            status[peer] = "not requested"
            continue
        failed = [f"{_what(r)}: {r['error']}" for r in mine if "error" in r]
        if not failed:
            status[peer] = "ran"
        else:
            verdict = "did not run" if len(failed) == len(mine) else "ran in part, failed"
            status[peer] = f"{verdict}: " + "; ".join(failed)
    return status
