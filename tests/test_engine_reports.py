"""Engines' own metrics (``Component.report``) reach the step's metrics (issue 36): a rollout engine's under
``rollout_engine/<name>/*`` after each generation batch and each weight sync, a training engine's under
``training_engine/<name>/*`` after each update, the old-log-prob pass and the weight sync, combined as the values
declare. What a rollout engine reports while evaluating is not mixed into the next step; a critic's engine keeps
its reports under ``critic/``; engines that report nothing add no key.

The loop's fake components (tests/test_stages_loop.py); a real run of reporting engines is in
tests/test_plugin_docs.py (the doc's engine examples)."""

from __future__ import annotations

import torch
from test_stages_loop import ByPrompt, Centered, CharTokenizer, IsA

from rlzoo.config.schema import RunConfig
from rlzoo.engines import TokenBatch, TrainingEngine
from rlzoo.interfaces import Max, Sample, Sum
from rlzoo.interfaces.base import take_reports
from rlzoo.registry import default_registry
from rlzoo.rl.critic import _critic_key
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, evaluate, rl_step
from rlzoo.rl.objective import build_objective
from rlzoo.runtime.distributed import Dist
from rlzoo.util.reductions import SkippedUpdates


class ReportingRollout(ByPrompt):
    """The loop tests' engine; with ``reports`` it reports the prompts of each generate call and each weight sync."""

    name = "reporting-rollout"

    def __init__(self, reports: bool = True) -> None:
        super().__init__()
        self.reports = reports

    def generate(self, prompts, sampling):
        if self.reports:
            self.report("prompts", Sum(float(len(prompts))))
            self.report("n", Max(float(sampling.n)))
        return super().generate(prompts, sampling)

    def sync_weights(self, named_tensors):
        list(named_tensors)
        if self.reports:
            self.report("syncs", Sum(1.0))


class TableEngine(TrainingEngine):
    """A training engine without a model: log-probs of 0 (the update's with gradient through a scale), and with
    ``reports`` a report from every method the step calls."""

    name = "table"

    def __init__(self, reports: bool = True) -> None:
        super().__init__()
        self.reports = reports
        self.scale = torch.zeros((), requires_grad=True)

    def _report(self, metric: str, value: float) -> None:
        if self.reports:
            self.report(metric, value)

    def logprobs_and_entropy(self, batch: TokenBatch):
        self._report("old_pass_rows", Sum(float(batch.input_ids.shape[0])))
        zeros = torch.zeros(batch.response_mask.shape)
        return zeros, zeros

    def train_step(self, batch: TokenBatch, loss_fn, with_entropy: bool = False):
        self._report("updates", Sum(1.0))
        self._report("rows", Max(float(batch.input_ids.shape[0])))
        loss, metrics = loss_fn(self.scale * torch.ones(batch.response_mask.shape))
        loss.backward()
        return {**metrics, "train/nonfinite_steps": SkippedUpdates(0.0)}

    def named_weights(self):
        self._report("weight_reads", Sum(1.0))
        return iter([("w", self.scale.detach())])


def components(rollout: ByPrompt, engine: TrainingEngine, dist: Dist | None = None) -> tuple[Components, list[Sample]]:
    registry = default_registry()
    train_set = [Sample(name, "a") for name in ["mix0", "mix1", "mix2", "mix3"]]
    parts = Components(
        objective=build_objective({"preset": "grpo", "kl_coef": 0.0}, registry),
        advantage=Centered(),
        verifier=IsA(),
        correction=registry.create("correction", "none"),
        rollout=rollout,
        learner=Learner(engine, dist) if dist is not None else Learner(engine),
        tokenizer=CharTokenizer(),
        train_set=train_set,
    )  # type: ignore[arg-type]
    return parts, train_set


CONFIG = RunConfig.model_validate(
    {
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 2},
        "algorithm": {"minibatches_per_rollout": 2},
    }
)


