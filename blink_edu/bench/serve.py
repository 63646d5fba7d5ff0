"""``python -m blink_edu.bench.serve``: load-test the OpenAI server the way vLLM's
``benchmark_serving.py`` does — TTFT, TPOT, ITL, E2E, throughput and goodput at several rates.

docs/design.md §7 and §9 (one seeded workload replayed at every rate; every raw figure in
``serve.json`` in the results folder, ``--out``), Blink §5's serving metrics, and vLLM's metric definitions:

    TTFT   request sent -> first streamed token                    (per request)
    TPOT   (E2E - TTFT) / (output tokens - 1): decode time per token, the first token excluded
    ITL    every gap between two streamed chunks (a list per request; a chunk may carry several
           tokens when the frontend's poll finds more than one in the ring)
    E2E    request sent -> the end of the stream
    throughput   completed requests / duration; output tokens / duration
    goodput      requests / duration that met *both* SLOs: TTFT <= --goodput-ttft-ms and
                 TPOT <= --goodput-tpot-ms

Each figure is reported as mean, median and P99 (NumPy's linear-interpolation percentile, as vLLM).
Requests go to ``/v1/completions`` with ``stream: true``, ``ignore_eos: true`` (exact output
lengths) and ``stream_options.include_usage``; the usage chunk's ``prompt_tokens`` and
``completion_tokens`` are checked against the workload for every request.

    python -m blink_edu.bench.serve --start-server --single-stream --request-rates 1,2,4,inf
    python -m blink_edu.bench.serve --base-url http://127.0.0.1:8000 --input-len 64 --output-len 64

``--single-stream`` also measures one request at a time (64-token prompt): TTFT, and decode
tokens/s = 1 / TPOT — the CPU acceptance numbers. Plots ``serve_latency.png`` and
``serve_throughput.png`` are written next to the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import latency
from ..sim.workload import arrival_times, fixed_lengths, lognormal_lengths
from .prompts import PromptBuilder, WorkItem
from .cli import bench_parser
from .results import print_table, results_dir, write_results

# httpx (the [dev] extra) is imported where a request is sent, not here: --help and the metric
# definitions work on the base install.

MODEL_CONTEXT = 512  # blink-edu-7m; /v1/models tells the truth when a server is up

# --- metrics (vLLM's definitions) ------------------------------------------------------------


@dataclass
class RequestResult:
    """What one streamed request measured. Times in seconds; ``sent`` from the run's start."""
    index: int
    prompt_len: int
    output_len: int  # asked for
    sent: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)  # gaps between successive chunks
    chunks: int = 0  # chunks that carried text
    prompt_tokens: int | None = None  # the server's usage
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None and self.e2e is not None

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.chunks

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["tpot"] = tpot(self)
        return d


def tpot(r: RequestResult) -> float | None:
    """Time per output token after the first: (E2E - TTFT) / (n - 1) (``latency.tpot``);
    None for n < 2."""
    if not r.ok:
        return None
    return latency.tpot(r.ttft, r.e2e, r.output_tokens)


def meets_slo(r: RequestResult, ttft_slo_s: float, tpot_slo_s: float) -> bool:
    """Both SLOs (``latency``): a one-token answer has no TPOT and meets that one trivially."""
    return (r.ok and latency.meets_ttft(r.ttft, ttft_slo_s)
            and latency.meets_tpot(tpot(r), True, tpot_slo_s))


