"""The benchmarks' --help and the simulator work on the base install: no httpx, no openai (the
[dev] extra's). Each check runs in a fresh interpreter in which importing those is an error, as
on a machine that never installed them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A meta-path finder that refuses the dev-only packages, then the command (runpy: as -m does).
BLOCKER = """
import importlib.abc, runpy, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('httpx', 'openai'):
            raise ModuleNotFoundError(f'No module named {name!r} (blocked by the test)')
        return None
sys.meta_path.insert(0, Refuse())
"""


def run_blocked(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_the_blocker_blocks():
    done = run_blocked("import httpx")
    assert done.returncode != 0 and "blocked by the test" in done.stderr


@pytest.mark.parametrize("name", ["slo", "serve", "decode", "kv_transfer", "persistent",
                                  "slo_real"])
def test_bench_help_works_without_httpx(name):
    done = run_blocked(f"sys.argv = ['x', '--help']\n"
                       f"runpy.run_module('blink_edu.bench.{name}', run_name='__main__')")
    assert done.returncode == 0, done.stderr
    assert f"usage: python -m blink_edu.bench.{name.replace('slo_real', 'slo')}" in done.stdout
    assert "--out" in done.stdout and "(default:" in done.stdout


def test_the_simulator_imports_without_httpx():
    done = run_blocked("import blink_edu.sim.sweep, blink_edu.sim.metrics, blink_edu.latency\n"
                       "print('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
