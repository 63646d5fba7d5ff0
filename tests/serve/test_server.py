"""The OpenAI-compatible server end to end: a real ``python -m blink_edu.serve`` subprocess (a
frontend and a spawned engine process, meeting only in the shared-memory ring), driven by the
official ``openai`` client and by raw HTTP for the inputs that client would refuse to send.

Checked: streamed text equals the whole answer (greedy); usage is exact; stop strings cut the text
and end the request; every bad input gets its 4xx and the server keeps answering; a client that
disconnects mid-stream frees its slot and KV blocks; more clients than ``--max-num-seqs`` are all
answered exactly once and leave the ring empty; a full ring answers 429 with Retry-After; SIGTERM
drains in-flight streams and exits 0 with the ring unlinked; a dead engine fails in-flight
requests with an error event and is restarted (or, after too many deaths, the server exits 3);
--port is checked and the banner appears only once the port is bound."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from server_process import API_KEY, CHAT, LONG, MODEL, PROMPT, running_server

def streamed_text(chunks, chat: bool) -> tuple[str, list]:
    """(concatenated text, every chunk) of an openai stream."""
    chunks = list(chunks)
    pieces = [(c.choices[0].delta.content or "") if chat else c.choices[0].text
              for c in chunks if c.choices]
    return "".join(pieces), chunks


# --- the happy paths --------------------------------------------------------------------------


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    detail = server.health().json()
    assert detail["status"] == "ready"
    assert detail["kv_blocks"]["total"] == 64
    assert sum(detail["ring"]["slots"].values()) == 16


def test_completion_stream_equals_whole_and_usage_is_exact(server, client, tokenizer):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    choice = whole.choices[0]
    text, chunks = streamed_text(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}), chat=False)
    n_prompt = len(tokenizer.encode(PROMPT))
    assert choice.text and text == choice.text
    assert whole.usage.prompt_tokens == n_prompt
    assert whole.usage.total_tokens == n_prompt + whole.usage.completion_tokens
    assert chunks[-1].usage == whole.usage and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == choice.finish_reason
    if choice.finish_reason == "length":
        assert whole.usage.completion_tokens == 24
    assert all(c.object == "text_completion" for c in chunks)


def test_chat_stream_equals_whole_and_usage_is_exact(server, client, tokenizer):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=20,
                                           temperature=0)
    text, chunks = streamed_text(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}), chat=True)
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content and text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    n_prompt = len(tokenizer.encode(tokenizer.apply_chat_template(CHAT)))
    assert whole.usage.prompt_tokens == n_prompt == chunks[-1].usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_max_tokens_ends_with_length(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7, temperature=0,
                                    extra_body=LONG)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 7


def test_seed_makes_sampling_reproducible(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16,
                                         temperature=1.0, top_p=0.9, seed=seed,
                                         extra_body={"top_k": 50, **LONG}).choices[0].text

    assert sample(1234) == sample(1234)


def test_stop_string_cuts_text_and_frees_the_slot(server, client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                     extra_body=LONG)
    text = full.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 4]  # a piece from the middle
    assert stop.strip(), f"pick another piece of {text!r}"
    expected = text[:text.index(stop)]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                    stop=[stop], extra_body=LONG)
    streamed, chunks = streamed_text(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop, stream=True,
        extra_body=LONG), chat=False)
    assert out.choices[0].text == expected == streamed
    assert out.choices[0].finish_reason == "stop" == chunks[-1].choices[0].finish_reason
    assert out.usage.completion_tokens < 40  # the request ended at the stop, not at max_tokens
    detail = server.wait_idle()  # the cancelled slot was reaped once the engine let go of it
    assert detail["ring"]["slots"]["EMPTY"] == 16 and detail["kv_blocks"]["used"] == 0


# --- bad input: a clear 4xx, and the server keeps answering -----------------------------------

TOO_LONG = " ".join(["word"] * 700)  # more tokens than the 512-token context
BAD = [
    ("completions", b'{"prompt": "hi", "max_tokens": ', 400, None),  # malformed JSON
    ("completions", {"prompt": "hi", "max_tokens": "16"}, 400, "max_tokens"),  # wrong type
    ("completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("completions", {"prompt": 42}, 400, None),
    ("completions", {"max_tokens": 4}, 400, "prompt"),  # missing
    ("completions", {"prompt": TOO_LONG}, 400, "prompt"),
    ("completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "max_tokens": 100000}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("completions", {"prompt": "hi", "n": 40}, 400, "n"),  # more than the 16-slot ring queues
    ("chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("chat/completions", {"messages": CHAT, "tool_choice": "auto"}, 400, "tool_choice"),
    ("chat/completions", {"messages": CHAT, "functions": []}, 400, "functions"),
    ("chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, 400,
     "response_format"),
    ("chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 9}, 400,
     "top_logprobs"),  # above --max-logprobs (5)
    ("completions", {"prompt": "hi", "logprobs": 6}, 400, "logprobs"),
    ("completions", {"prompt": "hi", "suffix": "end"}, 400, "suffix"),
    ("completions", {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ("completions", {"prompt": "hi", "echo": True, "logprobs": 1}, 400, "echo"),
    ("completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("completions", {"prompt": "hi", "logit_bias": {"999999": 1}}, 400, "logit_bias"),
    ("completions", {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("completions", {"prompt": "hi", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("completions", {"prompt": "hi", "frequency_penalty": -3}, 400, "frequency_penalty"),
    ("completions", {"prompt": []}, 400, "prompt"),
    ("completions", {"prompt": "hi", "model": "gpt-17"}, 404, "model"),
    ("completions", {"prompt": [5, 999999]}, 400, "prompt"),  # token id outside the vocabulary
    ("completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": 7}]}, 400, None),
    ("completions", b"{" + b'"prompt": "' + b"x" * (2 << 20) + b'"}', 413, None),  # oversized
]


@pytest.mark.parametrize("path, body, status, param", BAD,
                         ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_input_gets_4xx_and_server_keeps_answering(server, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}/v1/{path}", content=content, timeout=30,
                   headers={**server.headers, "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"].split(".")[0] == param
    ok = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=30,
                    json={"prompt": PROMPT, "max_tokens": 2})
    assert ok.status_code == 200 and server.health().status_code == 200


def test_api_key_is_required(server):
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi"}, timeout=5)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


# --- disconnects and load ----------------------------------------------------------------------


def test_client_disconnect_cancels_and_frees_the_slot(server):
    aborted = server.metric("blink_edu:request_success_total", finished_reason="abort")
    body = {"prompt": PROMPT, "max_tokens": 400, "stream": True, **LONG}
    start = time.monotonic()
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30,
                      headers=server.headers) as r:
        events = 0
        for line in r.iter_lines():  # read two text events, then hang up
            events += line.startswith("data:")
            if events == 2:
                break
    detail = server.wait_idle()
    assert detail["ring"]["slots"]["EMPTY"] == 16 and detail["kv_blocks"]["used"] == 0
    assert time.monotonic() - start < 2.0, "the slot was freed only when 400 tokens were done"
    assert server.metric("blink_edu:request_success_total", finished_reason="abort") == aborted + 1


def test_more_clients_than_max_num_seqs_all_answered_once(server):
    n_clients, max_tokens = 12, 16
    done_before = sum(server.metric("blink_edu:request_success_total", finished_reason=r)
                      for r in ("stop", "length"))

    async def one(client, i):
        prompt = f"{PROMPT} there lived number {i}"
        if i % 2:
            chunks = [c async for c in await client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body=LONG)]
            return chunks[-1].usage.completion_tokens, chunks[-2].choices[0].finish_reason
        out = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                              temperature=0, extra_body=LONG)
        return out.usage.completion_tokens, out.choices[0].finish_reason

    async def run_all():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY,
                                      max_retries=0, timeout=60) as client:
            return await asyncio.wait_for(
                asyncio.gather(*(one(client, i) for i in range(n_clients))), timeout=90)

    results = asyncio.run(run_all())
    assert results == [(max_tokens, "length")] * n_clients
    done_after = sum(server.metric("blink_edu:request_success_total", finished_reason=r)
                     for r in ("stop", "length"))
    assert done_after - done_before == n_clients  # each answered exactly once
    detail = server.wait_idle()
    assert detail["ring"]["slots"]["EMPTY"] == 16 and detail["kv_blocks"]["used"] == 0
    assert server.metric("blink_edu:time_to_first_token_seconds_count") >= n_clients


# --- a full ring, draining on SIGTERM, a dead engine (each on its own small server) ---------------


def open_stream(server, max_tokens: int):
    """A streamed completion whose first text event has arrived (so it is in the ring)."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **LONG}
    cm = httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60,
                      headers=server.headers)
    response = cm.__enter__()
    lines = response.iter_lines()
    first = next(line for line in lines if line.startswith("data:"))
    return cm, itertools.chain([first], lines)  # the rest is read later