def summarize(results: list[RequestResult], duration_s: float, ttft_slo_s: float,
              tpot_slo_s: float) -> dict:
    done = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_len for r in done)
    good = sum(meets_slo(r, ttft_slo_s, tpot_slo_s) for r in done)
    duration_s = max(duration_s, 1e-9)
    summary = {
        "completed": len(done), "failed": len(results) - len(done), "duration_s": duration_s,
        "request_throughput": len(done) / duration_s,
        "output_token_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "goodput": good / duration_s, "slo_attained": good / len(results) if results else None,
        "prompt_len_mismatches": sum(r.prompt_tokens != r.prompt_len for r in done),
        "output_len_mismatches": sum(r.completion_tokens != r.output_len for r in done),
    }
    for name, values in (("ttft", [r.ttft for r in done]),
                         ("tpot", [t for t in map(tpot, done) if t is not None]),
                         ("itl", [g for r in done for g in r.itl]),
                         ("e2e", [r.e2e for r in done])):
        for k, v in latency.stats_ms(values).items():
            summary[f"{k}_{name}_ms"] = v
    return summary


# --- one streamed request ----------------------------------------------------------------------


async def stream_request(client, base_url: str, item: WorkItem, t0: float,
                         model: str | None, temperature: float, headers: dict,
                         timeout_s: float) -> RequestResult:
    """POST one streaming completion on ``client`` (an ``httpx.AsyncClient``) and time its
    chunks (perf_counter, from ``t0``)."""
    import httpx

    r = RequestResult(item.index, item.prompt_len, item.output_len)
    body = {"prompt": item.prompt, "max_tokens": item.output_len, "stream": True,
            "ignore_eos": True, "temperature": temperature,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    start = time.perf_counter()
    r.sent = start - t0
    last = None
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", f"{base_url}/v1/completions", json=body,
                                     headers=headers) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    r.error = f"HTTP {resp.status_code}: {text[:300]}"
                    return r
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    now = time.perf_counter()
                    if data == "[DONE]":
                        r.e2e = now - start
                        break
                    event = json.loads(data)
                    if "error" in event:
                        r.error = f"stream error: {event['error'].get('message')}"
                        return r
                    if event.get("usage"):
                        r.prompt_tokens = event["usage"]["prompt_tokens"]
                        r.completion_tokens = event["usage"]["completion_tokens"]
                    for choice in event.get("choices") or []:
                        if choice.get("finish_reason"):
                            r.finish_reason = choice["finish_reason"]
                        if choice.get("text"):
                            r.chunks += 1
                            if r.ttft is None:
                                r.ttft = now - start
                            else:
                                r.itl.append(now - last)
                            last = now
        if r.e2e is None and r.error is None:
            r.error = "stream ended without [DONE]"
    except (httpx.HTTPError, TimeoutError, json.JSONDecodeError) as err:
        r.error = f"{type(err).__name__}: {str(err)[:300]}"
    return r


