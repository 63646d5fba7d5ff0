"""The package's face: ``from blink_edu import LLM, SamplingParams`` works, and importing the
package alone loads no Numba (the backend is chosen when the engine is first needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_import_blink_edu_loads_no_numba():
    done = run("import sys, blink_edu; print(sorted(m for m in sys.modules "
               "if m.split('.')[0] in ('numba', 'cupy')))")
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_llm_and_sampling_params_from_the_package():
    done = run("from blink_edu import LLM, SamplingParams, EngineConfig\n"
               "from blink_edu.llm import LLM as L2\n"
               "assert LLM is L2 and SamplingParams(max_tokens=3).max_tokens == 3\n"
               "import blink_edu\n"
               "try:\n"
               "    blink_edu.Nope\n"
               "except AttributeError as e:\n"
               "    print('refused:', e)\n")
    assert done.returncode == 0, done.stderr
    assert "refused: module 'blink_edu' has no attribute 'Nope'" in done.stdout
