"""A real server for a chapter: ``python -m blink_edu.serve`` in a child process that lives
across the chapter's cells (Blink §3's frontend and engine, docs/design.md §2).

``serve/subprocess_server.py`` starts, waits for and stops the server (its engine included);
this only keeps one open between cells, and makes sure it goes when the notebook's kernel does:

    server = ChapterServer("--max-num-seqs", "4")      # returns once /health says ready
    httpx.get(f"{server.url}/v1/models")
    rc = server.stop()                                # 0: drained, ring unlinked
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path

from ..serve.subprocess_server import START_TIMEOUT_S, running_server


class ChapterServer:
    """A running server; ``url``, ``log`` (its output), ``engine_pid``, ``health()``."""

    def __init__(self, *flags: str, timeout_s: float = START_TIMEOUT_S):
        self.log_dir = Path(tempfile.mkdtemp(prefix="blink_edu_chapter_"))
        self._open = ExitStack()
        self.process = self._open.enter_context(running_server(self.log_dir, *flags,
                                                               timeout_s=timeout_s))
        atexit.register(self.stop)  # whatever happens in the cells, it goes with the kernel
        self.url, self.log, self.engine_pid = (self.process.url, self.process.log,
                                               self.process.engine_pid)

    def health(self) -> dict:
        """``/health``'s body."""
        return self.process.health().json()

    def stop(self) -> int:
        """SIGTERM (it drains, stops its engine, unlinks its ring), SIGKILL if it must; its
        exit status. Idempotent."""
        atexit.unregister(self.stop)
        self._open.close()
        return self.process.process.returncode

    def remove_log(self) -> None:
        shutil.rmtree(self.log_dir, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (an engine that should have gone, say)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
