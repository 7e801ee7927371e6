"""``rollout.overlap: 1`` (rlzoo.rl.overlap): each batch after the first is sampled by the previous step's weights, and
its old log-probs are those weights' log-probs, not the trainer's current ones; the exchange of weights restores
the trainer exactly; preflight rejects what overlap cannot honour."""

from __future__ import annotations

import pytest
import torch
from schedule_testlib import same, start_rig, state

from rlzoo.config.resolution import build_config
from rlzoo.engines import ModuleTrainingEngine
from rlzoo.errors import ConfigError
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry
from rlzoo.rl.learner import Learner
from rlzoo.rl.overlap import OverlappedRollouts
from rlzoo.rl.schedule import RolloutSchedule
from rlzoo.util.timer import Timer


class WatchedLearner(Learner):
    """Keeps each step's old log-probs and the trainer's weights before each step (``history[t]`` = w_t)."""

    def old_logprobs(self, batch, rollout_logp, rollout_routing):
        logp, entropy = super().old_logprobs(batch, rollout_logp, rollout_routing)
        self.seen.append((batch, logp))
        return logp, entropy

    def push_weights(self, rollout, every_rank=False):
        self.history.append(state(self.engine.model))
        super().push_weights(rollout, every_rank)


def _run(tmp_path, overlap: int, steps: int = 3):
    rig = start_rig(tmp_path, steps, overlap=overlap)
    learner = WatchedLearner(rig.trainer)
    learner.seen, learner.history = [], [state(rig.trainer.model)]
    schedule = OverlappedRollouts(rig.trainer, rig.prompts_for, steps) if overlap else RolloutSchedule()
    metrics = rig.run(learner, schedule)
    return rig.trainer, rig.rollout, learner, schedule, metrics


def _logprobs_under(trainer, weights, batch):
    current = state(trainer.model)
    trainer.model.load_state_dict(weights)
    try:
        return trainer.logprobs(batch)
    finally:
        trainer.model.load_state_dict(current)


def test_old_logprobs_are_those_of_the_weights_that_sampled_the_batch(tmp_path):
    steps = 3
    trainer, rollout, learner, schedule, metrics = _run(tmp_path, overlap=1, steps=steps)
    history = learner.history  # w_0 .. w_steps
    assert len(history) == steps + 1 and not same(history[0], history[1]) and not same(history[1], history[2])
    assert schedule.versions == {0: 0, 1: 0, 2: 1}  # batch 0 sampled now, batch t+1 during step t by w_t
    assert [m["rollout/staleness"] for m in metrics] == [0.0, 1.0, 1.0]
    assert len(rollout.sampled_with) == steps
    for step, (batch, old) in enumerate(learner.seen):
        sampler = schedule.versions[step]
        # the rollout engine sampled batch `step` with w_sampler (the trainer's fp32 weights it was last synced with)
        assert same({k: history[sampler][k] for k in rollout.sampled_with[step]}, rollout.sampled_with[step])
        assert torch.allclose(old, _logprobs_under(trainer, history[sampler], batch), atol=1e-6)
        if sampler != step:  # stale: the trainer held w_step, whose log-probs differ
            now = _logprobs_under(trainer, history[step], batch)
            assert (old - now).abs()[batch.response_mask.bool()].max() > 1e-4
    assert same(state(trainer.model), history[steps])  # the exchange put the trainer's weights back every time


def test_without_overlap_old_logprobs_are_the_current_weights(tmp_path):
    trainer, rollout, learner, schedule, metrics = _run(tmp_path, overlap=0, steps=2)
    assert all("rollout/staleness" not in m and "time/prefetch_wait" not in m for m in metrics)
    for step, (batch, old) in enumerate(learner.seen):
        assert same({k: learner.history[step][k] for k in rollout.sampled_with[step]}, rollout.sampled_with[step])
        assert torch.allclose(old, _logprobs_under(trainer, learner.history[step], batch), atol=1e-6)


class ModuleOnly(ModuleTrainingEngine):
    """An in-process module and nothing else: what the overlap asks of a training engine is its weight copies."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self._model = module

    @property
    def model(self) -> torch.nn.Module:
        return self._model


def test_behaviour_weights_exchange_and_restore_exactly():
    model = torch.nn.Linear(3, 2)
    schedule = OverlappedRollouts(ModuleOnly(model), lambda step: [], steps=10)
    w0 = state(model)
    with schedule.behaviour_weights():  # a fresh batch: nothing exchanged; the snapshot takes w0
        assert same(state(model), w0)
    with torch.no_grad():
        model.weight.add_(1.0)
    w1 = state(model)
    schedule.settle(Timer(), new_weights=True)
    schedule.batch_version = 0  # a batch sampled by w0, trained from w1
    with schedule.behaviour_weights():
        assert same(state(model), w0)
    assert same(state(model), w1)
    assert all(torch.equal(s, p) for s, p in zip(schedule.snapshot, model.parameters()))  # next: w1's batch
    schedule.batch_version = -1
    with pytest.raises(RuntimeError, match="staleness above 1"):
        with schedule.behaviour_weights():
            pass


def test_a_failed_background_generation_surfaces_in_the_step():
    schedule = OverlappedRollouts(ModuleOnly(torch.nn.Linear(1, 1)), lambda step: [], steps=10)

    def broken(*_):
        raise ValueError("sampler broke")

    import rlzoo.rl.overlap as overlap

    original, overlap.collect = overlap.collect, broken
    try:
        schedule._launch(1, None)
        with pytest.raises(ValueError, match="sampler broke"):
            schedule.settle(Timer())
    finally:
        overlap.collect = original


@pytest.mark.parametrize(
    ("overrides", "world", "message"),
    [
        (["rollout.overlap=1"], 2, "one process only"),
        (["rollout.overlap=1", "trainer.engine={name: deepspeed, zero_stage: 3}"], 1, "ZeRO-3"),
    ],
)
def test_preflight_rejects_overlap_it_cannot_honour(overrides, world, message, tmp_path):
    registry = default_registry()
    try:
        config = build_config({}, [*overrides, f"output_dir={tmp_path / 'run'}"], registry)
    except ConfigError as err:  # deepspeed not installed: its params cannot even be validated
        pytest.skip(str(err))
    with pytest.raises(ConfigError) as err:
        preflight(config, registry, world=world)
    assert any(loc == "rollout.overlap" and message in text for loc, text in err.value.problems)


def test_overlap_above_one_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout.overlap"):
        build_config({}, ["rollout.overlap=2"])
