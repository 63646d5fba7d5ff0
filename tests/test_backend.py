"""The backend is chosen once, in one place, and can be forced by an environment variable."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from blink_edu import backend


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_simulator_forced_runs_a_kernel():
    code = """
from blink_edu.backend import get_backend
b = get_backend()
cuda = b.cuda  # kernels must name the module as a global: the simulator swaps it for its own
import numpy as np
@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1.0
x = np.arange(5.0)
add_one[1, 8](x)
print(b.name, b.is_simulator, x.tolist())
"""
    out = run_python(code, BLINK_EDU_BACKEND="sim")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["sim", "True"]
    assert "[1.0, 2.0, 3.0, 4.0, 5.0]" in out.stdout


def test_gpu_forced_without_a_gpu_says_so():
    if backend.cuda_device_count() > 0:
        pytest.skip("this machine has a GPU; the error path needs a machine without one")
    out = run_python("from blink_edu.backend import get_backend; get_backend()", BLINK_EDU_BACKEND="gpu")
    assert out.returncode != 0
    assert "BLINK_EDU_BACKEND=gpu but no CUDA driver/device was found" in out.stderr


def test_unknown_choice_is_rejected():
    out = run_python("from blink_edu.backend import get_backend; get_backend()", BLINK_EDU_BACKEND="tpu")
    assert "BLINK_EDU_BACKEND='tpu': expected one of auto, gpu, sim" in out.stderr


def test_numba_cuda_imported_first_with_other_mode_is_caught():
    code = "import numba.cuda\nfrom blink_edu.backend import get_backend\nget_backend()"
    out = run_python(code, BLINK_EDU_BACKEND="sim", NUMBA_ENABLE_CUDASIM="0")
    assert out.returncode != 0 and "imported before blink_edu chose its backend" in out.stderr


def test_row_stack_shim_restores_the_removed_function(monkeypatch):
    monkeypatch.delattr(np, "row_stack", raising=False)
    backend._apply_numpy_shim()
    assert np.row_stack(([1, 2], [3, 4])).shape == (2, 2)


def test_only_backend_module_asks_about_the_gpu():
    """docs/design.md §3: nothing else in the package decides GPU-or-simulator on its own."""
    import pathlib

    root = pathlib.Path(backend.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "backend.py" and any(s in p.read_text() for s in
                    ("NUMBA_ENABLE_CUDASIM", "cuda.is_available", "cuDeviceGetCount"))]
    assert offenders == []
