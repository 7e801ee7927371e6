"""The direct weight-sync plan on a module tree shaped like vLLM's Qwen3-MoE (no vLLM needed).

``integration_tests/test_vllm_engine.py`` runs the same code inside real vLLM and checks it against the reload path
bit for bit; here each mapping rule and each refusal is checked on its own.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlzoo.engines.vllm.direct_sync import DirectSyncUnsupported, copy_weights

H, I, E, V, PADDED_V = 4, 6, 3, 5, 8  # noqa: E741 - I: the experts' intermediate size, as the kernels name it


class PackedLinear(nn.Module):
    """A CPU linear as vLLM leaves it: the weight emptied, the values only in a kernel handle."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self.output_size, self.input_size = rows, cols  # vLLM's LinearBase sizes
        self.quant_method = self
        self.handle = None
        self.cpu_linear = lambda x, weight, bias: x @ self.handle.T

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.handle = layer.weight.detach().clone()
        layer.weight = nn.Parameter(torch.empty(0), requires_grad=False)


class KeptEmbedding(nn.Module):
    """An embedding as vLLM keeps it on CPU: the weight stays (vocab rows padded), plus a packed handle."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(PADDED_V, H), requires_grad=False)
        self.quant_method = self
        self.handle = None
        self.cpu_linear = lambda x, weight, bias: x @ self.handle.T

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.handle = layer.weight.detach().clone()


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w13_weight = nn.Parameter(torch.zeros(E, 2 * I, H), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.zeros(E, H, I), requires_grad=False)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = PackedLinear(3 * H, H)
        self.mlp = nn.Module()
        self.mlp.gate = PackedLinear(E, H)
        self.mlp.experts = Experts()
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.zeros(H), requires_grad=False)


class FakeVLLMModel(nn.Module):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = KeptEmbedding()
        self.model.layers = nn.ModuleList([Layer()])
        self.lm_head = self.model.embed_tokens  # tied, as vLLM does with tie_word_embeddings


def checkpoint() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    weights = {
        "model.embed_tokens.weight": rand(V, H),
        "model.layers.0.self_attn.q_proj.weight": rand(H, H),
        "model.layers.0.self_attn.k_proj.weight": rand(H, H),
        "model.layers.0.self_attn.v_proj.weight": rand(H, H),
        "model.layers.0.mlp.gate.weight": rand(E, H),
        "model.layers.0.input_layernorm.weight": rand(H),
    }
    for e in range(E):
        weights[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] = rand(I, H)
        weights[f"model.layers.0.mlp.experts.{e}.up_proj.weight"] = rand(I, H)
        weights[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] = rand(H, I)
    return weights


def test_every_fused_tensor_is_assembled_from_its_checkpoint_pieces():
    model, weights = FakeVLLMModel(), checkpoint()
    assert copy_weights(model, weights.items()) == 6  # embed, qkv, router, norm, w13, w2
    layer = model.model.layers[0]
    qkv = torch.cat([weights[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(layer.self_attn.qkv_proj.handle, qkv)  # re-dispatched from the new weight
    assert layer.self_attn.qkv_proj.weight.numel() == 0  # and emptied again, as vLLM's dispatch leaves it
    assert torch.equal(layer.mlp.gate.handle, weights["model.layers.0.mlp.gate.weight"])
    for e in range(E):
        gate_up = torch.cat([weights[f"model.layers.0.mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up")])
        assert torch.equal(layer.mlp.experts.w13_weight[e], gate_up)
        assert torch.equal(layer.mlp.experts.w2_weight[e], weights[f"model.layers.0.mlp.experts.{e}.down_proj.weight"])
    assert torch.equal(layer.input_layernorm.weight, weights["model.layers.0.input_layernorm.weight"])
    embed = model.model.embed_tokens
    assert torch.equal(embed.weight[:V], weights["model.embed_tokens.weight"])
    assert torch.equal(embed.weight[V:], torch.zeros(PADDED_V - V, H))  # vLLM's padding rows untouched
    assert torch.equal(embed.handle, embed.weight)  # the (tied) LM head's handle follows the new weight


def test_a_second_sync_replaces_the_first():
    model, first = FakeVLLMModel(), checkpoint()
    copy_weights(model, first.items())
    second = {name: t + 1 for name, t in first.items()}
    copy_weights(model, second.items())
    assert torch.equal(model.model.layers[0].mlp.gate.handle, second["model.layers.0.mlp.gate.weight"])
    assert torch.equal(
        model.model.layers[0].mlp.experts.w2_weight[2], second["model.layers.0.mlp.experts.2.down_proj.weight"]
    )


def _unchanged(model: FakeVLLMModel) -> bool:
    layer = model.model.layers[0]
    return (
        layer.self_attn.qkv_proj.handle is None
        and not layer.mlp.experts.w13_weight.any()
        and not model.model.embed_tokens.weight.any()
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda w: w.update({"model.layers.0.mlp.shared_expert.weight": torch.zeros(H)}), "no vLLM parameter"),
        (lambda w: w.pop("model.layers.0.input_layernorm.weight"), "no new values"),
        (lambda w: w.pop("model.layers.0.self_attn.k_proj.weight"), r"gives \(8, 4\), vLLM holds \(12, 4\)"),
        (lambda w: w.pop("model.layers.0.mlp.experts.1.up_proj.weight"), "do not fit together"),
        (lambda w: w.pop("model.layers.0.mlp.experts.2.down_proj.weight"), "2 of 3 experts"),
        (lambda w: w.update({"model.layers.0.input_layernorm.weight": torch.zeros(H + 1)}), "checkpoint gives"),
    ],
    ids=["unknown-name", "missing-norm", "missing-shard", "missing-expert-shard", "missing-expert", "wrong-shape"],
)
def test_weights_that_do_not_map_are_refused_before_anything_is_written(change, message):
    model, weights = FakeVLLMModel(), checkpoint()
    change(weights)
    with pytest.raises(DirectSyncUnsupported, match=message or ""):
        copy_weights(model, weights.items())
    assert _unchanged(model)


class FakeLLM:
    """Stands in for ``vllm.LLM``: the direct path refuses, the reload path accepts."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def collective_rpc(self, method: str, kwargs: dict) -> list[dict]:
        self.calls.append(method)
        if method == "rlzoo_copy_weights":
            raise DirectSyncUnsupported("no vLLM parameter for checkpoint weight 'x'")
        return [{"repacked_moe_layers": 0}]

    def reset_prefix_cache(self) -> None:
        pass


def _engine(weight_sync: str):
    from rlzoo.engines import EngineContext
    from rlzoo.engines.vllm.rollout import VLLMRolloutEngine

    engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(weight_sync=weight_sync))
    engine.llm, engine._direct_sync = FakeLLM(), True  # as start() leaves it on CPU
    engine.context = EngineContext(model_dir=".", dtype="float32", seed=0, eos_token_id=0, pad_token_id=0)
    return engine


def test_auto_falls_back_to_reload_for_good_when_direct_does_not_fit():
    engine = _engine("auto")
    engine.sync_weights([("x", torch.zeros(1))])
    engine.sync_weights([("x", torch.zeros(1))])
    assert engine.llm.calls == ["rlzoo_copy_weights", "rlzoo_load_weights", "rlzoo_load_weights"]


def test_direct_asked_for_explicitly_fails_with_the_field_named():
    from rlzoo.errors import RlzooError

    engine = _engine("direct")
    with pytest.raises(RlzooError, match="rollout.engine.weight_sync 'direct': no vLLM parameter"):
        engine.sync_weights([("x", torch.zeros(1))])
