"""Metrics with declared reductions (rlzoo.reporting.metrics_log): how a step combines its minibatches' and ranks' values is the
value's class, not its name; any component reports metrics with ``self.report`` and they reach the step's metrics
under ``<namespace>/<name>/<metric>``."""

from __future__ import annotations

import json
import math
import pickle
import threading
import types
from dataclasses import dataclass, field

import pytest
import torch
from test_stages_loop import ByPrompt, CharTokenizer, IsA  # the loop tests' fake engine, tokenizer, verifier

import rlzoo
from rlzoo.config.schema import RunConfig
from rlzoo.interfaces import AdvantageSource, BatchFilter, Clipper, ClipResult, Sample
from rlzoo.interfaces.base import collecting, take_reports
from rlzoo.registry import Registry, default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.loop import Components, rl_step
from rlzoo.rl.objective import build_objective
from rlzoo.runtime.distributed import Dist
from rlzoo.util.reductions import (
    Max,
    Mean,
    Min,
    SkippedUpdates,
    Sum,
    UnscoredResponses,
    reduce_minibatches,
    reduce_ranks,
)

NAN = float("nan")

# -- the reductions ----------------------------------------------------------------------------------------------


def test_over_minibatches_each_class_combines_as_it_declares():
    parts = [
        {
            "plain": 1.0,
            "mean": Mean(2.0),
            "sum": Sum(1.0),
            "min": Min(3.0),
            "max": Max(3.0),
            "skipped": SkippedUpdates(1.0),
        },
        {
            "plain": NAN,
            "mean": Mean(4.0),
            "sum": Sum(2.0),
            "min": Min(-1.0),
            "max": Max(7.0),
            "skipped": SkippedUpdates(0.0),
        },
        {
            "plain": 3.0,
            "mean": Mean(NAN),
            "sum": Sum(4.0),
            "min": Min(5.0),
            "max": Max(-2.0),
            "skipped": SkippedUpdates(1.0),
        },
    ]
    out = reduce_minibatches(parts)
    assert out == {"plain": 2.0, "mean": 3.0, "sum": 7.0, "min": -1.0, "max": 7.0, "skipped": 2.0}
    # the declaration survives the reduction; a plain float stays a plain float
    assert type(out["plain"]) is float
    for key, cls in [("mean", Mean), ("sum", Sum), ("min", Min), ("max", Max), ("skipped", SkippedUpdates)]:
        assert type(out[key]) is cls, key


def test_a_plain_float_is_the_mean_of_the_finite_values_and_nan_when_none_is():
    out = reduce_minibatches([{"a": 1.0, "b": NAN, "n": 2.0}, {"a": math.inf, "b": NAN}, {"a": 5.0, "n_steps": 1.0}])
    assert out["a"] == 3.0 and math.isnan(out["b"]) and out["n"] == 2.0
    assert out["n_steps"] == 1.0  # the name means nothing: no `_steps` suffix rule
    assert reduce_minibatches([{"x_steps": 1.0}, {"x_steps": 3.0}])["x_steps"] == 2.0


def test_declared_values_are_floats_everywhere():
    values = {"s": Sum(2.0), "m": Min(-1.5), "u": UnscoredResponses(3), "k": SkippedUpdates(0.0)}
    assert json.dumps(values) == '{"s": 2.0, "m": -1.5, "u": 3.0, "k": 0.0}'
    assert Sum(2.0) == 2.0 and Min(-1.5) < 0 and f"{UnscoredResponses(3):g}" == "3" and repr(Sum(2.0)) == "Sum(2.0)"
    assert isinstance(SkippedUpdates(1.0), Sum) and not isinstance(Sum(1.0), SkippedUpdates)
    for value in values.values():  # all_gather_object / broadcast pickle them
        again = pickle.loads(pickle.dumps(value))
        assert type(again) is type(value) and again == value


@dataclass(frozen=True)
class GatheredDist(Dist):
    """Rank 0 of a fake world whose other ranks' metrics are ``others``; objects go through pickle, as in
    torch.distributed.all_gather_object."""

    others: list = field(default_factory=list)

    def all_gather_object(self, obj):
        return [pickle.loads(pickle.dumps(o)) for o in [obj, *self.others]]


