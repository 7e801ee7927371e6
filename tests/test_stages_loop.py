"""The loop's batch and reward stages: dynamic sampling fills a step from further generation batches, never loops
forever, trains on what it has (warning + metric) or skips the update; reward shapers and their length errors."""

from __future__ import annotations

import logging

import pytest
import torch

from rlzoo.config.schema import RunConfig
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings
from rlzoo.errors import ConfigError
from rlzoo.interfaces import AdvantageSource, ResponseTooLong, Sample, Verdict, Verifier
from rlzoo.registry import default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, rl_step
from rlzoo.rl.rollouts import collect
from rlzoo.util.timer import Timer


class CharTokenizer:
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class ByPrompt(RolloutEngine):
    """Prompts starting with "same" get identical responses (all rewards equal), others a mix; ``long`` makes
    every response ``long`` tokens."""

    name = "by-prompt"

    def __init__(self, long: int = 0) -> None:
        super().__init__()
        self.long = long
        self.calls: list[tuple[list[str], int | None]] = []

    def generate(self, prompts, sampling: SamplingSettings):
        texts = ["".join(map(chr, p)) for p in prompts]
        self.calls.append((texts, sampling.seed))
        out = []
        for text in texts:
            group = []
            for i in range(sampling.n):
                response = "x" * self.long if self.long else ("b" if text.startswith("same") or i % 2 else "a")
                ids = [ord(c) for c in response]
                group.append(Generation(list(prompts[texts.index(text)]), ids, [0.0] * len(ids), True))
            out.append(group)
        return out


class IsA(Verifier):
    name = "is-a"

    def verify(self, sample: Sample, response: str) -> Verdict:
        return Verdict(float(response == "a"))


class Centered(AdvantageSource):
    name = "centered"

    def compute(self, batch):
        return (batch.rewards - batch.rewards.mean()).unsqueeze(1) * batch.mask


def _setup(train_names, filter_spec=None, shapers=(), long=0, prompts_per_step=2, group_size=4):
    registry = default_registry()
    config = RunConfig.model_validate(
        {"rollout": {"prompts_per_step": prompts_per_step, "group_size": group_size, "max_new_tokens": 4}}
    )
    filter_spec = filter_spec or {"name": "none"}
    train_set = [Sample(name, "a") for name in train_names]
    parts = Components(
        objective=None,
        advantage=Centered(),
        verifier=IsA(),
        correction=None,
        rollout=ByPrompt(long),
        learner=Learner(None),
        tokenizer=CharTokenizer(),  # a step that trains would fail on these Nones
        batch_filter=registry.create("batch_filter", filter_spec.pop("name"), filter_spec),
        shapers=[
            registry.create("reward_shaper", s["name"], {k: v for k, v in s.items() if k != "name"}) for s in shapers
        ],
        train_set=train_set,
    )  # type: ignore[arg-type]
    return config, parts, train_set


def test_dynamic_sampling_fills_the_batch_with_fresh_informative_groups():
    names = ["same0", "same1", "same2", "mix0", "mix1", "mix2"]
    config, parts, train_set = _setup(names, {"name": "dynamic-sampling", "max_gen_batches": 10})
    rollout = collect(
        3, train_set[:2], parts.rollout_parts(config), Timer()
    )  # the first batch: two uninformative prompts
    prompts = [p for texts, _ in parts.rollout.calls for p in texts]
    assert len(prompts) == len(set(prompts))  # every further batch draws prompts not drawn yet
    assert len(rollout.generations) == 2 * 4
    groups = rollout.rewards.rewards.view(2, 4)
    assert ((groups.max(1).values - groups.min(1).values) > 0).all()  # only informative groups are trained on
    m = rollout.metrics
    assert m["filter/gen_batches"] == len(parts.rollout.calls) >= 2
    assert m["filter/underfilled"] == 0.0 and m["filter/skipped"] == 0.0
    assert 0 < m["filter/kept_fraction"] < 1
    seeds = [seed for _, seed in parts.rollout.calls]
    assert len(set(seeds)) == len(seeds)  # each generation batch has its own seed
    # reproducible: the same step draws the same prompts with the same seeds
    _, again, _ = _setup(names, {"name": "dynamic-sampling", "max_gen_batches": 10})
    collect(3, train_set[:2], again.rollout_parts(config), Timer())
    assert again.rollout.calls == parts.rollout.calls


def test_no_filter_keeps_everything_from_one_generation_batch():
    config, parts, train_set = _setup(["same0", "mix0"])
    rollout = collect(0, train_set, parts.rollout_parts(config), Timer())
    assert len(parts.rollout.calls) == 1 and len(rollout.generations) == 8
    assert rollout.metrics["filter/kept_fraction"] == 1.0 and rollout.metrics["filter/gen_batches"] == 1.0


