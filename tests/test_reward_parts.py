"""Reward parts and greedy baselines through the loop's rollout stage: a verifier's named parts reach the advantage
source (``RewardBatch.reward_parts``) and the metrics (``reward/parts/<name>_mean``), faults score each part 0, a run
without parts keeps exactly its metrics; ReMax's greedy response per prompt is sampled, scored and shaped as the
sampled ones are; the start-up checks of gdpo, grpo-passk and the optimal token baselines."""

from __future__ import annotations

import math
import types

import pytest
import torch
from test_stages_loop import CharTokenizer

import rlzoo
from rlzoo.config.resolution import build_config
from rlzoo.config.schema import RunConfig
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import AdvantageSource, Sample, Verdict, Verifier
from rlzoo.preflight.checks import preflight
from rlzoo.registry import Registry, default_registry
from rlzoo.rl.advantages import advantages
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components
from rlzoo.rl.rollouts import collect
from rlzoo.rl.step_record import OldLogprobs, StepRecord
from rlzoo.util.timer import Timer


class Alternating(RolloutEngine):
    """Sampled responses alternate "a", "bb"; the greedy one (temperature 0) is "a" for prompts starting with "easy",
    else "ccc". Records every call's (n, temperature)."""

    name = "alternating"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, float]] = []

    def generate(self, prompts, sampling: SamplingSettings):
        self.calls.append((sampling.n, sampling.temperature))
        out = []
        for prompt in prompts:
            text = "".join(map(chr, prompt))
            if sampling.temperature == 0:
                responses = ["a" if text.startswith("easy") else "ccc"]
            else:
                responses = ["a" if i % 2 == 0 else "bb" for i in range(sampling.n)]
            out.append([Generation(list(prompt), [ord(c) for c in r], [0.0] * len(r), True) for r in responses])
        return out


class Parts(Verifier):
    """reward = correct + 0.5 * short; parts correct (response "a") and short (one character); a response "bb" lacks
    the part short (as a verifier that scored part of it)."""

    name = "parts"

    def verify(self, sample: Sample, response: str) -> Verdict:
        correct, short = float(response == "a"), float(len(response) == 1)
        parts = {"correct": correct} if response == "bb" else {"correct": correct, "short": short}
        return Verdict(correct + 0.5 * short, parts=parts)


class Plain(Verifier):
    name = "plain"

    def verify(self, sample: Sample, response: str) -> Verdict:
        return Verdict(float(response == "a"))


class Source(AdvantageSource):
    name = "source"


def setup(verifier: Verifier, shapers=(), greedy=False, prompts=("easy0", "hard0")):
    config = RunConfig.model_validate(
        {"rollout": {"prompts_per_step": len(prompts), "group_size": 4, "max_new_tokens": 4}}
    )
    registry = default_registry()
    components = Components(
        objective=None,
        advantage=Source(),
        verifier=verifier,
        correction=None,
        rollout=Alternating(),
        learner=Learner(None),
        tokenizer=CharTokenizer(),
        batch_filter=registry.create("batch_filter", "none", {}),
        shapers=[
            registry.create("reward_shaper", s["name"], {k: v for k, v in s.items() if k != "name"}) for s in shapers
        ],
    )  # type: ignore[arg-type]
    parts = components.rollout_parts(config)
    parts.greedy_baseline = greedy
    return config, components, parts, [Sample(p, "a") for p in prompts]


def test_parts_reach_the_reward_batch_and_the_metrics():
    config, _, parts, prompts = setup(Parts())
    rollout = collect(0, prompts, parts, Timer())
    got = rollout.rewards.reward_parts
    assert list(got) == ["correct", "short"]
    assert got["correct"].tolist() == [1.0, 0.0, 1.0, 0.0] * 2
    assert got["short"].tolist() == [1.0, 0.0, 1.0, 0.0] * 2  # "bb" lacks it: 0, as a fault scores 0
    assert rollout.metrics["reward/parts/correct_mean"] == pytest.approx(0.5)
    assert rollout.metrics["reward/parts/short_mean"] == pytest.approx(0.5)
    assert rollout.rewards.reward_baselines is None and "reward/baseline_mean" not in rollout.metrics