def test_over_ranks_each_class_combines_as_it_declares_and_time_is_rank_zeros():
    mine = {
        "plain": 1.0,
        "sum": Sum(4.0),
        "min": Min(0.5),
        "max": Max(2.0),
        "unscored": UnscoredResponses(2.0),
        "time/train": 10.0,
    }
    other = {
        "plain": 3.0,
        "sum": Sum(2.0),
        "min": Min(0.25),
        "max": Max(1.0),
        "unscored": UnscoredResponses(2.0),
        "time/train": 99.0,
        "only/other": Max(5.0),
    }
    dist = GatheredDist(rank=0, world=2, others=[other])
    out = dist.reduce_metrics(mine)
    assert out == {
        "plain": 2.0,
        "sum": 3.0,
        "min": 0.25,
        "max": 2.0,
        "unscored": 2.0,
        "time/train": 10.0,
        "only/other": 5.0,
    }
    assert type(out["plain"]) is float
    for key, cls in [("sum", Sum), ("min", Min), ("max", Max), ("unscored", UnscoredResponses), ("only/other", Max)]:
        assert type(out[key]) is cls, key
    assert reduce_ranks([mine]) == mine


# -- reports -----------------------------------------------------------------------------------------------------


def test_take_reports_namespaces_by_kind_and_name_and_clears_the_buffer():
    class Lengthy(BatchFilter):
        name = "lengthy"

    class Plain(rlzoo.interfaces.Component):  # a kind without a declared namespace uses its kind
        kind, name = "thing", "plain"

    component, plain = Lengthy(), Plain()
    assert take_reports(component) == {}
    component.report("seen", Sum(3.0))
    component.report("ratio", 0.5)
    component.report("ratio", 0.75)  # the last value of one call wins
    plain.report("x", 1.0)
    reports = take_reports(component)
    assert reports == {"filter/lengthy/seen": 3.0, "filter/lengthy/ratio": 0.75}
    assert type(reports["filter/lengthy/seen"]) is Sum
    assert take_reports(component) == {} and take_reports(plain) == {"thing/plain/x": 1.0}


def test_a_scope_collects_the_reports_of_its_block_in_its_thread_and_the_innermost_takes_them():
    class Lengthy(BatchFilter):
        name = "lengthy"

    component, seen = Lengthy(), {}
    with collecting(into=seen) as outer:
        component.report("seen", Sum(1.0))
        with collecting() as inner:  # a narrower scope: a minibatch, a generation batch
            component.report("seen", Sum(2.0))
            component.report("ratio", 0.5)
            component.report("ratio", 0.75)  # the last value in one scope wins
            other = threading.Thread(target=lambda: component.report("elsewhere", 1.0))  # a thread of its own
            other.start()
            other.join()
        component.report("after", 3.0)
    assert outer is seen and seen == {"filter/lengthy/seen": 1.0, "filter/lengthy/after": 3.0}
    assert (
        inner == {"filter/lengthy/seen": 2.0, "filter/lengthy/ratio": 0.75}
        and type(inner["filter/lengthy/seen"]) is Sum
    )
    # outside any scope (the other thread) the component keeps its reports until take_reports takes them
    assert take_reports(component) == {"filter/lengthy/elsewhere": 1.0} and take_reports(component) == {}


def test_no_caller_drains_a_component_in_the_core():
    """The step's phases are scopes (rlzoo.interfaces.base.collecting); take_reports is for tests and loops of
    one's own."""
    from pathlib import Path

    core = Path(rlzoo.__file__).parent
    callers = [str(path.relative_to(core)) for path in core.rglob("*.py") if "take_reports(" in path.read_text()]
    assert callers == ["interfaces/base.py"]


# -- end to end: reports of an advantage source, a batch filter and a clipper in rl_step's metrics ------------------


class ReportingAdvantage(AdvantageSource):
    """Centred rewards; reports the groups it saw (a count) and the largest reward."""

    name = "reporting"

    def compute(self, batch):
        self.report("groups", Sum(float(int(batch.group_index.max()) + 1)))
        self.report("reward_max", Max(batch.rewards.max().item()))
        return (batch.rewards - batch.rewards.mean()).unsqueeze(1) * batch.mask


class ReportingFilter(BatchFilter):
    """Keeps the groups whose rewards differ, over up to 3 generation batches; reports the groups it saw."""

    name = "reporting"

    def max_gen_batches(self) -> int:
        return 3

    def keep(self, rewards, group_index):
        groups = int(group_index.max()) + 1
        self.report("seen", Sum(float(groups)))
        return torch.tensor([bool(rewards[group_index == g].std() > 0) for g in range(groups)])


