"""Partial rollouts (``rollout.partial: continue|restart`` with ``rollout.max_staleness``): the hf engine stops a
generation when newer weights are published, loads them, and continues the unfinished responses from their prefix
or samples them again; each token records the version that sampled it.

- the engine alone, with a scripted update after a few tokens: the tokens before it are the uninterrupted
  generation's (same seed, same weights), the versions say where the update fell, a continued response's log-probs
  are its tokens' under the weights that sampled them, and a restarted response is the new weights' alone;
- the producer thread with a slowed engine, so that the trainer publishes while a batch is sampled: every token's
  staleness stays within k and the batch metrics say how many responses were interrupted;
- MoE routing (R3): a continued response's routing is, at every position, the experts of the weights that ran it
  first: the old weights' up to the update, the new weights' from there (a forward of each, with moved routers);
- multi-turn episodes: each policy token keeps its version through the turns' stitching, and the metrics count
  policy tokens only;
- the preflight: an engine that does not declare ``updates_in_flight`` is refused.
  (vLLM's partial rollouts: integration_tests/test_vllm_partial.py.)
"""

from __future__ import annotations

import time
import types
from types import SimpleNamespace

import pytest
import torch
from schedule_testlib import start_rig
from test_episode_routing import ALPHABET, MAX_TOKENS, MAX_TURNS, OBSERVATION, NumberedEngine, ScriptedEnvironment

import rlzoo
from rlzoo.config.resolution import build_config
from rlzoo.config.schema import TinyModelConfig
from rlzoo.engines import EngineContext, SamplingSettings
from rlzoo.engines.hf_rollout import HFRolloutEngine
from rlzoo.errors import ConfigError
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.moe import find_routers, record_routing
from rlzoo.preflight.checks import preflight
from rlzoo.registry import Registry, default_registry
from rlzoo.rl.async_rollouts import AsyncRollouts, token_versions
from rlzoo.rl.learner import Learner

MAX_NEW = 8
AFTER = 3  # the update is published once this many tokens are sampled


