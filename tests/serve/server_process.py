"""The real server (``python -m blink_edu.serve``) for the tests: the package's
``running_server`` with the tests' API key. Every wait is bounded; every server is stopped."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from blink_edu.serve.subprocess_server import running_server as _running_server

API_KEY = "test-key"
START_TIMEOUT_S = 60
MODEL = "blink-edu-7m"
PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me about the sea."}]
LONG = {"ignore_eos": True}  # never stop early at EOS: the request runs to max_tokens


@contextmanager
def running_server(tmp_path: Path, *flags: str):
    with _running_server(tmp_path, *flags, api_key=API_KEY, timeout_s=START_TIMEOUT_S) as server:
        yield server