def test_full_ring_gets_429_and_sigterm_drains(tmp_path):
    with running_server(tmp_path, "--ring-slots", "2", "--kv-blocks", "64",
                        "--max-num-seqs", "4") as server:
        ring = Path("/dev/shm") / server.health().json()["ring"]["name"]
        assert ring.exists()
        streams = [open_stream(server, max_tokens=300) for _ in range(2)]
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.RateLimitError) as err:
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        assert err.value.response.headers["Retry-After"] == "1"
        server.process.send_signal(signal.SIGTERM)
        for cm, lines in streams:  # both in-flight streams still run to the end
            events = [line for line in lines if line.startswith("data:")]
            cm.__exit__(None, None, None)
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2][5:])["usage"]["completion_tokens"] == 300
            assert json.loads(events[-3][5:])["choices"][0]["finish_reason"] == "length"
        assert server.process.wait(30) == 0
        assert not ring.exists()


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.1)


def test_a_killed_engine_fails_its_requests_and_is_restarted(tmp_path):
    """The engine dies mid-stream: the stream ends with an error event, the death and the
    restart are logged, /health and /metrics count the restart, new requests succeed on the
    new engine, and at exit nothing is left in /dev/shm."""
    with running_server(tmp_path, "--ring-slots", "4", "--kv-blocks", "64") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                               timeout=30)
        ring = Path("/dev/shm") / server.health().json()["ring"]["name"]
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=400,
                                           stream=True, extra_body=LONG)
        next(iter(stream))  # running
        old_pid = server.engine_pid
        os.kill(old_pid, signal.SIGKILL)
        with pytest.raises(openai.APIError, match="engine"):
            for _ in stream:
                pass
        wait_until(server.ready, 60, "the engine restarted")
        detail = server.health().json()
        server.engine_pid = detail["engine_pid"]  # the running_server cleanup watches this one
        assert detail["engine_restarts"] == 1 and detail["engine_pid"] != old_pid
        assert server.metric("blink_edu:engine_restarts_total") == 1
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                        extra_body=LONG)
        assert out.usage.completion_tokens == 4
        streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                             stream=True, extra_body=LONG)
        assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "length"
        log = server.log.read_text()
        assert f"engine process {old_pid} died" in log and "engine restarted" in log
        assert server.wait_idle()["ring"]["slots"]["EMPTY"] == 4
        assert server.stop() == 0 and not ring.exists()


