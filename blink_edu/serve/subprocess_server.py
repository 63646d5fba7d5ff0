"""Run ``python -m blink_edu.serve`` as a child process on a free 127.0.0.1 port.

For the benchmarks, the tests and the chapters: start a real server, wait (bounded) until
``/health`` says ready, and always stop it — SIGTERM (it drains and unlinks its ring), then
SIGKILL if it does not exit, and make sure its engine process is gone too.

    with running_server(log_dir, "--max-num-seqs", "4") as server:
        httpx.get(f"{server.url}/v1/models")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

START_TIMEOUT_S = 120  # loading the model (and, on a GPU, compiling kernels) happens in here


@dataclass
class ServerProcess:
    process: subprocess.Popen
    url: str  # http://127.0.0.1:<port>
    log: Path
    headers: dict = field(default_factory=dict)
    engine_pid: int | None = None

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.url}/health", timeout=5)

    def ready(self) -> bool:
        try:
            return self.health().status_code == 200
        except httpx.TransportError:
            return False

    def metric(self, name: str, **labels) -> float:
        """One sample of /metrics (0.0 if absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def wait_idle(self, timeout_s: float = 30.0) -> dict | None:
        """Wait (bounded) until every ring slot is EMPTY and no KV block is used; /health's body
        (the last one seen if the server never went idle, None if it never answered)."""
        deadline = time.monotonic() + timeout_s
        detail = None
        while True:
            try:
                detail = self.health().json()
                slots = detail["ring"]["slots"]
                kv = detail.get("kv_blocks") or {"used": 0}
                if slots.get("EMPTY") == sum(slots.values()) and kv["used"] == 0:
                    return detail
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                return detail
            time.sleep(0.02)

    def stop(self, sig=signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Signal the server and wait for it (SIGKILL after ``timeout_s``); its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(log_dir: Path, *flags: str, api_key: str | None = None,
                   timeout_s: float = START_TIMEOUT_S):
    """A healthy server for the ``with`` block; stopped (engine included) whatever happens."""
    port = free_port()
    log = Path(log_dir) / f"server-{port}.log"
    auth = ["--api-key", api_key] if api_key else []
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "blink_edu.serve", "--host", "127.0.0.1", "--port", str(port),
             *auth, *flags], stdout=out, stderr=subprocess.STDOUT)
    server = ServerProcess(process, f"http://127.0.0.1:{port}", log,
                           {"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        deadline = time.monotonic() + timeout_s
        while not server.ready():
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy in {timeout_s} s:\n{log.read_text()}")
            time.sleep(0.1)
        server.engine_pid = server.health().json().get("engine_pid")
        yield server
    finally:
        server.stop()
        if server.engine_pid:
            kill_if_alive(server.engine_pid)


def kill_if_alive(pid: int, timeout_s: float = 5.0) -> None:
    """The engine exits when its frontend does; if it has not within ``timeout_s``, kill it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