class ReportingClipper(Clipper):
    """The plain policy-gradient loss; reports its call number in every declared way."""

    name = "reporting"

    def clip_batch(self, batch):
        self.calls = getattr(self, "calls", 0) + 1
        for metric, value in [
            ("calls", Sum(1.0)),
            ("first", Min(self.calls)),
            ("last", Max(self.calls)),
            ("mean_call", float(self.calls)),
        ]:
            self.report(metric, value)
        never = torch.zeros_like(batch.mask, dtype=torch.bool)
        return ClipResult(-batch.ratio * batch.advantages, never, never.clone())


class NoModelLearner(Learner):
    """The old log-probs are the rollout's; an update evaluates the loss and takes no step."""

    def old_logprobs(self, batch, rollout_logp, rollout_routing):
        self.logp = rollout_logp
        return rollout_logp, torch.zeros_like(rollout_logp)

    def update(self, batch, rows, loss_fn, with_entropy=False):
        loss, metrics = loss_fn(self.logp[rows].clone().requires_grad_())
        loss.backward()
        return {**metrics, "train/nonfinite_steps": SkippedUpdates(0.0), "train/grad_norm": 1.0}

    def push_weights(self, rollout, every_rank=False):
        pass


def _test_registry() -> Registry:
    """The installed components plus the reporting ones, registered as a plugin would register them."""
    registry = Registry.discover()
    plugin = types.ModuleType("reporting_plugin")
    for hook, classes in [
        ("rlzoo_advantage_sources", [ReportingAdvantage]),
        ("rlzoo_batch_filters", [ReportingFilter]),
        ("rlzoo_clippers", [ReportingClipper]),
    ]:

        def implementation(classes=classes):
            return classes

        implementation.__name__ = hook
        setattr(plugin, hook, rlzoo.hookimpl(implementation))
    registry.add_plugin(plugin, name="reporting", distribution="tests")
    assert not registry.load_errors, registry.load_errors
    return registry


def test_component_reports_reach_the_step_metrics_namespaced_and_reduced():
    registry = _test_registry()
    config = RunConfig.model_validate(
        {
            "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 2},
            "algorithm": {"minibatches_per_rollout": 2},
        }
    )
    train_set = [Sample(name, "a") for name in ["same0", "mix0", "same1", "mix1", "same2"]]
    parts = Components(
        objective=build_objective({"clipper": {"name": "reporting"}}, registry),
        advantage=registry.create("advantage", "reporting"),
        verifier=IsA(),
        correction=default_registry().create("correction", "none"),
        rollout=ByPrompt(),
        learner=NoModelLearner(None),
        tokenizer=CharTokenizer(),
        batch_filter=registry.create("batch_filter", "reporting"),
        train_set=train_set,
    )  # type: ignore[arg-type]
    metrics = rl_step(0, [train_set[0], train_set[1]], parts, config)

    # the batch filter's count over the step's generation batches: their sum
    assert metrics["filter/gen_batches"] == len(parts.rollout.calls) >= 2
    assert metrics["filter/reporting/seen"] == sum(len(texts) for texts, _ in parts.rollout.calls)
    assert type(metrics["filter/reporting/seen"]) is Sum
    # the advantage source's, once per step
    assert metrics["advantage/reporting/groups"] == 2.0 and metrics["advantage/reporting/reward_max"] == 1.0
    assert type(metrics["advantage/reporting/reward_max"]) is Max
    # the clipper's, once per minibatch (two of them), combined as each value declares
    assert metrics["clip/reporting/calls"] == 2.0 and type(metrics["clip/reporting/calls"]) is Sum
    assert metrics["clip/reporting/first"] == 1.0 and metrics["clip/reporting/last"] == 2.0
    assert metrics["clip/reporting/mean_call"] == 1.5
    # and the built-in declarations survive the step
    assert type(metrics["ratio/min"]) is Min and type(metrics["ratio/max"]) is Max
    assert type(metrics["train/nonfinite_steps"]) is SkippedUpdates and metrics["train/nonfinite_steps"] == 0.0
    assert all(type(metrics[f"verifier/{k}"]) is UnscoredResponses for k in ("errors", "timeouts", "nonfinite_rewards"))
    # nothing is left behind for the next step
    assert all(take_reports(c) == {} for c in (parts.advantage, parts.batch_filter, parts.objective.clipper))
    json.dumps(metrics)  # what metrics.jsonl writes


@pytest.mark.parametrize("preset", ["gspo", "dapo"])
def test_built_in_objectives_declare_the_extremes(preset):
    objective = build_objective({"preset": preset})
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    _, metrics = objective(logp, logp - 0.1, torch.ones(2, 2), torch.ones(2, 2))
    assert type(metrics["ratio/min"]) is Min and type(metrics["ratio/max"]) is Max
