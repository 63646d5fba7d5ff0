"""The serving benchmark: seeded workloads, vLLM's metric definitions, and one tiny real run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from blink_edu import latency
from blink_edu.bench import serve as bench
from blink_edu.bench.prompts import PromptBuilder
from blink_edu.sim.workload import arrival_times, fixed_lengths, lognormal_lengths
from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_folder(resolve_model_dir())


# --- the workload --------------------------------------------------------------------------


def lengths(seed: int, n: int = 200, max_model_len: int = 512):
    return lognormal_lengths(np.random.default_rng(seed), n, input_mean=200, input_sigma=1.0,
                             output_mean=150, output_sigma=1.0, max_model_len=max_model_len)


def test_lognormal_lengths_are_seeded_and_fit_the_context():
    seed = int(np.random.default_rng().integers(1 << 30))
    a, b, other = lengths(seed), lengths(seed), lengths(seed + 1)
    assert a == b
    assert a != other
    for max_len in (512, 128):
        for p, o in lengths(seed, max_model_len=max_len):
            assert p >= 4 and o >= 2 and p + o <= max_len
    # a long right tail: with these parameters some prompts hit the clip, the median is lower
    p = np.array([x for x, _ in a])
    assert np.median(p) < p.mean() and p.max() > 2 * np.median(p)


def test_fixed_lengths_refuse_what_does_not_fit():
    assert fixed_lengths(3, 64, 64, 512) == [(64, 64)] * 3
    with pytest.raises(ValueError):
        fixed_lengths(3, 500, 13, 512)


def test_arrivals_poisson_gamma_and_inf():
    seed = int(np.random.default_rng().integers(1 << 30))
    t = arrival_times(np.random.default_rng(seed), 4000, rate=5.0)
    assert t == arrival_times(np.random.default_rng(seed), 4000, rate=5.0)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    g = np.diff(t)
    assert abs(g.mean() - 0.2) < 0.02  # mean gap 1/rate
    assert abs(g.std() / g.mean() - 1.0) < 0.1  # exponential: coefficient of variation 1
    bursty = np.diff(arrival_times(np.random.default_rng(seed), 4000, rate=5.0, burstiness=0.25))
    assert abs(bursty.mean() - 0.2) < 0.04 and bursty.std() / bursty.mean() > 1.6  # 1/sqrt(0.25)
    assert arrival_times(np.random.default_rng(seed), 5, rate=math.inf) == [0.0] * 5


def test_prompts_have_exactly_the_wanted_token_count(tokenizer):
    rng = np.random.default_rng()
    builder = PromptBuilder(tokenizer)
    pairs = lengths(int(rng.integers(1 << 30)), n=60) + [(2, 8), (3, 8), (510, 2)]
    items = builder.build(pairs, rng)
    for item, (p, o) in zip(items, pairs):
        assert len(tokenizer.encode(item.prompt)) == p == item.prompt_len
        assert item.output_len == o
    assert len({i.prompt for i in items}) > len(items) // 2  # different offsets, different text
    seed = int(rng.integers(1 << 30))
    again = [i.prompt for i in builder.build(pairs, np.random.default_rng(seed))]
    assert again == [i.prompt for i in builder.build(pairs, np.random.default_rng(seed))]


# --- the metrics (vLLM's definitions) ------------------------------------------------------


def result(ttft, chunk_times, output_tokens, e2e=None, **kw):
    """A request whose chunks arrived at ``chunk_times`` (s after sending; the first is TTFT)."""
    assert chunk_times[0] == ttft
    r = bench.RequestResult(0, 10, output_tokens, ttft=ttft,
                            e2e=chunk_times[-1] if e2e is None else e2e,
                            itl=latency.gaps(chunk_times), chunks=len(chunk_times),
                            prompt_tokens=10, completion_tokens=output_tokens, **kw)
    return r


def test_tpot_excludes_the_first_token_and_itl_lists_every_gap():
    times = [0.100, 0.110, 0.130, 0.160, 0.200]
    r = result(0.100, times, 5)
    assert r.itl == pytest.approx([0.010, 0.020, 0.030, 0.040])
    assert bench.tpot(r) == pytest.approx((0.200 - 0.100) / 4)  # not 0.200 / 5
    one = result(0.05, [0.05], 1)
    assert one.itl == [] and bench.tpot(one) is None
    # a chunk carrying two tokens: ITL has one gap fewer, TPOT still divides by tokens - 1
    two = result(0.1, [0.1, 0.12, 0.2], 4)
    assert len(two.itl) == 2 and bench.tpot(two) == pytest.approx(0.1 / 3)


def test_summary_percentiles_throughput_and_goodput():
    rs = [result(0.100, [0.100, 0.120, 0.140], 3),    # TPOT 20 ms: good
          result(0.400, [0.400, 0.410, 0.420], 3),    # TTFT over the SLO
          result(0.200, [0.200, 0.300, 0.400], 3),    # TPOT 100 ms, over the SLO
          result(0.250, [0.250], 1),                  # one token: no TPOT, TTFT fine: good
          bench.RequestResult(4, 10, 3, error="HTTP 429: busy")]
    s = bench.summarize(rs, duration_s=2.0, ttft_slo_s=0.3, tpot_slo_s=0.05)
    assert s["completed"] == 4 and s["failed"] == 1
    assert s["request_throughput"] == pytest.approx(2.0)
    assert s["output_token_throughput"] == pytest.approx(10 / 2.0)
    assert s["goodput"] == pytest.approx(2 / 2.0)  # both SLOs must hold
    assert s["slo_attained"] == pytest.approx(2 / 5)
    ttfts = [100, 400, 200, 250]
    assert s["mean_ttft_ms"] == pytest.approx(np.mean(ttfts))
    assert s["median_ttft_ms"] == pytest.approx(225)
    assert s["p99_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99))
    assert s["mean_tpot_ms"] == pytest.approx(np.mean([20, 10, 100]))  # 3 requests have a TPOT
    assert s["median_itl_ms"] == pytest.approx(np.median([20, 20, 10, 10, 100, 100]))
    assert s["p99_e2e_ms"] == pytest.approx(np.percentile([140, 420, 400, 250], 99))
    assert s["prompt_len_mismatches"] == 0 and s["output_len_mismatches"] == 0
    assert bench.summarize([result(0.1, [0.1, 0.2], 2, **{})], 1.0, 1, 1)["goodput"] == 1.0


def test_mismatched_usage_is_counted():
    r = result(0.1, [0.1, 0.2], 2)
    r.prompt_tokens = 11
    r.output_len = 3
    s = bench.summarize([r], 1.0, 1.0, 1.0)
    assert s["prompt_len_mismatches"] == 1 and s["output_len_mismatches"] == 1


# --- one tiny real run ----------------------------------------------------------------------


def test_end_to_end_tiny_run(tmp_path):
    rc = bench.main(["--start-server", "--num-prompts", "4", "--request-rates", "inf",
                     "--input-len", "12", "--output-len", "8", "--warmup", "1",
                     "--kv-blocks", "64", "--ring-slots", "16", "--max-num-seqs", "4",
                     "--request-timeout", "60", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "serve.json").read_text())
    requests = data["raw"]["rates"]["inf"]["requests"]
    assert len(requests) == 4
    for r in requests:
        assert r["error"] is None
        assert r["completion_tokens"] == 8 and r["prompt_tokens"] == 12
        assert r["finish_reason"] == "length"
        assert 0 < r["ttft"] <= r["e2e"] and len(r["itl"]) == r["chunks"] - 1
    s = data["summary"]["rates"]["inf"]
    assert s["completed"] == 4 and s["output_len_mismatches"] == 0
    assert s["output_token_throughput"] == pytest.approx(32 / s["duration_s"])
    assert data["machine"]["cpu_count"] and data["commit"]
    assert (tmp_path / "serve_latency.png").stat().st_size > 0
    assert (tmp_path / "serve_throughput.png").stat().st_size > 0