class ScriptedUpdate:
    """One update, published after ``AFTER`` sampled tokens; ``scale`` changes the weights it loads (1: none)."""

    def __init__(self, engine: HFRolloutEngine, mode: str, scale: float) -> None:
        self.engine, self.mode, self.scale = engine, mode, scale
        self.tokens, self.held = 0, 0

    def pending(self) -> bool:
        self.tokens += 1
        return self.held == 0 and self.tokens >= AFTER

    def load(self) -> int:
        with torch.no_grad():
            self.engine.model.get_output_embeddings().weight.mul_(self.scale)
        self.held = 1
        return self.held

    def version(self) -> int:
        return self.held


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = build_char_tokenizer("0123456789+=")
    folder = tmp_path_factory.mktemp("partial") / "m"
    tiny = TinyModelConfig(architecture="qwen3", hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    torch.manual_seed(0)
    save_model(build_tiny_model(tiny, tokenizer), tokenizer, folder)
    return folder, tokenizer


def engine(model_dir) -> HFRolloutEngine:
    folder, tokenizer = model_dir
    hf = HFRolloutEngine()
    hf.start(EngineContext(folder, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    return hf


PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
SAMPLING = SamplingSettings(n=4, max_new_tokens=MAX_NEW, temperature=1.0, seed=7)


def flat(groups):
    return [g for group in groups for g in group]


def teacher_forced(hf: HFRolloutEngine, generation) -> torch.Tensor:
    ids = torch.tensor([generation.prompt_ids + generation.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(hf.model(input_ids=ids).logits.float(), dim=-1)[0]
    start = len(generation.prompt_ids)
    return logp[start - 1 : -1].gather(1, torch.tensor(generation.response_ids).unsqueeze(1)).squeeze(1)


def test_continue_keeps_the_prefix_and_each_token_has_its_versions_log_prob(model_dir):
    plain = flat(engine(model_dir).generate(PROMPTS, SAMPLING))
    hf = engine(model_dir)
    hf.follow_updates(ScriptedUpdate(hf, "continue", scale=1.0))  # an update that changes nothing: exact log-probs
    followed = flat(hf.generate(PROMPTS, SAMPLING))
    continued = 0
    for before, after in zip(plain, followed, strict=True):
        assert after.response_ids[:AFTER] == before.response_ids[:AFTER]  # sampled before the update: the same
        assert len(after.response_ids) == len(after.response_logprobs) == len(after.versions) <= MAX_NEW
        cut = min(AFTER, len(after.response_ids))
        assert after.versions == [0] * cut + [1] * (len(after.response_ids) - cut)
        continued += len(after.response_ids) > AFTER
        assert torch.allclose(torch.tensor(after.response_logprobs), teacher_forced(hf, after), atol=1e-5)
    assert continued > 0


def test_after_a_real_update_the_continuation_is_sampled_by_the_new_weights(model_dir):
    hf = engine(model_dir)
    hf.follow_updates(ScriptedUpdate(hf, "continue", scale=3.0))
    followed = [g for g in flat(hf.generate(PROMPTS, SAMPLING)) if len(g.response_ids) > AFTER]
    assert followed
    for generation in followed:  # the new weights' log-probs from the update on
        new = teacher_forced(hf, generation)[AFTER:]
        assert torch.allclose(torch.tensor(generation.response_logprobs[AFTER:]), new, atol=1e-5)


def test_restart_samples_the_unfinished_responses_again_by_the_new_weights(model_dir):
    hf = engine(model_dir)
    hf.follow_updates(ScriptedUpdate(hf, "restart", scale=1.0))
    followed = flat(hf.generate(PROMPTS, SAMPLING))
    restarted = [g for g in followed if g.versions and g.versions[0] == 1]
    assert restarted and all(set(g.versions) == {1} for g in restarted)
    for g in followed:  # a response either ended before the update (version 0 alone) or was sampled again
        assert set(g.versions) in ({0}, {1}) and len(g.response_ids) <= MAX_NEW
        if set(g.versions) == {0}:
            assert g.finished and len(g.response_ids) <= AFTER


class MovedRouters(ScriptedUpdate):
    """One update after ``AFTER`` tokens that moves every MoE router's weights (so that some positions route
    differently)."""

    def load(self) -> int:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for router in find_routers(self.engine.model):
                router.module.weight.add_(0.5 * torch.randn(router.module.weight.shape, generator=generator))
        self.held = 1
        return self.held


@torch.no_grad()
def forward_experts(model, generation) -> torch.Tensor:
    """``[positions, layers, top_k]`` sorted experts of a forward over the sequence (its last token not needed)."""
    with record_routing(model) as routing:
        model(input_ids=torch.tensor([generation.prompt_ids + generation.response_ids]))
    return routing.indices[0, :-1].long().sort(dim=-1).values


def test_a_continued_responses_routing_is_each_positions_own_weights(tmp_path):
    import copy

    tokenizer = build_char_tokenizer("0123456789+=")
    tiny = TinyModelConfig(
        architecture="qwen3_moe",
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_experts=8,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    folder = save_model(build_tiny_model(tiny, tokenizer), tokenizer, tmp_path / "moe")
    hf = HFRolloutEngine(HFRolloutEngine.Params(record_routing=True))
    hf.start(EngineContext(folder, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    old = copy.deepcopy(hf.model)
    hf.follow_updates(MovedRouters(hf, "continue", scale=1.0))
    continued = [g for g in flat(hf.generate(PROMPTS, SAMPLING)) if len(set(g.versions)) == 2]
    assert continued
    moved = 0
    for generation in continued:
        cut = len(generation.prompt_ids) + generation.versions.count(0) - 1  # first position the new weights ran
        before, after = forward_experts(old, generation), forward_experts(hf.model, generation)
        expected = torch.cat([before[:cut], after[cut:]])
        assert torch.equal(generation.routing.long().sort(dim=-1).values, expected)
        moved += int((before[cut:] != after[cut:]).any())
    assert moved > 0  # the routers moved enough that replaying the old routing everywhere would be wrong


class VersionedTurns(NumberedEngine):
    """Call k samples the first token of each turn by version k - 1 and the rest by version k (an update in
    flight)."""

    def generate(self, prompts, sampling):
        groups = super().generate(prompts, sampling)
        for generation in flat(groups):
            generation.versions = [self.count - 1] + [self.count] * (len(generation.response_ids) - 1)
        return groups


def test_an_episode_keeps_each_policy_tokens_version_and_the_metrics_skip_observations():
    from rlzoo.config.schema import PromptConfig
    from rlzoo.episodes.runner import EpisodeRunner
    from rlzoo.interfaces import Sample

    tokenizer = build_char_tokenizer(ALPHABET)
    runner = EpisodeRunner(ScriptedEnvironment(), tokenizer, max_turns=MAX_TURNS, max_tokens=MAX_TOKENS)
    batch = runner.run(
        VersionedTurns(), [Sample("12+34=", "")], SamplingSettings(n=2, max_new_tokens=8), PromptConfig()
    )
    episodes = batch.groups[0]
    obs = len(tokenizer(OBSERVATION, add_special_tokens=False)["input_ids"])
    for episode in episodes:
        assert len(episode.versions) == len(episode.response_ids) and len(episode.turns) == MAX_TURNS
        for k, (start, end) in enumerate(episode.turns, start=1):
            assert episode.versions[start:end] == [k - 1, k, k, k]
            if k > 1:  # the observation before turn k: the version of the token before it
                assert episode.versions[start - obs : start] == [k - 1] * obs
    # policy tokens' versions: 0 1 1 1 | 1 2 2 2 | 2 3 3 3, mean 1.75 (the observations', 1 and 2, would lower it)
    metrics = token_versions(3, SimpleNamespace(generations=episodes))
    assert metrics == {"rollout/token_staleness": 1.25, "rollout/interrupted": 1.0}


@pytest.mark.parametrize("mode", ["continue", "restart"])
def test_the_producer_continues_across_published_weights_within_k(tmp_path, mode):
    k, steps = 2, 5
    torch.manual_seed(0)
    rig = start_rig(tmp_path, steps, max_staleness=k, partial=mode, max_new_tokens=8)
    schedule = AsyncRollouts(rig.prompts_for, steps, k, k, partial=mode)
    original = rig.rollout.follow_updates

    def follow(updates):
        if updates is not None:
            pending = updates.pending
            updates.pending = lambda: (time.sleep(0.01), pending())[1]  # ~10 ms a token: publishes land inside
        original(updates)

    rig.rollout.follow_updates = follow
    rig.rollout.sampled_with = []
    metrics = rig.run(Learner(rig.trainer), schedule)
    for step_metrics in metrics:
        assert 0 <= step_metrics["rollout/token_staleness"] <= step_metrics["rollout/staleness"] <= k
        assert 0.0 <= step_metrics["rollout/interrupted"] <= 1.0
        assert torch.isfinite(torch.tensor(step_metrics["loss/policy"]))
    if mode == "restart":  # a restarted response is one version's
        assert all(m["rollout/interrupted"] == 0.0 for m in metrics)


class BetweenBatchesOnly(HFRolloutEngine):
    """A third party's engine that loads weights between batches only (it does not declare updates_in_flight)."""

    name = "between-batches"
    updates_in_flight = False


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.engine={name: between-batches}", "rollout.partial=continue"], "loads weights between batches only"),
        (["rollout.engine={name: between-batches}", "rollout.partial=restart"], "loads weights between batches only"),
    ],
)
def test_preflight_refuses_partial_rollouts_it_cannot_honour(tmp_path, overrides, message):
    registry = Registry.discover()
    module = types.ModuleType("partial_test_plugins")
    module.rlzoo_rollout_engines = rlzoo.hookimpl(lambda: [BetweenBatchesOnly])
    module.rlzoo_rollout_engines.__name__ = "rlzoo_rollout_engines"
    registry.add_plugin(module, name="partial-test", distribution="partial-test-dist")
    config = build_config(
        {"rollout": {"prompts_per_step": 2, "group_size": 4}},
        ["rollout.max_staleness=1", *overrides, f"output_dir={tmp_path / 'run'}"],
        registry,
    )
    with pytest.raises(ConfigError) as err:
        preflight(config, registry)
    assert any(at == "rollout.partial" and message in text for at, text in err.value.problems), err.value.problems


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_partial_rollouts_on_hf_and_vllm_pass_the_preflight(tmp_path, engine):
    if engine == "vllm":
        pytest.importorskip("vllm")  # the preflight checks the engine's package is installed
    registry = default_registry()
    config = build_config(
        {},
        [
            "rollout.max_staleness=1",
            "rollout.partial=continue",
            "algorithm.router=null",
            f"rollout.engine={{name: {engine}}}",
            f"output_dir={tmp_path / 'run'}",
        ],
        registry,
    )
    preflight(config, registry)


def test_vllms_own_routing_output_is_refused_with_partial_rollouts_and_r3(tmp_path):
    """vLLM's routed_experts arrive with a request's last output, which a request stopped for new weights never gets."""
    pytest.importorskip("vllm")  # the preflight checks the engine's package is installed
    registry = default_registry()
    config = build_config(
        {},
        [
            "rollout.max_staleness=1",
            "rollout.partial=continue",
            "algorithm.router={name: replay-rollout}",
            "rollout.engine={name: vllm, routing_capture: vllm}",
            f"output_dir={tmp_path / 'run'}",
        ],
        registry,
    )
    with pytest.raises(ConfigError) as err:
        preflight(config, registry)
    assert any(at == "rollout.engine.routing_capture" and "use worker" in text for at, text in err.value.problems), (
        err.value.problems
    )
