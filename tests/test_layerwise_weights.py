"""layerwise_weights() yields exactly checkpoint_weights(): the same names, values and order, unit by unit.

On plain (not partitioned) models DeepSpeed's GatheredParameters is a no-op, so this checks the grouping, the order
and the tied-weight handling quickly; the ZeRO-3 gather itself (1 and 2 processes, and its memory bound) is checked
in integration_tests/test_deepspeed_layerwise.py.
"""

from __future__ import annotations

import pytest
import torch

from rlzoo.config.schema import TinyModelConfig
from rlzoo.models import build_char_tokenizer, build_tiny_model
from rlzoo.models.export import checkpoint_weights

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")

from rlzoo.engines.deepspeed.layerwise import largest_unit, layerwise_weights, unit_of, weight_units  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=12, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer("0123456789+-= ")


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(5)  # every tensor distinct from its init: a mixed-up name cannot pass
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def _tied(tokenizer) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from rlzoo.models.tiny import tiny_config_for_vocab

    config = tiny_config_for_vocab(TinyModelConfig(architecture="qwen3", **TINY), len(tokenizer))
    config.tie_word_embeddings = True
    model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def _assert_identical(model: torch.nn.Module) -> None:
    whole = [(name, tensor.clone()) for name, tensor in checkpoint_weights(model)]
    layerwise = list(layerwise_weights(model))
    assert [n for n, _ in layerwise] == [n for n, _ in whole]  # same names, same order
    for (name, a), (_, b) in zip(layerwise, whole, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("architecture", ["qwen3", "qwen3_moe"])
def test_layerwise_equals_the_whole_model(architecture, tokenizer):
    # 12 layers: "model.layers.10" sorts after "model.layers.9" in the emitted (natural) order, not as text
    model = _perturbed(build_tiny_model(TinyModelConfig(architecture=architecture, **TINY), tokenizer, seed=0))
    _assert_identical(model)


def test_tied_output_layer_is_sent_once_as_the_whole_model_sends_it(tokenizer):
    model = _perturbed(_tied(tokenizer))
    _assert_identical(model)
    names = [n for n, _ in layerwise_weights(model)]
    assert "lm_head.weight" not in names and names.count("model.embed_tokens.weight") == 1


def test_units_are_decoder_layers_and_single_tensors(tokenizer):
    model = build_tiny_model(TinyModelConfig(architecture="qwen3_moe", **TINY), tokenizer, seed=0)
    units = weight_units(model, model.state_dict(keep_vars=True))
    assert unit_of("model.layers.3.mlp.experts.gate_up_proj") == "model.layers.3"
    assert unit_of("model.norm.weight") == "model.norm.weight"
    assert len(units) == TINY["num_hidden_layers"] + 3  # the layers, embeddings, final norm, output layer
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert largest_unit(model) == max(layer, model.lm_head.weight.numel())
    assert largest_unit(model) < sum(p.numel() for p in model.parameters()) / 5
