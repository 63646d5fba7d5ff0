"""The kernel tests check the wide-load paths too: in the simulator they are off by default
(``kernels/loads.py``: slow there for the executors), so every test here turns them on."""

from __future__ import annotations

import pytest

from blink_edu.kernels import loads


@pytest.fixture(autouse=True)
def wide_loads(monkeypatch):
    monkeypatch.setattr(loads, "WIDE_LOADS", True)
