"""Which machine runs the kernels: a real CUDA GPU, or Numba's CUDA simulator.

docs/design.md §3. The same Numba CUDA kernels run in two places:

* ``gpu``  — numba-cuda compiles them for the GPU; host arrays are CuPy where available.
* ``sim``  — Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) runs every CUDA thread as a
  Python thread on the CPU, so a laptop with no GPU (and CI) can execute and test every kernel.
  It is slow: keep shapes tiny there (docs/design.md §5).

The choice is made exactly once, here, before ``numba.cuda`` is first imported, because the
simulator is selected at import time. Nothing else in the package asks "is there a GPU?".

Override with the environment variable ``BLINK_EDU_BACKEND=gpu|sim|auto`` (default ``auto``:
the GPU when a CUDA driver and at least one device answer, otherwise the simulator).

Also here: the NumPy 2.5 shim. numba-cuda 0.30.x still references ``np.row_stack``, which
NumPy 2.5 removed; on such a NumPy we put it back as ``np.vstack`` before numba-cuda loads.
"""

from __future__ import annotations

import ctypes
import os
import logging
import sys
from dataclasses import dataclass
from types import ModuleType

import numpy as np

BACKEND_ENV = "BLINK_EDU_BACKEND"
log = logging.getLogger(__name__)
_CHOICES = ("auto", "gpu", "sim")


class BackendError(RuntimeError):
    """The requested backend cannot be used on this machine (or was chosen too late)."""


@dataclass(frozen=True)
class Backend:
    """The chosen backend. ``cuda`` is the ``numba.cuda`` module, ``xp`` the array module
    for host-side array code (CuPy on a GPU when installed, NumPy otherwise)."""

    name: str  # "gpu" or "sim"
    cuda: ModuleType
    xp: ModuleType
    device_name: str

    @property
    def is_simulator(self) -> bool:
        return self.name == "sim"


_backend: Backend | None = None


def cuda_device_count() -> int:
    """How many CUDA devices the driver reports, asked through ``libcuda`` directly so that
    no CUDA library (and not ``numba.cuda``) is imported to find out. 0 when no driver."""
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            libcuda = ctypes.CDLL(lib)
            break
        except OSError:
            continue
    else:
        return 0
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def will_use_gpu() -> bool:
    """Whether ``get_backend()`` will choose the GPU, found out without importing
    ``numba.cuda`` or creating a CUDA context (for a process that only plans, like the
    server's frontend)."""
    return _decide(_requested()) == "gpu"


def _apply_numpy_shim() -> None:
    """numba-cuda 0.30.x uses ``np.row_stack``; NumPy 2.5 removed it (docs/design.md §5)."""
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # type: ignore[attr-defined]


def _requested() -> str:
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise BackendError(f"{BACKEND_ENV}={choice!r}: expected one of {', '.join(_CHOICES)}")
    return choice


def _decide(choice: str) -> str:
    if choice == "sim":
        return "sim"
    has_gpu = cuda_device_count() > 0
    if choice == "gpu" and not has_gpu:
        raise BackendError(
            f"{BACKEND_ENV}=gpu but no CUDA driver/device was found; "
            f"unset it (or set {BACKEND_ENV}=sim) to use Numba's CUDA simulator"
        )
    return "gpu" if has_gpu else "sim"


def _import_numba_cuda(name: str) -> ModuleType:
    want_sim = name == "sim"
    if "numba.cuda" in sys.modules:
        from numba import config

        if bool(config.ENABLE_CUDASIM) != want_sim:
            raise BackendError(
                "numba.cuda was imported before blink_edu chose its backend "
                f"(simulator={bool(config.ENABLE_CUDASIM)}, wanted {want_sim}); "
                "import blink_edu.backend first, or set NUMBA_ENABLE_CUDASIM yourself"
            )
        return sys.modules["numba.cuda"]
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if want_sim else "0"
    if "numba" in sys.modules:  # numba read its config already: make it read it again
        from numba.core import config

        config.reload_config()
    from numba import cuda

    return cuda


def _array_module(name: str) -> ModuleType:
    if name == "gpu":
        try:
            import cupy

            return cupy
        except ImportError:
            pass
    return np


def get_backend() -> Backend:
    """Choose (once) and return the backend. Safe to call many times."""
    global _backend
    if _backend is None:
        _apply_numpy_shim()
        name = _decide(_requested())
        cuda = _import_numba_cuda(name)
        device = "Numba CUDA simulator (CPU)"
        if name == "gpu":
            device = cuda.get_current_device().name
            device = device.decode() if isinstance(device, bytes) else str(device)
        _backend = Backend(name=name, cuda=cuda, xp=_array_module(name), device_name=device)
    return _backend


def describe() -> str:
    """One line for logs and startup banners."""
    b = get_backend()
    return f"backend={b.name} ({b.device_name}), arrays={b.xp.__name__}"


# --- what the simulator costs ---------------------------------------------------------------------
# Numba's CUDA simulator runs every CUDA thread as a Python thread, so a kernel executor there
# costs about this much per model parameter and per token it processes (prompt or output).
# Measured: `python -m blink_edu.generate --executor eager --max-tokens 5` on the bundled model
# (7.3 M parameters, a 6-token prompt: 10 tokens through the model) took 440 s on 2 CPU cores.
SIM_SECONDS_PER_PARAM_TOKEN = 6e-6
# Warn (once, up front) when a kernel executor will take longer than this per token.
SIM_WARN_SECONDS_PER_TOKEN = 1.0


def simulated_seconds_per_token(num_params: int) -> float:
    """The expected seconds per token of a kernel executor in the simulator (see above)."""
    return SIM_SECONDS_PER_PARAM_TOKEN * num_params


def warn_if_simulated(executor: str, num_params: int, reply_tokens: int = 80) -> None:
    """Warn (on the ``blink_edu.backend`` logger: stderr unless logging is set up otherwise),
    before it starts, when the kernel executor ``executor`` is going to run a model of
    ``num_params`` parameters in the simulator at more than a second per token — with the
    expected cost and what to run instead. Silent on a GPU and for small models."""
    if not get_backend().is_simulator:
        return
    per_token = simulated_seconds_per_token(num_params)
    if per_token < SIM_WARN_SECONDS_PER_TOKEN:
        return
    reply_min = per_token * reply_tokens / 60
    log.warning(
        "warning: no GPU here: the %s executor will run its CUDA kernels in Numba's CUDA "
        "simulator (every CUDA thread a Python thread). For this %.1f M-parameter model expect "
        "about %.0f s per token, prompt and output alike (a %d-token reply: ~%.0f min). On a CPU "
        "use the NumPy reference instead (--executor reference, or auto).",
        executor, num_params / 1e6, per_token, reply_tokens, reply_min)