def test_the_server_gives_up_after_max_engine_restarts(tmp_path):
    with running_server(tmp_path, "--ring-slots", "2", "--kv-blocks", "64",
                        "--max-engine-restarts", "0") as server:
        ring = Path("/dev/shm") / server.health().json()["ring"]["name"]
        os.kill(server.engine_pid, signal.SIGKILL)
        assert server.process.wait(30) == 3  # for a supervisor (systemd, Kubernetes) to act on
        assert "giving up" in server.log.read_text() and not ring.exists()


def test_port_is_validated_and_the_banner_waits_for_the_bind(tmp_path):
    import socket
    import subprocess
    import sys

    for bad in ("0", "70000", "http"):
        run = subprocess.run([sys.executable, "-m", "blink_edu.serve", "--port", bad],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "--port: must be an integer in 1..65535" in run.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "blink_edu.serve", "--port", str(port),
                              "--ring-slots", "2", "--kv-blocks", "64"],
                             capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "listening on" not in run.stdout + run.stderr


def test_non_streamed_client_disconnect_cancels_and_frees_the_slot(server):
    aborted = server.metric("blink_edu:request_success_total", finished_reason="abort")
    body = {"prompt": PROMPT, "max_tokens": 400, **LONG}
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up waiting and hangs up
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.5, headers=server.headers)
    detail = server.wait_idle()
    assert detail["ring"]["slots"]["EMPTY"] == 16 and detail["kv_blocks"]["used"] == 0
    assert time.monotonic() - start < 3.0, "the slot was freed only when 400 tokens were done"
    assert server.metric("blink_edu:request_success_total", finished_reason="abort") == aborted + 1
