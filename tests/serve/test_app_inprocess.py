"""The app factory driven in-process over a plain (non-shared) ring, with no engine at all: /health
follows the ring's heartbeat and the engine process's life (starting -> ready -> stalled -> ready
-> dead), and a dead engine turns new requests away with 503 in OpenAI's error shape."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from blink_edu.ring import Ring, RingClient, RingLayout
from blink_edu.ring.layout import STATE_NAMES
from blink_edu.serve.app import ServeSettings, create_app
from blink_edu.serve.health import EngineWatch

LAYOUT = RingLayout(num_slots=4, max_prompt_tokens=64, max_output_tokens=32)
SETTINGS = ServeSettings(model_name="m", max_model_len=64, max_output_tokens=32, vocab_size=4096,
                         max_queue=4)


def test_health_follows_heartbeat_and_process(tokenizer):
    ring = Ring(bytearray(LAYOUT.nbytes), LAYOUT)  # a ring in this process's memory
    alive = [True]
    watch = EngineWatch(ring, lambda: alive[0], stall_after_s=0.2)
    with TestClient(create_app(RingClient(ring), tokenizer, SETTINGS, watch)) as http:
        def status():
            r = http.get("/health")
            assert (r.status_code == 200) == (r.json()["status"] == "ready")
            return r.json()["status"]

        assert status() == "starting"  # heartbeat 0: the model is still loading
        ring.engine_heartbeat[...] += 1
        assert status() == "ready"
        time.sleep(0.3)
        assert status() == "stalled"  # alive, but the loop has not moved for stall_after_s
        ring.engine_heartbeat[...] += 1
        assert status() == "ready"
        alive[0] = False
        assert status() == "dead"
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        assert ring.state.sum() == 0  # nothing was written into the ring


def test_running_and_waiting_gauges_are_the_schedulers_counts():
    from prometheus_client import generate_latest

    from blink_edu.serve.metrics import ServeMetrics

    metrics = ServeMetrics(lambda: {name: 0 for name in STATE_NAMES.values()},
                           lambda: (3, 10), lambda: (2, 5), lambda: 0, lambda: 7)
    text = generate_latest(metrics.registry).decode()
    assert "blink_edu:num_preemptions_total 7.0" in text
    assert "blink_edu:num_requests_running 2.0" in text
    assert "blink_edu:num_requests_waiting 5.0" in text
    assert 'blink_edu:kv_blocks{kind="used"} 3.0' in text
