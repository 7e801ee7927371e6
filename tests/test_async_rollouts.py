"""``rollout.max_staleness: k`` (rlzoo.rl.async_rollouts): with k = 0 the queue (generating in lockstep, in the
trainer's thread) reproduces the synchronous loop bit for bit; with k > 0 every batch is sampled by weights at most k versions old, its old log-probs are the
trainer's current weights (the proximal policy) and its rollout log-probs the sampling weights' (the behaviour
policy); the gate holds under random delays (property test); preflight refuses what the producer cannot honour."""

from __future__ import annotations

import math
import random
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_testlib import same, start_rig, state

from rlzoo.config.resolution import build_config
from rlzoo.errors import ConfigError
from rlzoo.preflight.checks import preflight
from rlzoo.registry import default_registry
from rlzoo.rl.async_rollouts import AsyncRollouts
from rlzoo.rl.learner import Learner
from rlzoo.rl.schedule import RolloutSchedule
from rlzoo.rl.staleness_queue import StalenessQueue


class WatchedLearner(Learner):
    """Keeps each step's old log-probs and the trainer's weights after each step (``history[t]`` = w_t)."""

    def old_logprobs(self, batch, rollout_logp, rollout_routing):
        logp, entropy = super().old_logprobs(batch, rollout_logp, rollout_routing)
        self.seen.append((batch, logp, rollout_logp))
        return logp, entropy

    def capture_weights(self, every_rank=False):
        self.history.append(state(self.engine.model))
        return super().capture_weights(every_rank)

    def push_weights(self, rollout, every_rank=False):
        self.history.append(state(self.engine.model))
        super().push_weights(rollout, every_rank)


def _run(tmp_path, max_staleness: int | None, steps: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    rig = start_rig(tmp_path, steps, max_staleness=max_staleness)
    learner = WatchedLearner(rig.trainer)
    learner.seen, learner.history = [], [state(rig.trainer.model)]
    schedule = RolloutSchedule()
    if max_staleness is not None:
        schedule = AsyncRollouts(rig.prompts_for, steps, max_staleness, max(max_staleness, 1))
    metrics = rig.run(learner, schedule)
    return rig.trainer, rig.rollout, learner, metrics


def _without_times(metrics: dict[str, float]) -> dict[str, float]:
    added = {"rollout/staleness", "rollout/ready"}
    return {k: v for k, v in metrics.items() if not k.startswith("time/") and k not in added}


def test_staleness_zero_is_the_synchronous_loop_bit_for_bit(tmp_path):
    sync_trainer, _, _, sync_metrics = _run(tmp_path / "sync", None)
    async_trainer, _, _, async_metrics = _run(tmp_path / "async", 0)
    assert [m["rollout/staleness"] for m in async_metrics] == [0.0] * 4
    assert [m["rollout/ready"] for m in async_metrics] == [0.0] * 4  # nothing sampled before its step asks
    assert all("time/rollout_wait" in m for m in async_metrics)
    for sync, produced in zip(sync_metrics, async_metrics, strict=True):
        a, b = _without_times(sync), _without_times(produced)
        assert a.keys() == b.keys()
        assert all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a), {
            k: (a[k], b[k]) for k in a if a[k] != b[k]
        }
    assert same(state(sync_trainer.model), state(async_trainer.model))


@pytest.mark.parametrize("k", [1, 2])
def test_batches_are_sampled_at_most_k_versions_back_and_old_logprobs_are_the_proximal_policy(tmp_path, k):
    steps = 4
    trainer, rollout, learner, metrics = _run(tmp_path, k, steps=steps)
    history = learner.history  # w_0 .. w_steps
    staleness = [int(m["rollout/staleness"]) for m in metrics]
    assert all(0 <= s <= k for s in staleness) and max(staleness) > 0
    assert len(rollout.sampled_with) == steps
    for step, (batch, old, rollout_logp) in enumerate(learner.seen):
        behaviour = step - staleness[step]
        sampled = rollout.sampled_with[step]
        assert same({key: history[behaviour][key] for key in sampled}, sampled)  # the version it reports
        # the old pass ran under the trainer's weights of this step (proximal), not the sampling ones
        with torch.no_grad():
            current = state(trainer.model)
            trainer.model.load_state_dict(history[step])
            proximal = trainer.logprobs(batch)
            trainer.model.load_state_dict(current)
        assert torch.allclose(old, proximal, atol=1e-6)
        mask = batch.response_mask.bool()
        if behaviour != step:  # the behaviour log-probs are the sampling weights': they differ from the proximal
            assert (old - rollout_logp).abs()[mask].max() > 1e-4


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(0, 3),
    capacity=st.integers(1, 4),
    steps=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_the_gate_never_lets_staleness_exceed_k_and_no_batch_is_taken_twice(k, capacity, steps, seed):
    rng = random.Random(seed)
    delays = [rng.choice([0.0, 0.0005, 0.002]) for _ in range(4 * steps)]
    loaded: list[int] = []
    generated: list[tuple[int, int]] = []
    lock = threading.Lock()

    def generate(index: int, version: int) -> tuple[int, int]:
        time.sleep(delays[index])
        with lock:
            generated.append((index, version))
        return (index, version)

    def load(update: int) -> None:
        loaded.append(update)

    queue: StalenessQueue[tuple[int, int], int] = StalenessQueue(generate, load, 0, steps, k, capacity)
    taken = []
    try:
        for step in range(steps):
            got = queue.take(step)
            assert got.item[0] == step and got.version == got.item[1]
            assert 0 <= step - got.version <= k
            assert got.ready <= capacity
            taken.append(step)
            time.sleep(delays[steps + step])
            queue.publish(step + 1, step + 1 if rng.random() < 0.8 else None)
            if rng.random() < 0.3:
                with queue.paused():
                    pass
    finally:
        queue.close()
    assert taken == list(range(steps))
    indices = [index for index, _ in generated]
    assert len(indices) == len(set(indices))  # each batch generated once
    assert loaded == sorted(loaded)  # versions only go forward


