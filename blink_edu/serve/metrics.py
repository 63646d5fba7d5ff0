"""Prometheus metrics for ``GET /metrics``, named after vLLM's with a ``blink_edu:`` prefix.

docs/design.md §9 asks for token times "as the client saw them": these are measured in the frontend,
from the moment a request is submitted to the moment its tokens are *seen* in the ring, so they
include the ring's polling delay (Blink §3's t_poll) — what a user of the server experiences.

Two kinds of metric:

* **events**, recorded as requests run: TTFT, inter-token latency, end-to-end latency
  (histograms), prompt and generation tokens, finished requests by reason (counters);
* **state**, read when Prometheus scrapes: ring occupancy by slot state (the frontend's view of
  the engine: it is all the ring shows), and the engine's KV blocks (from ``EngineStatsBoard``).

vLLM name                                 here
----------------------------------------  -----------------------------------------------
vllm:time_to_first_token_seconds          blink_edu:time_to_first_token_seconds
vllm:inter_token_latency_seconds          blink_edu:inter_token_latency_seconds
vllm:e2e_request_latency_seconds          blink_edu:e2e_request_latency_seconds
vllm:prompt_tokens_total                  blink_edu:prompt_tokens_total
vllm:generation_tokens_total              blink_edu:generation_tokens_total
vllm:request_success_total{finished_reason}  blink_edu:request_success_total{finished_reason}
vllm:num_requests_running / _waiting      blink_edu:num_requests_running / _waiting (the engine's
                                          scheduler; slots by state are blink_edu:ring_slots)
vllm:kv_cache_usage_perc                  blink_edu:kv_cache_usage_perc  (0..1, as vLLM's)
(none)                                    blink_edu:ring_slots{state}, blink_edu:kv_blocks{kind},
                                          blink_edu:engine_restarts_total
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..ring.layout import STATE_NAMES

# Buckets in seconds, from vLLM's (a CPU run of a 7M model lives in the low buckets).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0)

class ServeMetrics:
    """Every metric in its own registry (so several apps can live in one test process).
    ``occupancy``: slot counts by state name; ``kv_blocks``: (used, total) and
    ``scheduler_counts``: (running, waiting) and ``preemptions``: requests preempted so far,
    from the engine, or None while unknown."""

    def __init__(self, occupancy: Callable[[], dict[str, int]],
                 kv_blocks: Callable[[], tuple[int, int] | None],
                 scheduler_counts: Callable[[], tuple[int, int] | None] = lambda: None,
                 engine_restarts: Callable[[], int] = lambda: 0,
                 preemptions: Callable[[], int | None] = lambda: None):
        self.registry = CollectorRegistry()
        r, p = self.registry, "blink_edu:"
        self.time_to_first_token = Histogram(
            p + "time_to_first_token_seconds", "Submit to first token seen in the ring.",
            buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            p + "inter_token_latency_seconds", "Time between tokens, as the frontend saw them.",
            buckets=ITL_BUCKETS, registry=r)
        self.e2e_latency = Histogram(
            p + "e2e_request_latency_seconds", "Submit to last token.", buckets=E2E_BUCKETS,
            registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests.",
                                     registry=r)
        self.generation_tokens = Counter(p + "generation_tokens",
                                         "Tokens generated and consumed by the frontend.",
                                         registry=r)
        self.request_success = Counter(p + "request_success", "Finished requests by reason.",
                                       ["finished_reason"], registry=r)
        self._state_gauges(occupancy, kv_blocks, scheduler_counts)
        # a count, read from the supervisor when scraped: a counter Prometheus cannot .inc()
        Gauge(p + "engine_restarts_total", "Times the server restarted its dead engine.",
              registry=r).set_function(engine_restarts)
        Gauge(p + "num_preemptions_total", "Requests the engine preempted under memory pressure "
              "(-1: not reported yet).", registry=r).set_function(
                  lambda: -1 if preemptions() is None else preemptions())

    def _state_gauges(self, occupancy, kv_blocks, scheduler_counts) -> None:
        r, p = self.registry, "blink_edu:"

        def count(states):
            return lambda: sum(occupancy()[STATE_NAMES[s]] for s in states)

        # The ring loop claims every pending slot at once, so "claimed" is not "running": the
        # engine's scheduler says who is in the batch and who waits (-1: not reported yet).
        Gauge(p + "num_requests_running", "Requests in the engine's running batch.",
              registry=r).set_function(lambda: (scheduler_counts() or (-1, -1))[0])
        Gauge(p + "num_requests_waiting", "Requests the engine has queued but not started.",
              registry=r).set_function(lambda: (scheduler_counts() or (-1, -1))[1])
        slots = Gauge(p + "ring_slots", "Ring slots by state.", ["state"], registry=r)
        for state, name in STATE_NAMES.items():
            slots.labels(name).set_function(count((state,)))
        blocks = Gauge(p + "kv_blocks", "The engine's KV blocks (-1: not reported yet).",
                       ["kind"], registry=r)
        blocks.labels("used").set_function(lambda: (kv_blocks() or (-1, -1))[0])
        blocks.labels("total").set_function(lambda: (kv_blocks() or (-1, -1))[1])
        Gauge(p + "kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).",
              registry=r).set_function(lambda: _fraction(kv_blocks()))

    def request_finished(self, reason: str, e2e_s: float, prompt_tokens: int,
                         completion_tokens: int) -> None:
        self.request_success.labels(reason).inc()
        if reason in ("stop", "length"):  # aborted and failed requests have no "end"
            self.e2e_latency.observe(e2e_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)


def _fraction(kv: tuple[int, int] | None) -> float:
    return kv[0] / kv[1] if kv and kv[1] > 0 else 0.0
