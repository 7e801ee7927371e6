"""Every preset runs with each Routing Replay policy, on the transformers-MoE and DeepSpeed-MoE training paths,
and logs the MoE diagnostics; replay pins the experts of every update pass (moe/flip_rate exactly 0)."""

from __future__ import annotations

import importlib.util

import pytest
from runs_testlib import assert_finite_metrics, make_config, preset_needs

from rlzoo import hookimpl
from rlzoo.config.presets import PRESETS
from rlzoo.interfaces import RecordedRouting, RouterPolicy
from rlzoo.registry import Registry
from rlzoo.runtime.run import train

TRAINERS = {
    "torch": [],
    "deepspeed-moe": ["trainer.engine={name: deepspeed, zero_stage: 2, moe: deepspeed}"],
}
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")


def train_rows(tmp_path, cold_start_root, *overrides):
    # lr 1e-2 moves the router enough for experts to flip between minibatches. It can also collapse the tiny
    # policy so that dapo's dynamic sampling finds no informative group and skips an update: every step must train
    overrides = ("algorithm.batch_filter={name: none}", *overrides)
    config = make_config(
        tmp_path, cold_start_root, "trainer.lr=1e-2", "algorithm.minibatches_per_rollout=4", *overrides
    )
    run_dir = train(config, progress=False)
    return [r for r in assert_finite_metrics(run_dir, config.train.steps) if "reward/mean" in r]


# every (policy, training engine) pair, in turn: each preset runs by default with one of them, so each pair runs by
# default with about a quarter of the presets and every preset runs end to end by default (the default cases of
# test_preset_runs_end_to_end are a few: this is their every-preset run); its other three pairs are `slow`
DEFAULT_PAIRS = [
    ("replay-old", "torch"),
    ("replay-rollout", "deepspeed-moe"),
    ("replay-rollout", "torch"),
    ("replay-old", "deepspeed-moe"),
]


def preset_policy_trainer_cases() -> list:
    cases = []
    for i, preset in enumerate(sorted(PRESETS)):
        for policy in ("replay-old", "replay-rollout"):
            for trainer in TRAINERS:
                marks = [needs_deepspeed] if trainer != "torch" else []
                if (policy, trainer) != DEFAULT_PAIRS[i % len(DEFAULT_PAIRS)]:
                    marks.append(pytest.mark.slow)  # the same policy and engine run by default with other presets
                cases.append(pytest.param(preset, policy, trainer, marks=marks))
    return cases


@pytest.mark.parametrize("preset, policy, trainer", preset_policy_trainer_cases())
def test_preset_with_router_policy(preset, policy, trainer, tmp_path, cold_start_root):
    rows = train_rows(
        tmp_path,
        cold_start_root,
        f"algorithm.preset={preset}",
        f"algorithm.router.name={policy}",
        *TRAINERS[trainer],
        *preset_needs(preset),
    )
    for row in rows:
        assert row["moe/flip_rate"] == 0.0  # the update passes used exactly the replayed experts
        assert row["moe/replay_bytes"] > 0
        # R3 needs the rollout's experts, so the rollout records them; replay-old does not, so it records nothing
        assert ("moe/rollout_train_disagreement" in row) == (policy == "replay-rollout")
    if policy == "replay-rollout":
        assert all(r["moe/rollout_train_disagreement_replayed"] == 0.0 for r in rows)
        assert all(r["mismatch/abs_logp_diff"] <= r["mismatch/abs_logp_diff_no_replay"] + 1e-7 for r in rows)
    # the router kept moving underneath: without replay these experts would have flipped
    assert any(r["moe/fresh_flip_rate"] > 0 for r in rows)


@pytest.mark.parametrize("trainer", [pytest.param(t, marks=needs_deepspeed) if t != "torch" else t for t in TRAINERS])
def test_without_replay_experts_flip_and_diagnostics_are_logged(trainer, tmp_path, cold_start_root):
    diagnostics = "rollout.engine={name: hf, record_routing: true}"  # the rollout's experts: asked for, not needed
    rows = train_rows(tmp_path, cold_start_root, "algorithm.preset=gspo", diagnostics, *TRAINERS[trainer])
    assert all("moe/flip_rate" in r and "moe/rollout_train_disagreement" in r for r in rows)
    assert any(r["moe/flip_rate"] > 0 for r in rows)
    assert all("moe/replay_bytes" not in r for r in rows)


def test_replay_on_a_dense_model_is_a_clear_error(tmp_path, cold_start_root):
    from rlzoo.errors import RlzooError

    config = make_config(
        tmp_path,
        cold_start_root,
        "model.tiny.architecture=qwen3",
        "algorithm.router.name=replay-old",
        task="arithmetic-dense",
    )
    with pytest.raises(RlzooError, match="mixture-of-experts"):
        train(config, progress=False)


class ReplaySecondHalf(RouterPolicy):
    """Routing Replay of the old pass's experts in the second half of the MoE layers only (a third party's policy)."""

    name = "replay-second-half"

    def replays_routing(self) -> bool:
        return True

    def update_routing(self, recorded: RecordedRouting):
        layers = recorded.old.layers
        return recorded.old.only_layers(layers[len(layers) // 2 :])


class SecondHalfPlugin:
    @hookimpl
    def rlzoo_router_policies(self):
        return [ReplaySecondHalf]


@pytest.mark.parametrize(  # DeepSpeed-MoE: slow; its replay of recorded routing runs by default in the preset cases
    "trainer", ["torch", pytest.param("deepspeed-moe", marks=[needs_deepspeed, pytest.mark.slow])]
)
def test_a_plugin_policy_replays_only_some_layers(trainer, tmp_path, cold_start_root):
    registry = (
        Registry.discover()
    )  # its own: the process's default registry (the CLI's, other tests') stays as installed
    registry.add_plugin(SecondHalfPlugin(), name="second-half", distribution="test-plugin")
    config = make_config(
        tmp_path,
        cold_start_root,
        "trainer.lr=1e-2",
        "algorithm.minibatches_per_rollout=4",
        "train.steps=4",
        "algorithm.router.name=replay-second-half",
        *TRAINERS[trainer],
        registry=registry,
    )
    run_dir = train(config, registry=registry, progress=False)
    rows = [r for r in assert_finite_metrics(run_dir, config.train.steps) if "reward/mean" in r]
    assert all(r["moe/flip_rate/layer_1"] == 0.0 for r in rows)  # replayed
    assert any(r["moe/flip_rate/layer_0"] > 0.0 for r in rows)  # routed afresh: its experts flip
    assert all(0.0 < r["moe/flip_rate"] < r["moe/flip_rate/layer_0"] for r in rows if r["moe/flip_rate/layer_0"] > 0)
    assert any(r["moe/fresh_flip_rate"] > 0 for r in rows)


def test_the_rollout_records_routing_only_when_needed(tmp_path, cold_start_root):
    """Without R3 or a request, generation runs without capture hooks: no rollout routing, no diagnostics of it."""
    rows = train_rows(tmp_path, cold_start_root, "algorithm.preset=gspo")
    assert all("moe/flip_rate" in r and "moe/rollout_train_disagreement" not in r for r in rows)
