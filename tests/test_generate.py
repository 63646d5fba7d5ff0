"""``python -m blink_edu.generate``: its statistics line, its --help, and the warning a kernel
executor gives before it runs a large model in Numba's CUDA simulator."""

from __future__ import annotations

import logging

import pytest

from blink_edu import backend
from blink_edu.config import EngineConfig
from blink_edu.engine.llm_engine import make_executor
from blink_edu.generate import parse_args, timing_line
from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.weights import load_weights


@pytest.mark.parametrize("count,total,first,then", [
    (5, 440.0, 100.0, "then 85 s per token"),  # the simulator: no "then 0 tokens/s"
    (80, 1.79, 0.2, "then 49.7 tokens/s"),
    (3, 2.0, 0.0, "then 1 tokens/s"),
    (11, 3.5, 1.0, "then 4 tokens/s"),
])
def test_the_rate_is_never_rounded_to_zero(count, total, first, then):
    assert timing_line(count, total, first).endswith(then)


def test_one_token_has_no_rate():
    assert timing_line(1, 2.0, 2.0) == "1 tokens in 2.00 s; first token 2000 ms"


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 80)", "(default: 0.7)", "(default: 0.95)", "(default: auto)",
                    "(default: Once upon a time)"):
        assert default in text


@pytest.fixture(scope="module")
def bundled():
    return load_weights(resolve_model_dir(None))


def test_a_kernel_executor_warns_before_running_a_large_model_in_the_simulator(bundled, caplog):
    if not backend.get_backend().is_simulator:
        pytest.skip("on a GPU the kernels are fast: nothing to warn about")
    config = EngineConfig(executor="eager", num_kv_blocks=4, block_size=16, max_num_seqs=1,
                          max_num_batched_tokens=16, max_model_len=64)
    with caplog.at_level(logging.WARNING, logger="blink_edu.backend"):
        make_executor("eager", bundled, config)
    [text] = [r.getMessage() for r in caplog.records]
    per_token = backend.simulated_seconds_per_token(bundled.config.num_parameters())
    assert 20 < per_token < 120, "the bundled model: tens of seconds a token in the simulator"
    assert f"about {per_token:.0f} s per token" in text and "7.3 M-parameter" in text
    assert "--executor reference" in text


def test_the_reference_executor_and_small_models_do_not_warn(bundled, caplog):
    config = EngineConfig(executor="reference", num_kv_blocks=4, block_size=16)
    with caplog.at_level(logging.WARNING, logger="blink_edu.backend"):
        make_executor("reference", bundled, config)
        backend.warn_if_simulated("eager", 50_000)  # a lab's micro model: well under a second
    assert not caplog.records
