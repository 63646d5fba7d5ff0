"""Loading checkpoints: dtypes on disk, sharded indexes, and clear errors for broken folders."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from blink_edu.config import ConfigError, ModelConfig
from blink_edu.model.weights import WeightsError, load_weights
from tiny_models import make_checkpoint


@pytest.fixture
def llama_folder(tmp_path, rng):
    folder = tmp_path / "llama"
    model = make_checkpoint(folder, "llama", int(rng.integers(2**31)))
    return folder, model


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_on_disk_loads_exactly(tmp_path, rng, dtype):
    folder = tmp_path / dtype
    model = make_checkpoint(folder, "qwen2", int(rng.integers(2**31)), dtype=dtype)
    weights = load_weights(folder)
    expected = model.model.layers[1].mlp.down_proj.weight.detach().float().numpy()
    assert weights.layers[1].w_down.dtype == np.float32
    np.testing.assert_array_equal(weights.layers[1].w_down, expected)
    assert ModelConfig.from_folder(folder).torch_dtype == str(dtype)
    assert weights.embed.shape == (model.config.vocab_size, model.config.hidden_size)


def test_sharded_checkpoint_equals_single_file(tmp_path, rng):
    seed = int(rng.integers(2**31))
    make_checkpoint(tmp_path / "single", "llama", seed)
    make_checkpoint(tmp_path / "sharded", "llama", seed, max_shard_size="50KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a, b = load_weights(tmp_path / "single"), load_weights(tmp_path / "sharded")
    for la, lb in zip(a.layers, b.layers):
        np.testing.assert_array_equal(la.wq, lb.wq)
    np.testing.assert_array_equal(a.lm_head, b.lm_head)
    assert a.lm_head is a.embed  # tied


def test_missing_tensor_names_file_and_tensor(llama_folder):
    folder, _ = llama_folder
    path = folder / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(WeightsError, match=r"model\.safetensors.*missing.*layers\.1\.mlp\.up_proj"):
        load_weights(folder)


def test_wrong_shape_names_tensor_and_shapes(llama_folder):
    folder, _ = llama_folder
    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors["model.norm.weight"] = np.ones(7, dtype=np.float32)
    save_file(tensors, path)
    with pytest.raises(WeightsError, match=r"model\.norm\.weight.*\(7,\).*expected \(64,\)"):
        load_weights(folder)


def test_truncated_file_is_reported(llama_folder):
    folder, _ = llama_folder
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match=r"model\.safetensors.*truncated or corrupt"):
        load_weights(folder)


def test_missing_shard_named_by_index(tmp_path, rng):
    make_checkpoint(tmp_path, "llama", int(rng.integers(2**31)), max_shard_size="50KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / victim).unlink()
    with pytest.raises(WeightsError, match=f"{victim}.*not found"):
        load_weights(tmp_path)


def test_no_weights_at_all(llama_folder):
    folder, _ = llama_folder
    (folder / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match="no model.safetensors"):
        load_weights(folder)


@pytest.mark.parametrize("patch,message", [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "unsupported architecture GPT2LMHeadModel"),
    ({"hidden_act": "gelu"}, "unsupported hidden_act='gelu'"),
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
    ({"sliding_window": 64, "use_sliding_window": True}, "sliding_window=64"),
    ({"num_key_value_heads": 3}, "not a multiple"),
])
def test_unsupported_config_is_named(llama_folder, patch, message):
    folder, _ = llama_folder
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw.update(patch)
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=f"config.json.*{message}".replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ModelConfig.from_folder(folder)


def test_missing_config_field_and_bad_json(tmp_path, llama_folder):
    folder, _ = llama_folder
    raw = json.loads((folder / "config.json").read_text())
    del raw["hidden_size"]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="missing required field 'hidden_size'"):
        ModelConfig.from_folder(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_folder(folder)
    shutil.rmtree(folder)
    with pytest.raises(ConfigError, match="no config.json"):
        ModelConfig.from_folder(folder)


def test_legacy_rope_theta_field_is_read():
    raw = dict(model_type="llama", vocab_size=10, hidden_size=8, intermediate_size=16,
               num_hidden_layers=1, num_attention_heads=2, rope_theta=1234.0,
               rope_scaling={"type": "linear", "factor": 2.0})
    cfg = ModelConfig.from_dict(raw)
    assert cfg.rope_theta == 1234.0 and cfg.rope_scaling.rope_type == "linear"
    assert cfg.rope_scaling.factor == 2.0
