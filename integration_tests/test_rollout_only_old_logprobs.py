"""``algorithm.old_logprobs: rollout-only``: the rollout engine's log-probs are the old ones and the training engine's
old-log-prob pass is skipped; the updates are exactly those of ``old_logprobs: rollout``, which runs the pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pydantic import Field
from runs_testlib import assert_finite_metrics, make_config
from safetensors.torch import load_file

import rlzoo
from rlzoo.errors import ConfigError
from rlzoo.interfaces import Params, RouterPolicy
from rlzoo.preflight.checks import preflight
from rlzoo.registry import Registry, default_registry
from rlzoo.rl.learner import Learner
from rlzoo.runtime.checkpoint.files import latest_checkpoint
from rlzoo.runtime.run import train


def _run(tmp_path, cold_start_root, mode, *overrides):
    config = make_config(tmp_path / mode, cold_start_root, f"algorithm.old_logprobs={mode}", *overrides)
    run_dir = train(config, progress=False)
    rows = assert_finite_metrics(run_dir, config.train.steps)
    weights = load_file(latest_checkpoint(run_dir) / "model" / "model.safetensors")
    return [r for r in rows if "reward/mean" in r], weights


@pytest.mark.parametrize("router", ["none", "replay-rollout"])
def test_rollout_only_trains_exactly_like_rollout_without_the_pass(router, tmp_path, cold_start_root, monkeypatch):
    passes = []
    original = Learner.logprobs_and_entropy

    def counting(self, batch):
        passes.append(batch.input_ids.shape[0])
        return original(self, batch)

    monkeypatch.setattr(Learner, "logprobs_and_entropy", counting)
    router_set = f"algorithm.router={{name: {router}}}"
    with_pass, weights_with = _run(tmp_path, cold_start_root, "rollout", router_set)
    made = len(passes)
    without_pass, weights_without = _run(tmp_path, cold_start_root, "rollout-only", router_set)
    assert made > 0 and len(passes) == made  # the rollout-only run made no training-engine old pass
    for a, b in zip(with_pass, without_pass, strict=True):
        for key in ("reward/mean", "loss/policy", "clip/fraction", "ratio/mean"):
            assert a[key] == b[key], key  # same samples, same old log-probs, same updates
        assert "mismatch/abs_logp_diff" in a and "policy/entropy" in a
        assert not any(k.startswith("mismatch/") for k in b) and "policy/entropy" not in b
        if router == "replay-rollout":
            assert b["moe/flip_rate"] == 0.0 and b["moe/replay_bytes"] > 0
    assert weights_with.keys() == weights_without.keys()
    assert all(torch.equal(weights_with[k], weights_without[k]) for k in weights_with)
    cold = load_file(cold_start_root / "arithmetic" / "model.safetensors")
    assert any(not torch.equal(cold[k], weights_without[k]) for k in cold)  # the runs did train


@pytest.mark.parametrize(
    "override, field",
    [
        ("algorithm.correction={name: tis}", "algorithm.correction.name"),
        ("algorithm.router={name: replay-old}", "algorithm.router.name"),
    ],
)
def test_preflight_rejects_what_needs_the_skipped_pass(override, field, tmp_path, cold_start_root):
    config = make_config(tmp_path / "run", cold_start_root, "algorithm.old_logprobs=rollout-only", override)
    with pytest.raises(ConfigError) as caught:
        preflight(config, default_registry())
    assert field in str(caught.value) and "rollout-only" in str(caught.value)
    # the same config with the pass is accepted (as far as this check goes)
    config = make_config(tmp_path / "run", cold_start_root, "algorithm.old_logprobs=rollout", override)
    preflight(config, default_registry())


class LayerSubset(RouterPolicy):
    """A third party's policy: replays the rollout's experts in the layers named (a parameter with no default)."""

    name = "regtest-layers"
    source = "rollout"

    class Params(Params):
        layers: list[int] = Field(description="MoE layers to replay (no default)")


def test_preflight_suggests_only_router_policies_it_can_build(tmp_path, cold_start_root):
    """A policy that cannot be built without parameters is left out of the suggestions, not a traceback."""
    registry = Registry.discover()  # its own: the shared default registry must not see the extra policy
    registry.add_plugin(
        SimpleNamespace(rlzoo_router_policies=rlzoo.hookimpl(lambda: [LayerSubset])), name="p", distribution="regtest"
    )
    config = make_config(
        tmp_path / "run", cold_start_root, "algorithm.old_logprobs=rollout-only", "algorithm.router={name: replay-old}"
    )
    with pytest.raises(ConfigError) as caught:
        preflight(config, registry)
    message = str(caught.value)
    assert "algorithm.router.name" in message and "'replay-rollout'" in message and "regtest-layers" not in message
    dense = make_config(
        tmp_path / "dense",
        cold_start_root,
        "model.tiny.architecture=qwen3",
        "algorithm.router={name: replay-old}",
        task="arithmetic-dense",
    )
    with pytest.raises(ConfigError) as caught:
        preflight(dense, registry)
    assert "'none'" in str(caught.value) and "regtest-layers" not in str(caught.value)