def test_engine_reports_reach_the_step_metrics_namespaced_and_reduced():
    parts, train_set = components(ReportingRollout(), TableEngine())
    metrics = rl_step(0, train_set[:2], parts, CONFIG)

    # the rollout engine: its one generate call of the step, and the weight sync after the update
    assert metrics["rollout_engine/reporting-rollout/prompts"] == 2.0
    assert type(metrics["rollout_engine/reporting-rollout/prompts"]) is Sum
    assert metrics["rollout_engine/reporting-rollout/n"] == 4.0
    assert metrics["rollout_engine/reporting-rollout/syncs"] == 1.0
    # the training engine: the old-log-prob pass over the 8 rows, two minibatch updates (summed; the largest
    # minibatch), and one read of the weights for the sync
    assert metrics["training_engine/table/old_pass_rows"] == 8.0
    assert metrics["training_engine/table/updates"] == 2.0 and type(metrics["training_engine/table/updates"]) is Sum
    assert metrics["training_engine/table/rows"] == 4.0 and type(metrics["training_engine/table/rows"]) is Max
    assert metrics["training_engine/table/weight_reads"] == 1.0
    # nothing is left for the next step
    assert take_reports(parts.rollout) == {} and take_reports(parts.learner.engine) == {}
    assert parts.learner.step_metrics() == {}
    again = rl_step(1, train_set[2:], parts, CONFIG)
    assert again["training_engine/table/updates"] == 2.0 and again["rollout_engine/reporting-rollout/syncs"] == 1.0


def test_every_generation_batch_of_a_step_is_collected():
    registry = default_registry()
    parts, _ = components(ReportingRollout(), TableEngine())
    parts.batch_filter = registry.create("batch_filter", "dynamic-sampling", {"max_gen_batches": 3})
    parts.train_set = [Sample(name, "a") for name in ["same0", "same1", "same2", "same3", "mix0", "mix1"]]
    metrics = rl_step(0, parts.train_set[:2], parts, CONFIG)
    assert metrics["filter/gen_batches"] == len(parts.rollout.calls) >= 2
    assert metrics["rollout_engine/reporting-rollout/prompts"] == sum(len(texts) for texts, _ in parts.rollout.calls)


def test_what_the_rollout_engine_reports_while_evaluating_is_not_the_next_steps():
    parts, train_set = components(ReportingRollout(), TableEngine())
    evaluate(train_set, parts.rollout, parts.verifier, parts.tokenizer, CONFIG)  # 4 prompts, 1 response each
    metrics = rl_step(0, train_set[:2], parts, CONFIG)
    assert metrics["rollout_engine/reporting-rollout/prompts"] == 2.0  # the step's generation only
    assert metrics["rollout_engine/reporting-rollout/n"] == 4.0  # not the evaluation's 1


def test_engines_that_report_nothing_add_no_key():
    parts, train_set = components(ReportingRollout(reports=False), TableEngine(reports=False))
    metrics = rl_step(0, train_set[:2], parts, CONFIG)
    assert not [key for key in metrics if key.startswith(("rollout_engine/", "training_engine/"))]
    reporting, _ = components(ReportingRollout(), TableEngine())
    reported = rl_step(0, train_set[:2], reporting, CONFIG)
    # the same step with reporting engines differs by their keys alone, the others in the same order
    assert [k for k in reported if not k.startswith(("rollout_engine/", "training_engine/"))] == list(metrics)
    assert {
        k: v for k, v in reported.items() if not k.startswith(("rollout_engine/", "training_engine/", "time/"))
    } == {k: v for k, v in metrics.items() if not k.startswith("time/")}


def test_a_critic_engines_reports_stay_under_critic():
    assert _critic_key("training_engine/torch/tokens") == "critic/training_engine/torch/tokens"
    assert _critic_key("train/grad_norm") == "critic/grad_norm" and _critic_key("critic/vf_loss") == "critic/vf_loss"
