"""The hf rollout engine under LoRA (``model.lora``): it samples with the adapters it receives (``sync_adapter``)
exactly as the peft-wrapped training model would, a zero adapter is the base model, and the merged path
(``sync: merged``, plain weights) samples the same policy."""

from __future__ import annotations

import pytest
import torch

from rlzoo.config.schema import LoraConfig, TinyModelConfig
from rlzoo.engines import EngineContext, SamplingSettings
from rlzoo.engines.hf_rollout import HFRolloutEngine
from rlzoo.engines.lora import adapter, merged_weights, sends_adapters, wrap
from rlzoo.errors import RlzooError
from rlzoo.models import build_char_tokenizer, build_tiny_model, load_model, save_model

TOKENIZER = build_char_tokenizer("0123456789+=")
TARGETS = {
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen3_moe": ["q_proj", "v_proj", "o_proj", "experts.gate_up_proj", "experts.down_proj"],
}
PROMPTS = [TOKENIZER.encode(p) for p in ["1+2=", "12+34=", "7+7=", "3+45="]]
GREEDY = SamplingSettings(n=1, max_new_tokens=10, temperature=0)
SAMPLED = SamplingSettings(n=2, max_new_tokens=10, seed=3)


class Case:
    def __init__(self, architecture: str, model_dir):
        self.architecture, self.model_dir = architecture, model_dir
        self.lora = LoraConfig(rank=4, alpha=8, target_modules=TARGETS[architecture])

    def engine(self, sync: str | None = "auto", **params) -> HFRolloutEngine:
        engine = HFRolloutEngine(HFRolloutEngine.Params(**params))
        lora = None if sync is None else self.lora.model_copy(update={"sync": sync})
        adapters = sends_adapters(engine, lora, moe=self.architecture == "qwen3_moe")  # the run's rule
        engine.start(
            EngineContext(self.model_dir, seed=5, eos_token_id=1, pad_token_id=0, lora=lora, sends_adapters=adapters)
        )
        return engine

    def trained(self, seed: int):
        """The training engine's policy after some steps: peft-wrapped, every adapter weight random (B != 0)."""
        model = wrap(load_model(self.model_dir)[0], self.lora, seed=0)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        return model.eval()


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])
def case(request, tmp_path_factory):
    tiny = TinyModelConfig(
        architecture=request.param,
        hidden_size=32,
        intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    )
    model = build_tiny_model(tiny, TOKENIZER, seed=1)
    return Case(request.param, save_model(model, TOKENIZER, tmp_path_factory.mktemp(request.param) / "m"))


def flat(groups):
    return [g for group in groups for g in group]


@torch.no_grad()
def logp_gap(model, generations) -> float:
    """Largest per-token gap between the engine's log-probs and a full forward of ``model`` (temperature 1)."""
    worst = 0.0
    for g in generations:
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        worst = max(worst, (logp[len(g.prompt_ids) - 1 :] - torch.tensor(g.response_logprobs)).abs().max().item())
    return worst


def test_a_zero_adapter_is_the_base_model(case):
    base, wrapped = case.engine(sync=None), case.engine()
    assert wrapped.wraps_adapters and not base.wraps_adapters
    expected = flat(base.generate(PROMPTS, SAMPLED))
    zero = case.trained(seed=1)
    with torch.no_grad():
        for name, param in zero.named_parameters():
            if "lora_B" in name:
                param.zero_()
    for _ in range(2):  # before any sync (fresh adapters), then after syncing an adapter whose B is zero
        got = flat(wrapped.generate(PROMPTS, SAMPLED))
        assert [g.response_ids for g in got] == [g.response_ids for g in expected]
        assert [g.response_logprobs for g in got] == [g.response_logprobs for g in expected]
        wrapped.sync_adapter(adapter(zero, version=1))


