"""The template's clipper: found by name, its parameters validated, and the loss and gradient its docstring states."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import rlzoo
from rlzoo.errors import ConfigError
from rlzoo.registry import default_registry


def test_registered_under_its_name_by_this_distribution():
    info = default_registry().get("clipper", "capped-is")
    assert info.distribution == "rlzoo-plugin-template"


def test_a_bad_parameter_names_the_field():
    with pytest.raises(ConfigError) as info:
        default_registry().create("clipper", "capped-is", {"eps_hi": 0.3}, loc="algorithm.clipper")
    assert info.value.problems[0][0] == "algorithm.clipper.eps_hi"
    assert "did you mean 'eps_high'?" in info.value.problems[0][1]


def test_loss_is_the_capped_weight_and_every_token_keeps_its_gradient():
    objective = rlzoo.build_objective(
        {"ratio": {"name": "token"}, "clipper": {"name": "capped-is"}, "aggregation": {"name": "token-mean"}}
    )
    old = torch.zeros(1, 3)
    logp = torch.tensor([[1.0, 0.0, -1.0]], requires_grad=True)  # ratios e, 1, 1/e
    advantages = torch.ones(1, 3)
    loss, metrics = objective(logp, old, advantages, torch.ones(1, 3))
    loss.backward()
    weights = torch.tensor([1.2, 1.0, 0.8])
    assert loss.item() == pytest.approx(-weights.mean().item())
    assert logp.grad.flatten().tolist() == pytest.approx((-weights / 3).tolist())
    assert metrics["clip/fraction"] == 0.0


def test_config_check_accepts_it(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("algorithm:\n  preset: dapo\n  clipper: {name: capped-is, eps_high: 0.28}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", "config", "check", str(config)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "name: capped-is" in proc.stdout