def test_a_producer_error_reaches_the_trainer():
    def generate(index: int, version: int) -> int:
        raise ValueError("generation broke")

    queue: StalenessQueue[int, int] = StalenessQueue(generate, lambda update: None, 0, 3, 1, 1)
    with pytest.raises(ValueError, match="generation broke"):
        queue.take(0)
    queue.close()


@pytest.mark.parametrize(
    "overrides, world, loc, message",
    [
        (["rollout.max_staleness=1", "rollout.overlap=1"], 1, "rollout.max_staleness", "not with rollout.overlap"),
        (["rollout.max_staleness=1", "rollout.queue_size=3"], 1, "rollout.queue_size", "less than one step's batch"),
        (["rollout.queue_size=64"], 1, "rollout.queue_size", "only with rollout.max_staleness"),
    ],
)
def test_preflight_refuses_what_the_producer_cannot_honour(overrides, world, loc, message, tmp_path):
    registry = default_registry()
    config = build_config(
        {"rollout": {"prompts_per_step": 2, "group_size": 4}}, [*overrides, f"output_dir={tmp_path / 'run'}"], registry
    )
    with pytest.raises(ConfigError) as err:
        preflight(config, registry, world=world)
    assert any(at == loc and message in text for at, text in err.value.problems), err.value.problems


def test_preflight_takes_a_producer_on_every_rank_of_several_processes(tmp_path):
    """Several processes: a producer thread on each rank that samples (integration_tests/test_async_multiprocess.py)."""
    registry = default_registry()
    overrides = [
        "rollout.max_staleness=2",
        "rollout.partial=continue",
        "trainer.engine={name: deepspeed, zero_stage: 3}",
    ]
    config = build_config({}, [*overrides, f"output_dir={tmp_path / 'run'}"], registry)
    preflight(config, registry, world=2)


def test_a_bare_yaml_off_is_partial_off():
    """YAML 1.1 reads ``partial: off`` (as the docs write it) as false."""
    assert build_config({}, ["rollout.max_staleness=1", "rollout.partial=off"]).rollout.partial == "off"
    with pytest.raises(ConfigError, match="rollout.partial"):
        build_config({}, ["rollout.max_staleness=1", "rollout.partial=on"])


@pytest.mark.parametrize("value", ["-1", "two"])
def test_a_negative_or_non_integer_staleness_is_a_config_error(value):
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        build_config({}, [f"rollout.max_staleness={value}"])


BETWEEN_BATCHES = '''
import rlzoo
from rlzoo.engines import HFRolloutEngine


@rlzoo.register("rollout_engine", "between-batches")
class BetweenBatches(HFRolloutEngine):
    """A third party's engine that loads weights between batches only (no updates_in_flight)."""

    updates_in_flight = False
'''


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["rollout.max_staleness=-1"], "rollout.max_staleness"),
        (["rollout.max_staleness=2", "rollout.queue_size=8"], "rollout.queue_size"),
        (
            ["rollout.max_staleness=2", "rollout.partial=continue", "rollout.engine={name: between-batches}"],
            "rollout.partial",
        ),
    ],
)
def test_rlzoo_train_refuses_bad_async_settings_in_one_line(tmp_path, overrides, field):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "gspo_tiny_moe.yaml"
    found = shutil.which("rlzoo")
    command = [found] if found else [sys.executable, "-m", "rlzoo.cli"]
    (tmp_path / "between_batches.py").write_text(BETWEEN_BATCHES)
    sets = [arg for o in [*overrides, f"output_dir={tmp_path / 'run'}"] for arg in ("--set", o)]
    proc = subprocess.run(
        [*command, "train", str(example), *sets, "--plugin", "between_batches.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and field in proc.stderr
    assert not (tmp_path / "run").exists()  # refused before anything is written
