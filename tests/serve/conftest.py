"""Fixtures for the server tests: one small server per module, and the bundled tokenizer."""

from __future__ import annotations

import openai
import pytest
from server_process import API_KEY, running_server

from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One small server for the module: 16 ring slots, 64 KV blocks, 4 sequences per step."""
    with running_server(tmp_path_factory.mktemp("serve"), "--ring-slots", "16", "--kv-blocks",
                        "64", "--max-num-seqs", "4") as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    """The official client, talking to the module's server."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                         timeout=60)


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_folder(resolve_model_dir())
