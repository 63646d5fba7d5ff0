"""Shared fixtures: fresh random inputs every run (the seed is printed so a failure can be
replayed with BLINK_EDU_TEST_SEED=...), and tiny Hugging Face checkpoints written with
``save_pretrained`` so that the parity tests compare against real ``transformers`` models."""

from __future__ import annotations

import os
import secrets
import sys
import threading

import numpy as np
import pytest
from tiny_models import ARCHS, make_checkpoint

# Numba's CUDA simulator runs every CUDA thread of a block as a Python thread, and one more thread
# polls them in a busy loop to release each __syncthreads() barrier. At Python's default switch
# interval (5 ms) that poller may keep the GIL for a whole interval while the CUDA threads it is
# waiting for stand still, so every barrier costs milliseconds. Handing the GIL over every 0.5 ms
# runs the simulator's kernels about twice as fast; what a correctly synchronised kernel computes
# does not depend on it.
SIMULATOR_SWITCH_INTERVAL_S = 0.0005


def pytest_configure(config):
    import blink_edu.backend  # chooses the backend before numba.cuda is imported

    if blink_edu.backend.get_backend().is_simulator:
        make_simulated_shared_memory_thread_safe()
        sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)


def make_simulated_shared_memory_thread_safe():
    """The simulator hands out a block's ``cuda.shared.array`` with an unlocked check-then-create
    (``FakeCUDAShared.array``, one array per source line): two threads that both find it missing
    each make their own, and what one thread writes never reaches the other. At 5 ms a thread is
    seldom interrupted in between; at 0.5 ms some runs of the persistent kernel and of the
    tensor-core tile read garbage. The same method with the check and the creation under a lock
    gives every thread of the block the same array, as on a GPU."""
    from numba.cuda.simulator import kernelapi

    unlocked = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype):
        if shape == 0:  # dynamic shared memory: one buffer, nothing to create
            return unlocked(self, shape, dtype)
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno)  # the allocation's source line
        with lock:
            if site not in self._allocations:
                self._allocations[site] = np.empty(shape, numpy_dtype(dtype))
            return self._allocations[site]

    kernelapi.FakeCUDAShared.array = array


def numpy_dtype(dtype):
    from numba import types
    from numba.np import numpy_support

    return numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype


@pytest.fixture
def rng(request) -> np.random.Generator:
    seed = int(os.environ.get("BLINK_EDU_TEST_SEED", secrets.randbits(32)))
    print(f"[{request.node.name}] BLINK_EDU_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """{arch: (folder, torch model in float64)} for every tiny architecture, made once a session."""
    seed = int(os.environ.get("BLINK_EDU_TEST_SEED", secrets.randbits(32)))
    print(f"[checkpoints] BLINK_EDU_TEST_SEED={seed}")
    made = {}
    for i, arch in enumerate(ARCHS):
        folder = tmp_path_factory.mktemp(arch)
        model = make_checkpoint(folder, arch, seed + i)
        made[arch] = (folder, model.double())
    return made
