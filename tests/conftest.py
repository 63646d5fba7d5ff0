"""Shared fixtures: fresh random inputs every run (the seed is printed so a failure can be
replayed with BLINK_EDU_TEST_SEED=...), and tiny Hugging Face checkpoints written with
``save_pretrained`` so that the parity tests compare against real ``transformers`` models."""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest
from tiny_models import ARCHS, make_checkpoint


def pytest_configure(config):
    import blink_edu.backend  # chooses the backend (and tunes the simulator) before numba.cuda

    blink_edu.backend.get_backend()


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
