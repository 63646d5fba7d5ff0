"""config.py resolves what two places once resolved differently: the longest request an engine
admits (``max_model_len``), refused when the model cannot reach it."""

from __future__ import annotations

import pytest

from blink_edu.config import EngineConfig
from blink_edu.model.micro import micro_config


def test_max_model_len_defaults_to_the_models_and_is_refused_beyond_it(rng):
    context = int(rng.integers(16, 256))
    model = micro_config(max_position_embeddings=context)
    assert EngineConfig().max_model_len_for(model) == context
    shorter = int(rng.integers(1, context))
    assert EngineConfig(max_model_len=shorter).max_model_len_for(model) == shorter
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        EngineConfig(max_model_len=context + 1).max_model_len_for(model)


def test_micro_config_refuses_an_unknown_field():
    with pytest.raises(ValueError, match="unknown field"):
        micro_config(hidden=32)
