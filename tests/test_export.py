"""checkpoint_weights() yields exactly what save_pretrained writes: the names and values weight sync sends."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.config.schema import TinyModelConfig
from rlzoo.models import build_char_tokenizer, build_tiny_model, load_model, save_model
from rlzoo.models.export import _fallback, checkpoint_weights

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer("0123456789+-= ")


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    # make every parameter distinct from its init so a mixed-up name or slice cannot pass by accident
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def _assert_same_as_file(named, path) -> None:
    saved = load_file(str(path))
    ours = dict(named)
    assert set(ours) == set(saved), (sorted(set(ours) ^ set(saved)))[:6]
    for name, tensor in saved.items():
        assert ours[name].shape == tensor.shape, name
        assert ours[name].dtype == tensor.dtype, name
        assert torch.equal(ours[name].contiguous(), tensor), name


@pytest.mark.parametrize("architecture", ["qwen3", "qwen3_moe"])
def test_checkpoint_weights_equal_save_pretrained(tmp_path, tokenizer, architecture):
    model = _perturbed(build_tiny_model(TinyModelConfig(architecture=architecture, **TINY), tokenizer, seed=0))
    save_model(model, tokenizer, tmp_path)
    _assert_same_as_file(checkpoint_weights(model), tmp_path / "model.safetensors")
    if architecture == "qwen3_moe":
        names = {name for name, _ in checkpoint_weights(model)}
        assert "model.layers.0.mlp.experts.7.gate_proj.weight" in names
        assert "model.layers.1.mlp.experts.0.down_proj.weight" in names
        assert not any(name.endswith(("gate_up_proj", "experts.down_proj")) for name in names)


def test_checkpoint_weights_of_a_loaded_model(tmp_path, tokenizer):
    # a model from from_pretrained carries its own conversion record; the result must be the same
    model = _perturbed(build_tiny_model(TinyModelConfig(architecture="qwen3_moe", **TINY), tokenizer, seed=1))
    save_model(model, tokenizer, tmp_path / "a")
    loaded, _ = load_model(tmp_path / "a")
    _assert_same_as_file(checkpoint_weights(loaded), tmp_path / "a" / "model.safetensors")


def test_tied_embeddings_written_once(tmp_path, tokenizer):
    model = build_tiny_model(TinyModelConfig(architecture="qwen3", **TINY), tokenizer, seed=0)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    save_model(model, tokenizer, tmp_path)
    names = [name for name, _ in checkpoint_weights(model)]
    assert len(names) == len(set(names))
    _assert_same_as_file(checkpoint_weights(model), tmp_path / "model.safetensors")


def test_fallback_split_matches(tmp_path, tokenizer):
    model = _perturbed(build_tiny_model(TinyModelConfig(architecture="qwen3_moe", **TINY), tokenizer, seed=0))
    save_model(model, tokenizer, tmp_path)
    _assert_same_as_file(_fallback(model, model.state_dict()), tmp_path / "model.safetensors")


def test_round_trip_into_a_fresh_model(tokenizer):
    from rlzoo.models.weights import load_checkpoint_weights

    cfg = TinyModelConfig(architecture="qwen3_moe", **TINY)
    source = _perturbed(build_tiny_model(cfg, tokenizer, seed=0))
    target = build_tiny_model(cfg, tokenizer, seed=1)
    load_checkpoint_weights(target, checkpoint_weights(source))
    for (name, a), (_, b) in zip(source.named_parameters(), target.named_parameters()):
        assert torch.equal(a, b), name