async def run_rate(base_url: str, items: list[WorkItem], times: list[float], *, model, temperature,
                   headers, timeout_s: float, max_concurrency: int | None, label: str
                   ) -> tuple[list[RequestResult], float]:
    """Send ``items[i]`` at ``times[i]`` seconds from now; (results, duration in seconds)."""
    import httpx
    from tqdm import tqdm

    limits = httpx.Limits(max_connections=max(len(items), 1) + 4, max_keepalive_connections=32)
    gate = asyncio.Semaphore(max_concurrency or len(items) or 1)
    bar = tqdm(total=len(items), desc=label, unit="req", leave=False)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s)) as client:
        t0 = time.perf_counter()

        async def one(item: WorkItem, at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            async with gate:
                result = await stream_request(client, base_url, item, t0, model, temperature,
                                              headers, timeout_s)
            bar.update(1)
            return result

        results = await asyncio.gather(*(one(i, t) for i, t in zip(items, times)))
        duration = time.perf_counter() - t0
    bar.close()
    return list(results), duration


# --- the server: target one, or start one ----------------------------------------------------


def wait_idle(base_url: str, timeout_s: float = 30.0) -> dict | None:
    """Wait (bounded) until every ring slot is EMPTY and no KV block is used; /health's body."""
    from ..serve.subprocess_server import ServerProcess

    return ServerProcess(None, base_url, None).wait_idle(timeout_s)


def server_histograms(base_url: str) -> dict:
    """The server's own TTFT / ITL / E2E histogram sums and counts from /metrics."""
    import httpx

    try:
        text = httpx.get(f"{base_url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    out = {}
    pattern = re.compile(r"^blink_edu:(time_to_first_token|inter_token_latency|"
                         r"e2e_request_latency)_seconds_(sum|count)(?:\{[^}]*\})?\s+(\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            out[f"{m.group(1)}_{m.group(2)}"] = float(m.group(3))
    return out


def server_means_ms(before: dict, after: dict) -> dict:
    """Mean TTFT / ITL / E2E over one rate as the server's frontend measured them (ms)."""
    means = {}
    for name, key in (("ttft", "time_to_first_token"), ("itl", "inter_token_latency"),
                      ("e2e", "e2e_request_latency")):
        n = after.get(f"{key}_count", 0) - before.get(f"{key}_count", 0)
        s = after.get(f"{key}_sum", 0) - before.get(f"{key}_sum", 0)
        means[f"server_mean_{name}_ms"] = s / n * 1e3 if n > 0 else None
    return means


# --- the benchmark ---------------------------------------------------------------------------


def parse_rates(text: str) -> list[float]:
    if text.strip().lower() in ("", "none"):
        return []
    return [math.inf if r.strip().lower() == "inf" else float(r) for r in text.split(",")]


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def make_workload(args, tokenizer, max_model_len: int) -> list[WorkItem]:
    rng = np.random.default_rng(args.seed)
    if args.input_len is not None or args.output_len is not None:
        lengths = fixed_lengths(args.num_prompts, args.input_len or 64, args.output_len or 64,
                                max_model_len)
    else:
        lengths = lognormal_lengths(rng, args.num_prompts, input_mean=args.input_mean,
                                    input_sigma=args.input_sigma, output_mean=args.output_mean,
                                    output_sigma=args.output_sigma, max_model_len=max_model_len)
    return PromptBuilder(tokenizer).build(lengths, rng)


def single_stream(base_url: str, builder: PromptBuilder, args, headers) -> dict:
    """One request at a time: ``--single-stream-requests`` x (64-token prompt, N output tokens)."""
    rng = np.random.default_rng([args.seed, 999])
    items = [WorkItem(i, builder.prompt(args.single_stream_input, int(off)),
                      args.single_stream_input, args.single_stream_output)
             for i, off in enumerate(rng.integers(0, len(builder.ids) // 2,
                                                  size=args.single_stream_requests))]
    # max_concurrency=1: each request is sent (and timed) when the one before it has ended.
    results, _ = asyncio.run(run_rate(base_url, items, [0.0] * len(items), model=args.model,
                                      temperature=args.temperature, headers=headers,
                                      timeout_s=args.request_timeout, max_concurrency=1,
                                      label="single-stream"))
    done = [r for r in results if r.ok]
    tpots = [t for t in map(tpot, done) if t is not None]
    summary = summarize(results, sum(r.e2e for r in done) if done else 0.0,
                        args.goodput_ttft_ms / 1e3, args.goodput_tpot_ms / 1e3)
    summary.update({
        "prompt_len": args.single_stream_input, "output_len": args.single_stream_output,
        "decode_tokens_per_s": 1.0 / float(np.median(tpots)) if tpots else None,
        "e2e_tokens_per_s": (float(np.median([r.output_tokens / r.e2e for r in done]))
                             if done else None),
    })
    summary["meets_acceptance"] = bool(
        summary["decode_tokens_per_s"] and summary["median_ttft_ms"] is not None
        and summary["decode_tokens_per_s"] >= args.accept_tokens_per_s
        and summary["median_ttft_ms"] <= args.accept_ttft_ms)
    return {"summary": summary, "requests": [r.as_dict() for r in results]}


def benchmark(base_url: str, args, server_log: Path | None) -> dict:
    import httpx

    from ..model.bundled import resolve_model_dir
    from ..model.tokenizer import Tokenizer

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    tokenizer = Tokenizer.from_folder(resolve_model_dir(args.tokenizer))
    models = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=10).json()
    card = models["data"][0]
    max_model_len = int(card.get("max_model_len") or MODEL_CONTEXT)
    print(f"server {base_url}: model {card['id']!r}, context {max_model_len}", flush=True)
    builder = PromptBuilder(tokenizer)
    items = make_workload(args, tokenizer, max_model_len)

    # Warm-up (not measured): the first requests pay for lazy imports and JIT compilation.
    for i in range(args.warmup):
        asyncio.run(run_rate(base_url, [WorkItem(-1 - i, builder.prompt(16, 7 * i), 16, 8)], [0.0],
                             model=args.model, temperature=args.temperature, headers=headers,
                             timeout_s=args.request_timeout, max_concurrency=1, label="warm-up"))
    wait_idle(base_url)

    raw = {"workload": [{"index": w.index, "prompt_len": w.prompt_len,
                         "output_len": w.output_len} for w in items],
           "server_url": base_url, "rates": {}}
    summary = {"rates": {}}
    if args.single_stream:
        ss = single_stream(base_url, builder, args, headers)
        raw["single_stream"] = ss["requests"]
        summary["single_stream"] = ss["summary"]
        s = ss["summary"]
        print(f"single stream: TTFT median {s['median_ttft_ms']:.1f} ms, decode "
              f"{s['decode_tokens_per_s']:.1f} tokens/s", flush=True)
        wait_idle(base_url)

    for k, rate in enumerate(parse_rates(args.request_rates)):
        label = rate_label(rate)
        times = arrival_times(np.random.default_rng([args.seed, k + 1]), len(items), rate,
                              args.burstiness)
        before = server_histograms(base_url)
        results, duration = asyncio.run(asyncio.wait_for(
            run_rate(base_url, items, times, model=args.model, temperature=args.temperature,
                     headers=headers, timeout_s=args.request_timeout,
                     max_concurrency=args.max_concurrency, label=f"rate {label}"),
            timeout=args.rate_timeout))
        after = server_histograms(base_url)
        s = summarize(results, duration, args.goodput_ttft_ms / 1e3, args.goodput_tpot_ms / 1e3)
        s.update(server_means_ms(before, after))
        summary["rates"][label] = s
        raw["rates"][label] = {"arrival_times": times, "duration_s": duration,
                               "requests": [r.as_dict() for r in results]}
        print(f"rate {label}: {s['completed']}/{len(results)} done in {duration:.1f} s, "
              f"{s['output_token_throughput']:.1f} tok/s, TTFT median {fmt(s['median_ttft_ms'])} "
              f"ms, TPOT median {fmt(s['median_tpot_ms'])} ms", flush=True)
        for r in results:
            if r.error:
                print(f"  request {r.index}: {r.error}", flush=True)
        wait_idle(base_url)
    if server_log is not None and server_log.exists():
        raw["server_log"] = server_log.read_text()[-4000:]
        engine = re.search(r"engine: (executor=\S+, backend=\S+)", raw["server_log"])
        summary["engine"] = engine.group(1) if engine else None
    return {"raw": raw, "summary": summary}


def fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def plot(summary: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(summary["rates"])
    if not rates:
        return []
    x = np.arange(len(rates))
    rows = [summary["rates"][r] for r in rates]
    nan = lambda v: float("nan") if v is None else v  # noqa: E731
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, slo in ((axes[0], "ttft", "goodput_ttft_ms"), (axes[1], "tpot", "goodput_tpot_ms")):
        for stat, style in (("mean", "o-"), ("median", "s--"), ("p99", "^:")):
            ax.plot(x, [nan(r[f"{stat}_{metric}_ms"]) for r in rows], style, label=stat)
        if summary.get(slo):
            ax.axhline(summary[slo], color="grey", lw=0.8, label="SLO")
        ax.set_xticks(x, rates)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_title(metric.upper())
        ax.legend()
    fig.suptitle(f"blink_edu serve latency ({summary.get('engine') or 'server'})")
    fig.tight_layout()
    paths.append(out_dir / "serve_latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["output_token_throughput"] for r in rows], "o-", label="output tokens/s")
    ax.set_xticks(x, rates)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(x, [r["request_throughput"] for r in rows], "s--", color="C1", label="requests/s")
    ax2.plot(x, [r["goodput"] for r in rows], "^:", color="C2", label="goodput (req/s)")
    ax2.set_ylabel("requests/s")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [l.get_label() for l in lines], loc="upper left")
    ax.set_title("blink_edu serve throughput")
    fig.tight_layout()
    paths.append(out_dir / "serve_throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def parse_args(argv=None) -> argparse.Namespace:
    p = bench_parser("serve", __doc__)
    target = p.add_argument_group("the server")
    target.add_argument("--base-url", default=None, help="an existing server, e.g. http://127.0.0.1:8000")
    target.add_argument("--start-server", action="store_true",
                        help="start python -m blink_edu.serve on a free port (stopped at the end)")
    target.add_argument("--executor", default=None, help="passed to the started server")
    target.add_argument("--max-num-seqs", type=int, default=None, help="passed to the started server")
    target.add_argument("--kv-blocks", type=int, default=None, help="passed to the started server")
    target.add_argument("--ring-slots", type=int, default=None, help="passed to the started server")
    target.add_argument("--max-queue", type=int, default=None, help="passed to the started server")
    target.add_argument("--api-key", default=None, help="sent as a Bearer token")
    target.add_argument("--model", default=None, help="`model` sent in each request (default: none)")
    target.add_argument("--tokenizer", default=None, help="model folder (default: the bundled one)")
    load = p.add_argument_group("the load")
    load.add_argument("--num-prompts", type=int, default=24, help="requests per rate")
    load.add_argument("--request-rates", default="1,2,4,inf",
                      help="comma-separated requests/s; 'inf' = all at once; 'none' = skip")
    load.add_argument("--burstiness", type=float, default=1.0,
                      help="Gamma shape of the gaps: 1 = Poisson, < 1 burstier")
    load.add_argument("--max-concurrency", type=int, default=None,
                      help="requests in flight at most (default: no limit)")
    load.add_argument("--seed", type=int, default=0, help="the workload's seed")
    load.add_argument("--input-len", type=int, default=None, help="fixed prompt length (tokens)")
    load.add_argument("--output-len", type=int, default=None, help="fixed output length (tokens)")
    load.add_argument("--input-mean", type=float, default=128.0, help="log-normal prompt mean")
    load.add_argument("--input-sigma", type=float, default=0.7, help="log-normal prompt sigma")
    load.add_argument("--output-mean", type=float, default=64.0, help="log-normal output mean")
    load.add_argument("--output-sigma", type=float, default=0.7, help="log-normal output sigma")
    load.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    load.add_argument("--warmup", type=int, default=2, help="unmeasured requests first")
    load.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    load.add_argument("--rate-timeout", type=float, default=900.0, help="seconds per rate at most")
    slo = p.add_argument_group("SLOs and single-stream")
    slo.add_argument("--goodput-ttft-ms", type=float, default=300.0, help="goodput's TTFT SLO")
    slo.add_argument("--goodput-tpot-ms", type=float, default=50.0, help="goodput's TPOT SLO")
    slo.add_argument("--single-stream", action="store_true",
                     help="also time requests one at a time (TTFT, decode tokens/s)")
    slo.add_argument("--single-stream-requests", type=int, default=5,
                     help="requests of the single-stream run")
    slo.add_argument("--single-stream-input", type=int, default=64,
                     help="its prompt tokens")
    slo.add_argument("--single-stream-output", type=int, default=128,
                     help="its output tokens")
    slo.add_argument("--accept-tokens-per-s", type=float, default=30.0,
                     help="single stream: the decode speed that passes")
    slo.add_argument("--accept-ttft-ms", type=float, default=300.0,
                     help="single stream: the median TTFT that passes")
    p.add_argument("--name", default="serve", help="results file name")
    p.add_argument("--no-plots", action="store_true", help="no PNG figures")
    p.add_argument("--machine-label", default=None, help="default: the backend's device, or 'cpu, N cores'")
    args = p.parse_args(argv)
    if bool(args.base_url) == bool(args.start_server):
        p.error("give exactly one of --base-url and --start-server")
    return args


def server_flags(args) -> list[str]:
    flags = []
    for name in ("executor", "max_num_seqs", "kv_blocks", "ring_slots", "max_queue", "api_key"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


def machine_label() -> str:
    """"cpu, 2 cores (sim backend)" or "NVIDIA H200 (gpu backend)": where these numbers come from."""
    from ..backend import get_backend

    backend = get_backend()
    where = backend.device_name if backend.name == "gpu" else f"cpu, {os.cpu_count()} cores"
    return f"{where} ({backend.name} backend)"


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = results_dir(args.out)
    if args.start_server:
        from ..serve.subprocess_server import running_server

        with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), *server_flags(args)) as server:
            url, log = server.url, server.log
            result = benchmark(url, args, log)
    else:
        result = benchmark(args.base_url.rstrip("/"), args, None)
    summary = result["summary"]
    summary["machine_label"] = args.machine_label or machine_label()
    summary["goodput_ttft_ms"], summary["goodput_tpot_ms"] = args.goodput_ttft_ms, args.goodput_tpot_ms
    config = {**vars(args), "server_flags": server_flags(args) if args.start_server else None}
    config.pop("api_key", None)
    path = write_results(args.name, config, result["raw"], summary, out_dir)
    plots = [] if args.no_plots else plot(summary, path.parent)

    columns = ["rate", "done", "req_s", "out_tok_s", "goodput", "ttft_mean", "ttft_med", "ttft_p99",
               "tpot_mean", "tpot_med", "tpot_p99", "itl_med", "itl_p99", "e2e_med", "e2e_p99"]
    rows = []
    named = ([("single", summary["single_stream"])] if "single_stream" in summary else []) + \
        list(summary["rates"].items())
    for label, s in named:
        rows.append({"rate": label, "done": f"{s['completed']}/{s['completed'] + s['failed']}",
                     "req_s": s["request_throughput"], "out_tok_s": s["output_token_throughput"],
                     "goodput": s["goodput"],
                     **{f"{m}_{k}": s[f"{'median' if k == 'med' else k}_{m}_ms"]
                        for m in ("ttft", "tpot", "itl", "e2e") for k in ("mean", "med", "p99")}})
    print()
    print("latencies in ms; rates in requests/s; goodput: TTFT <= "
          f"{args.goodput_ttft_ms:g} ms and TPOT <= {args.goodput_tpot_ms:g} ms")
    print_table(rows, columns)
    if "single_stream" in summary:
        s = summary["single_stream"]
        print(f"\nsingle stream ({s['prompt_len']}-token prompt): TTFT median "
              f"{fmt(s['median_ttft_ms'])} ms, decode {fmt(s['decode_tokens_per_s'])} tokens/s "
              f"-> acceptance (>= {args.accept_tokens_per_s:g} tok/s, TTFT <= "
              f"{args.accept_ttft_ms:g} ms): {'PASS' if s['meets_acceptance'] else 'FAIL'}")
    mism = {k: (v["prompt_len_mismatches"], v["output_len_mismatches"]) for k, v in summary["rates"].items()}
    print(f"(prompt, output) length mismatches per rate: {mism}")
    print(f"wrote {path}" + "".join(f"\nwrote {p}" for p in plots))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
