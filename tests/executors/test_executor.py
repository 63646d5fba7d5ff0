"""Every executor class has what ``executors/protocol.py`` declares: the host-driven ones are
``Executor``s (what ``LLMEngine`` and the benchmarks call), the persistent kernel is a
``RingExecutor``; and nothing that lacks a member passes for one."""

from __future__ import annotations

import inspect
import typing

import pytest

from blink_edu.backend import get_backend
from blink_edu.bench.replay import BatchRecorder
from blink_edu.config import EngineConfig
from blink_edu.executors.protocol import Executor, RingExecutor
from blink_edu.executors.kernel_executor import EagerExecutor, GraphExecutor
from blink_edu.engine.llm_engine import make_executor
from blink_edu.executors.persistent import PersistentExecutor
from blink_edu.executors.reference_executor import ReferenceExecutor
from blink_edu.model.micro import micro_weights
from blink_edu.ring import Ring, RingLayout

CONFIG = EngineConfig(block_size=4, num_kv_blocks=8, max_num_seqs=2, max_num_batched_tokens=8)


def members(protocol) -> set[str]:
    """The names a protocol declares (attributes and methods)."""
    return typing.get_protocol_members(protocol) if hasattr(typing, "get_protocol_members") \
        else {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)


@pytest.fixture(scope="module")
def weights():
    return micro_weights(seed=11)


@pytest.mark.parametrize("name", ["reference", "eager"])
def test_host_driven_executors_are_executors(weights, name):
    executor = make_executor(name, weights, CONFIG)
    assert isinstance(executor, Executor) and not isinstance(executor, RingExecutor)
    assert executor.name == name and executor.block_size == CONFIG.block_size
    assert isinstance(BatchRecorder(executor), Executor)  # the benchmarks' wrapper is one too
    assert (executor.buckets is None) == (name == "reference")


def test_the_graph_executor_keeps_the_eager_members():
    # it is built only on a GPU (CUDA graphs); its members are the eager executor's
    assert issubclass(GraphExecutor, EagerExecutor)
    for name in ("step", "compute_stream"):
        assert name in vars(GraphExecutor) or name in vars(EagerExecutor)
    assert inspect.signature(GraphExecutor.step) == inspect.signature(EagerExecutor.step)


@pytest.mark.gpu
def test_the_graph_executor_is_an_executor_on_a_gpu(weights):
    executor = make_executor("graph", weights, CONFIG)
    assert isinstance(executor, Executor) and executor.buckets is not None


def test_the_persistent_executor_is_a_ring_executor(weights):
    layout = RingLayout(num_slots=4, max_prompt_tokens=8, max_output_tokens=4)
    executor = PersistentExecutor(weights, CONFIG, Ring(bytearray(layout.nbytes), layout))
    assert isinstance(executor, RingExecutor) and not isinstance(executor, Executor)
    assert executor.max_model_len == weights.config.max_position_embeddings
    assert executor.num_kv_blocks == CONFIG.num_kv_blocks


@pytest.mark.parametrize("missing", sorted(members(Executor)))
def test_an_object_missing_a_member_is_not_an_executor(weights, missing):
    real = ReferenceExecutor(weights, CONFIG.num_kv_blocks, CONFIG.block_size)
    fake = type("Partial", (), {name: getattr(real, name) for name in members(Executor)
                                if name != missing})()
    assert not isinstance(fake, Executor)


def test_the_simulator_or_a_gpu_decides_what_auto_is():
    from blink_edu.config import resolve_executor

    simulator = get_backend().is_simulator
    assert resolve_executor("auto") == ("reference" if simulator else "graph")
    assert resolve_executor("auto", serves_ring=True) == ("reference" if simulator
                                                          else "persistent")
    assert resolve_executor("auto", "lvf", serves_ring=True) == ("reference" if simulator
                                                                 else "graph")
    assert resolve_executor("eager", serves_ring=True) == "eager"
