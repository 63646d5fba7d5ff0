"""Run the real server (``python -m blink_edu.serve``) as a subprocess on a free 127.0.0.1 port.

Every wait here is bounded; every server is stopped in a ``finally`` (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

API_KEY = "test-key"
START_TIMEOUT_S = 60
MODEL = "blink-edu-7m"


@dataclass
class Server:
    process: subprocess.Popen
    url: str  # http://127.0.0.1:<port>
    log: Path
    headers: dict
    engine_pid: int | None = None

    def ready(self) -> bool:
        try:
            return self.health().status_code == 200
        except httpx.TransportError:
            return False

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.url}/health", timeout=5)

    def metric(self, name: str, **labels) -> float:
        """One sample of /metrics (0.0 if absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in labels.items()):
                    return sample.value
        return 0.0

    def wait_idle(self, timeout_s: float = 10.0) -> dict:
        """Wait until every ring slot is EMPTY and no KV block is used; the /health detail."""
        deadline = time.monotonic() + timeout_s
        while True:
            detail = self.health().json()
            slots = detail["ring"]["slots"]
            idle = slots["EMPTY"] == sum(slots.values()) and detail["kv_blocks"]["used"] == 0
            if idle or time.monotonic() > deadline:
                return detail
            time.sleep(0.02)

    def stop(self, sig=signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(tmp_path: Path, *flags: str):
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "blink_edu.serve", "--host", "127.0.0.1", "--port", str(port),
             "--api-key", API_KEY, *flags], stdout=out, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log,
                    {"Authorization": f"Bearer {API_KEY}"})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.ready():
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy in {START_TIMEOUT_S} s:\n"
                                   f"{log.read_text()}")
            time.sleep(0.1)
        server.engine_pid = server.health().json()["engine_pid"]
        yield server
    finally:
        server.stop()
        if server.engine_pid is not None:
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
    os.kill(pid, signal.SIGKILL)
