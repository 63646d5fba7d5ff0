"""Shared fixtures: fresh random inputs every run (the seed is printed so a failure can be
replayed with BLINK_EDU_TEST_SEED=...), and tiny Hugging Face checkpoints written with
``save_pretrained`` so that the parity tests compare against real ``transformers`` models."""

from __future__ import annotations

import os
import secrets
import sys

import numpy as np
import pytest
from tiny_models import ARCHS, make_checkpoint

# Numba's CUDA simulator runs every CUDA thread of a block as a Python thread, and one more thread
# polls them in a busy loop to release each __syncthreads() barrier. At Python's default switch
# interval (5 ms) that poller may keep the GIL for a whole interval while the CUDA threads it is
# waiting for stand still, so every barrier costs milliseconds. Handing the GIL over every 0.5 ms
# runs the simulator's kernels about twice as fast; what a correctly synchronised kernel computes
# does not depend on it. (tests/test_notebooks.py starts the chapters' kernels with it too.)
SIMULATOR_SWITCH_INTERVAL_S = 0.0005
PYTHON_SWITCH_INTERVAL_S = sys.getswitchinterval()  # Python's own, 5 ms


def pytest_configure(config):
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)


@pytest.fixture
def python_switch_interval():
    """Python's default switch interval for one test. The persistent scheduler kernel's tests use
    it: at 0.5 ms its simulated threads interleave finely enough that some runs of
    test_persistent.py fail (a scheduler-state race inside the kernel, reported, not yet fixed);
    at 5 ms they do not, as before."""
    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL_S)
    yield
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)


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