def test_the_shapers_terms_are_a_part_of_their_own():
    config, _, parts, prompts = setup(Parts(), shapers=[{"name": "length", "coef": 0.25}])
    rollout = collect(0, prompts, parts, Timer())
    assert list(rollout.rewards.reward_parts) == ["correct", "short", "shaping"]
    assert rollout.rewards.reward_parts["shaping"].tolist() == [-0.25, -0.5, -0.25, -0.5] * 2
    assert "reward/parts/shaping_mean" not in rollout.metrics  # reward/shaping_mean has it already


def test_a_run_without_parts_has_exactly_its_metrics():
    config, _, parts, prompts = setup(Plain())
    rollout = collect(0, prompts, parts, Timer())
    assert rollout.rewards.reward_parts is None
    assert sorted(rollout.metrics) == sorted(
        [
            "reward/mean",
            "reward/std",
            "reward/correct_fraction",
            "reward/shaping_mean",
            "response/length_mean",
            "response/length_max",
            "response/finished_fraction",
            "verifier/errors",
            "verifier/timeouts",
            "verifier/nonfinite_rewards",
            "filter/kept_fraction",
            "filter/gen_batches",
            "filter/underfilled",
            "filter/skipped",
        ]
    )


class Faulty(Parts):
    """Raises on "bb" and gives a non-finite part to "a" of prompt "hard0"."""

    name = "faulty"

    def verify(self, sample: Sample, response: str) -> Verdict:
        if response == "bb":
            raise RuntimeError("cannot score")
        verdict = super().verify(sample, response)
        if sample.prompt == "hard0":
            verdict.parts["short"] = math.nan
        return verdict