def test_synced_adapters_sample_the_training_policy(case):
    engine = case.engine()
    for version, seed in enumerate((2, 3), start=1):  # a second sync replaces the first
        trained = case.trained(seed)
        engine.sync_adapter(adapter(trained, version))
        greedy = flat(engine.generate(PROMPTS, GREEDY))
        for prompt, g in zip(PROMPTS, greedy):
            ids = torch.tensor([prompt])
            out = trained.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=10,
                do_sample=False,
                eos_token_id=1,
                pad_token_id=0,
            )
            reference = out[0, len(prompt) :].tolist()
            assert g.response_ids == reference[: len(g.response_ids)]
        gap = max(logp_gap(trained, greedy), logp_gap(trained, flat(engine.generate(PROMPTS, SAMPLED))))
        print(f"\n[{case.architecture}] adapter v{version}: max |dlogp| vs peft = {gap:.1e}")
        assert gap < 1e-5
        assert logp_gap(case.trained(seed + 10), greedy) > 1e-2  # another adapter is another policy


def test_the_merged_path_samples_the_same_policy(case):
    trained = case.trained(seed=4)
    by_adapter, by_weights = case.engine(sync="adapter"), case.engine(sync="merged")
    assert not by_weights.wraps_adapters
    by_adapter.sync_adapter(adapter(trained, version=1))
    by_weights.sync_weights(merged_weights(trained))
    a, w = flat(by_adapter.generate(PROMPTS, GREEDY)), flat(by_weights.generate(PROMPTS, GREEDY))
    gap = max(
        (torch.tensor(x.response_logprobs[:n]) - torch.tensor(y.response_logprobs[:n])).abs().max().item()
        for x, y in zip(a, w)
        for n in [min(len(x.response_ids), len(y.response_ids))]
    )
    print(f"\n[{case.architecture}] merged vs adapter: max |dlogp| = {gap:.1e}")
    assert gap < 1e-5
    with pytest.raises(RlzooError, match="receives adapters"):
        by_adapter.sync_weights(merged_weights(trained))
    with pytest.raises(RlzooError, match="merged weights"):
        by_weights.sync_adapter(adapter(trained))


def test_routing_is_recorded_through_the_adapters(case):
    if case.architecture != "qwen3_moe":
        pytest.skip("routing needs a mixture-of-experts model")
    engine = case.engine(record_routing=True)
    engine.sync_adapter(adapter(case.trained(seed=5), version=1))
    for g in flat(engine.generate(PROMPTS, SAMPLED)):
        assert g.routing.shape[0] == len(g.prompt_ids) + len(g.response_ids) - 1


def test_vllm_takes_adapters_on_attention_and_mlp_projections_only(case):
    """Checked without vLLM: which targets the vLLM engine accepts, and that it is built for adapters only when the
    run sends them (else it receives the merged weights; integration_tests/test_vllm_adapters.py runs vLLM)."""
    from rlzoo.engines.vllm.lora import max_lora_rank
    from rlzoo.engines.vllm.rollout import VLLMRolloutEngine

    engine = VLLMRolloutEngine()
    assert engine.adapter_targets_supported(TARGETS["qwen3"], moe=False) is None
    assert engine.adapter_targets_supported(["self_attn.q_proj", "o_proj"], moe=True) is None
    assert "experts.down_proj" in engine.adapter_targets_supported(TARGETS["qwen3_moe"], moe=True)
    assert "lm_head" in engine.adapter_targets_supported(["q_proj", "lm_head"], moe=False)
    assert HFRolloutEngine().adapter_targets_supported(TARGETS["qwen3_moe"], moe=True) is None
    assert (max_lora_rank(4), max_lora_rank(8), max_lora_rank(9), max_lora_rank(513)) == (8, 8, 16, None)
    moe = case.architecture == "qwen3_moe"
    assert sends_adapters(engine, case.lora, moe) == (case.architecture == "qwen3")  # the MoE case targets experts
    assert not sends_adapters(engine, case.lora.model_copy(update={"sync": "merged"}), moe)
    assert not sends_adapters(engine, None, moe)