def test_underfilled_batch_trains_on_what_it_has_and_says_so(caplog):
    config, parts, train_set = _setup(["mix0", "same0", "same1"], {"name": "dynamic-sampling", "max_gen_batches": 2})
    with caplog.at_level(logging.WARNING, logger="rlzoo.rl.loop"):
        rollout = collect(0, train_set[:2], parts.rollout_parts(config), Timer())
    assert len(rollout.generations) == 4 and rollout.batch is not None  # the one informative group
    assert rollout.metrics["filter/underfilled"] == 1.0 and rollout.metrics["filter/skipped"] == 0.0
    assert rollout.metrics["filter/gen_batches"] == 2.0
    warnings = [r for r in caplog.records if r.name == "rlzoo.rl.loop" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "kept 1 of 2" in warnings[0].getMessage()


def test_all_rewards_equal_skips_the_update_and_never_loops_forever(caplog):
    config, parts, train_set = _setup(
        [f"same{i}" for i in range(50)], {"name": "dynamic-sampling", "max_gen_batches": 3}
    )
    with caplog.at_level(logging.WARNING, logger="rlzoo.rl.loop"):
        metrics = rl_step(0, train_set[:2], parts, config)  # Learner(None): training would raise
    assert len(parts.rollout.calls) == 3
    assert metrics["filter/skipped"] == 1.0 and metrics["filter/kept_fraction"] == 0.0
    assert metrics["filter/gen_batches"] == 3.0 and "loss/policy" not in metrics and "reward/mean" in metrics
    assert sum("skipping" in r.getMessage() for r in caplog.records) == 1


def test_filter_stops_when_the_train_set_runs_out():
    config, parts, train_set = _setup(["same0", "same1", "same2"], {"name": "dynamic-sampling", "max_gen_batches": 100})
    rollout = collect(0, train_set[:2], parts.rollout_parts(config), Timer())
    assert rollout.batch is None and rollout.metrics["filter/gen_batches"] == 2.0  # then no fresh prompt is left


def test_shapers_add_to_the_rewards_before_advantages():
    config, parts, train_set = _setup(["mix0"], shapers=[{"name": "length", "coef": 0.25}], prompts_per_step=1)
    rollout = collect(0, train_set, parts.rollout_parts(config), Timer())
    raw = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert torch.allclose(rollout.rewards.rewards, raw - 0.25)  # every response is 1 token long
    assert rollout.metrics["reward/shaping_mean"] == pytest.approx(-0.25)
    assert rollout.metrics["reward/mean"] == pytest.approx(0.5)  # the verifier's reward, unshaped


def test_overlong_shaping_lowers_long_responses():
    config, parts, train_set = _setup(["mix0"], shapers=[{"name": "overlong", "buffer": 2}], long=4, prompts_per_step=1)
    rollout = collect(0, train_set, parts.rollout_parts(config), Timer())
    assert torch.allclose(rollout.rewards.rewards, torch.full((4,), -1.0))  # |y| = L_max: the full penalty


def test_a_response_longer_than_the_shaper_budget_is_an_error_naming_it():
    config, parts, train_set = _setup(["mix0"], shapers=[{"name": "overlong", "buffer": 2}], long=7, prompts_per_step=1)
    with pytest.raises(ResponseTooLong, match=r"'overlong'.* 7 tokens exceeds L_max .* of 4 tokens"):
        collect(0, train_set, parts.rollout_parts(config), Timer())
    config, parts, train_set = _setup(["mix0"], shapers=[{"name": "length"}], long=5, prompts_per_step=1)
    with pytest.raises(ResponseTooLong, match=r"'length'.* 5 tokens exceeds the budget .* of 4 tokens"):
        collect(0, train_set, parts.rollout_parts(config), Timer())


@pytest.mark.parametrize(
    ("shaper", "message"),
    [
        ("{name: overlong, buffer: 40}", "buffer 40 exceeds L_max 16"),
        ("{name: overlong, max_length: 8}", "max_length 8 is below rollout.max_new_tokens 16"),
    ],
)
def test_preflight_rejects_a_shaper_that_cannot_fit_the_budget(shaper, message, tmp_path):
    from rlzoo.config.resolution import build_config
    from rlzoo.preflight.checks import preflight

    config = build_config(
        {}, [f"algorithm.reward_shaping=[{shaper}]", f"output_dir={tmp_path}", "rollout.max_new_tokens=16"]
    )
    with pytest.raises(ConfigError) as err:
        preflight(config, default_registry())
    assert any(loc == "algorithm.reward_shaping.0" and message in text for loc, text in err.value.problems)


def test_dapo_preset_is_complete_and_its_stages_can_be_overridden():
    from rlzoo.config.resolution import build_config

    algo = build_config({"algorithm": {"preset": "dapo"}}).algorithm
    assert (algo.clipper.params["eps_low"], algo.clipper.params["eps_high"]) == (0.2, 0.28)
    assert algo.aggregation.name == "token-mean" and algo.kl_coef == 0.0
    assert algo.batch_filter.name == "dynamic-sampling" and algo.batch_filter.params["max_gen_batches"] == 10
    assert [s.name for s in algo.reward_shaping] == ["overlong"] and algo.reward_shaping[0].params["penalty"] == 1.0
    tuned = build_config(
        {
            "algorithm": {
                "preset": "dapo",
                "batch_filter": {"max_gen_batches": 2},
                "reward_shaping": [{"name": "length"}],
            }
        }
    ).algorithm
    assert tuned.batch_filter.name == "dynamic-sampling" and tuned.batch_filter.params["max_gen_batches"] == 2
    assert [s.name for s in tuned.reward_shaping] == ["length"]
    with pytest.raises(ConfigError, match=r"algorithm.reward_shaping.0.bufer"):
        build_config({"algorithm": {"reward_shaping": [{"name": "overlong", "bufer": 3}]}})