def test_a_fault_scores_every_part_zero():
    config, _, parts, prompts = setup(Faulty())
    rollout = collect(0, prompts, parts, Timer())
    got = rollout.rewards.reward_parts
    assert got["correct"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert got["short"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert rollout.rewards.rewards.tolist() == [1.5, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert rollout.metrics["verifier/errors"] == 4 and rollout.metrics["verifier/nonfinite_rewards"] == 2


def advantages_of(rollout, source):
    """The advantage phase of a step whose old log-probs are 0: the advantages, returns and their metrics."""
    zeros = torch.zeros_like(rollout.rewards.mask)
    record = StepRecord(0, rollout=rollout, old=OldLogprobs(zeros, None, None, zeros, None, torch.ones_like(zeros)))
    advantages(record, source, None)
    return record.advantages, record.returns, record.advantage_metrics


def test_remax_samples_scores_and_shapes_one_greedy_response_per_prompt():
    config, components, parts, prompts = setup(Parts(), shapers=[{"name": "length", "coef": 0.25}], greedy=True)
    timer = Timer()
    rollout = collect(0, prompts, parts, timer)
    assert components.rollout.calls == [(4, 1.0), (1, 0.0)]
    # easy0: greedy "a" scores 1.5 - 0.25; hard0: "ccc" scores 0 - 0.75; each prompt's baseline on its 4 responses
    assert rollout.rewards.reward_baselines.tolist() == [1.25] * 4 + [-0.75] * 4
    assert rollout.metrics["reward/baseline_mean"] == pytest.approx(0.25)
    assert "time/baseline" in timer.metrics()
    remax = default_registry().create("advantage", "remax", {})
    adv, returns, _ = advantages_of(rollout, remax)
    first = adv[:, 0].tolist()
    assert first == pytest.approx([0.0, -1.75, 0.0, -1.75, 2.0, 0.25, 2.0, 0.25])  # shaped reward - baseline
    assert returns is None


def test_the_loop_asks_for_greedy_baselines_only_when_the_source_declares_it():
    _, components, parts, _ = setup(Parts())
    assert parts.greedy_baseline is False
    components.advantage = default_registry().create("advantage", "remax", {})
    assert components.rollout_parts(RunConfig()).greedy_baseline is True


def test_gdpo_reads_the_parts_and_refuses_a_batch_without_them():
    config, _, parts, prompts = setup(Parts())
    rollout = collect(0, prompts, parts, Timer())
    gdpo = default_registry().create("advantage", "gdpo", {})
    adv, _, _ = advantages_of(rollout, gdpo)
    assert torch.isfinite(adv).all() and adv.abs().sum() > 0
    config, _, parts, prompts = setup(Plain())
    rollout = collect(0, prompts, parts, Timer())
    with pytest.raises(RlzooError, match="^verifier: its verdicts carry no reward parts"):
        advantages_of(rollout, gdpo)


# -- before the run ------------------------------------------------------------------------------------------------


class NoParts(Plain):
    """Declares that its verdicts carry no parts."""

    name = "no-parts"

    def reward_parts(self) -> tuple[str, ...]:
        return ()


def registry_with(*verifiers: type[Verifier]) -> Registry:
    registry = Registry.discover()
    module = types.ModuleType("reward_parts_test_plugins")
    module.rlzoo_verifiers = rlzoo.hookimpl(lambda: list(verifiers))
    module.rlzoo_verifiers.__name__ = "rlzoo_verifiers"
    registry.add_plugin(module, name="reward-parts-test", distribution="reward-parts-test-dist")
    return registry


def problems(data: dict, tmp_path, registry: Registry | None = None) -> dict[str, str]:
    registry = registry or default_registry()
    with pytest.raises(ConfigError) as err:
        preflight(build_config({"output_dir": str(tmp_path / "run"), **data}, registry=registry), registry)
    return dict(err.value.problems)


def test_gdpo_with_a_verifier_that_declares_no_parts_is_refused_at_the_verifier(tmp_path):
    registry = registry_with(NoParts)
    found = problems({"verifier": {"name": "no-parts"}, "algorithm": {"preset": "gdpo"}}, tmp_path, registry)
    assert list(found) == ["verifier"]
    assert found["verifier"].startswith(
        "'no-parts' returns no reward parts, but advantage 'gdpo' (algorithm.advantage)"
    )


def test_gdpo_parts_must_be_the_weighted_verifiers(tmp_path):
    verifier = {
        "name": "weighted",
        "verifiers": [{"name": "exact", "label": "correct"}, {"name": "regex", "pattern": "x"}],
    }
    found = problems(
        {"verifier": verifier, "algorithm": {"advantage": {"name": "gdpo", "parts": ["correct", "format"]}}}, tmp_path
    )
    assert found == {
        "algorithm.advantage.parts.1": "'format' is not a reward part of verifier 'weighted'; its parts: correct, regex"
    }


def test_a_source_needing_sum_pi_squared_with_routing_replay_and_passk_with_one_response_are_refused(tmp_path):
    registry = default_registry()  # the sum comes from the training engine: accepted without a replaying router
    data = {
        "output_dir": str(tmp_path / "run"),
        "algorithm": {"advantage": {"name": "optimal-token-baseline"}, "router": None},
    }
    preflight(build_config(data, registry=registry), registry)
    found = problems(
        {"algorithm": {"advantage": {"name": "optimal-token-baseline"}, "router": {"name": "replay-rollout"}}}, tmp_path
    )
    assert list(found) == ["algorithm.router"]
    assert found["algorithm.router"].startswith("'replay-rollout' replays expert routing, but the pass that computes")
    found = problems({"algorithm": {"advantage": {"name": "grpo-passk"}}, "rollout": {"group_size": 1}}, tmp_path)
    assert found["rollout.group_size"].startswith("1, but advantage 'grpo-passk'")


def test_a_held_out_evaluation_reports_each_part():
    """A judge's score held out beside the rule that guards it: ``eval/reward_parts_<name>_mean`` per part (a
    verdict without a part counts 0 for it, as in training); a verifier without parts adds no such key."""
    from rlzoo.rl.loop import evaluate

    config, components, _, samples = setup(Parts())
    config.train.eval_samples_per_prompt = 4
    metrics = evaluate(samples, Alternating(), Parts(), CharTokenizer(), config)
    assert metrics["eval/reward_parts_correct_mean"] == pytest.approx(0.5)  # "a", "bb", "a", "bb"
    assert metrics["eval/reward_parts_short_mean"] == pytest.approx(0.5)  # "bb" lacks the part
    assert metrics["eval/reward_mean"] == pytest.approx(0.75)
    plain = evaluate(samples, Alternating(), Plain(), CharTokenizer(), config)
    assert not [key for key in plain if key.startswith("eval/reward_parts")]
