"""A third party's plugin, pip-installed into a fresh virtual environment, is found and usable by name.

The venv is layered over the environment running the tests (rlzoo and its first-party plugins are installed
there) and gets more distributions, among them ``rlzoo-myplug``, built from a throwaway source tree with that
environment's own pip and setuptools (tests/venv_testlib.py; one venv per session, shared with the tests of the
third-party engines, tool and the plugin template). Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from venv_testlib import PluginVenv, make_distribution, pip_install, run

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def venv(plugin_venv: PluginVenv) -> Path:
    """The session's venv (tests/conftest.py), with ``rlzoo-myplug`` installed; its python."""
    plugin_venv.assert_installed_here("rlzoo_myplug")
    return plugin_venv.python


def rlzoo_cli(python: Path, *args, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run([python, "-m", "rlzoo.cli", *args], env=env, cwd=cwd)


def test_installed_plugin_is_listed_with_its_distribution(venv, tmp_path):
    proc = rlzoo_cli(venv, "plugins", "list", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    rows = json.loads(proc.stdout)
    mine = [r for r in rows if r["name"] == "half-clip"]
    assert mine == [
        {
            "kind": "clipper",
            "name": "half-clip",
            "distribution": "rlzoo-myplug",
            "plugin": "myplug",
            "summary": "Half clip: loss = -scale * rho * A (a test plugin's clipper).",
            "duplicate": False,
        }
    ]
    # the first-party components are still there beside it
    assert {("clipper", "ppo"), ("ratio", "sequence")} <= {(r["kind"], r["name"]) for r in rows}


SNIPPET = """
import contextlib, io, json, sys

import torch

import rlzoo
from rlzoo.cli import main

out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["config", "check", sys.argv[1]])
objective = rlzoo.build_objective(
    {"ratio": {"name": "token"}, "clipper": {"name": "half-clip", "scale": 0.25}, "aggregation": {"name": "token-mean"}}
)
logp = torch.zeros(2, 2, requires_grad=True)
advantages = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
loss, metrics = objective(logp, logp.detach(), advantages, torch.ones(2, 2))
loss.backward()
print(json.dumps({
    "rc": rc,
    "resolved": out.getvalue(),
    "clipper": type(objective.clipper).__module__,
    "loss": loss.item(),
    "grad": logp.grad.tolist(),
}))
"""


def test_installed_plugin_is_usable_by_name(venv, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("algorithm:\n  preset: gspo\n  clipper: {name: half-clip, scale: 0.25}\n")
    proc = run([venv, "-c", SNIPPET, config], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # `rlzoo config check` accepts the third-party name and resolves it (the preset's ppo params dropped)
    assert result["rc"] == 0, proc.stderr
    resolved = yaml.safe_load(result["resolved"])
    assert resolved["algorithm"]["clipper"] == {"name": "half-clip", "scale": 0.25}
    assert resolved["algorithm"]["ratio"]["name"] == "sequence"
    # build_objective composes it: ratio 1 everywhere, loss = -0.25 * mean(A) = -0.25 * 1.25
    assert result["clipper"] == "rlzoo_myplug.plugin"
    assert result["loss"] == pytest.approx(-0.3125)
    assert sum(result["grad"], []) == pytest.approx([-0.0625, -0.125, -0.1875, 0.0625])


def test_second_distribution_claiming_a_taken_name_is_an_error_naming_both(venv, tmp_path):
    # a second third-party distribution registering the built-in clipper name `ppo`; installed on the side
    # (--target + PYTHONPATH) so the shared venv stays clean for the other tests
    source = make_distribution(tmp_path / "src", "rlzoo-dupplug", "rlzoo_dupplug", "dupplug", "ppo")
    site = tmp_path / "site"
    pip_install(venv, "--target", site, source)
    assert any(p.name.startswith("rlzoo_dupplug-") and p.suffix == ".dist-info" for p in site.iterdir())
    env = {**os.environ, "PYTHONPATH": str(site)}
    # every command still works: both registrations are listed, marked
    proc = rlzoo_cli(venv, "plugins", "list", "--json", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ppo = [
        (r["distribution"], r["duplicate"])
        for r in json.loads(proc.stdout)
        if r["kind"] == "clipper" and r["name"] == "ppo"
    ]
    assert sorted(ppo) == [("rlzoo-dupplug", True), ("rlzoo-estimators", True)]
    text = rlzoo_cli(venv, "plugins", "list", env=env, cwd=tmp_path)
    assert text.returncode == 0 and text.stdout.count("registered twice") == 2
    # a config that does not name ppo is fine; one that does fails, naming both distributions
    unaffected = tmp_path / "cispo.yaml"
    unaffected.write_text("algorithm:\n  preset: cispo\n")
    assert rlzoo_cli(venv, "config", "check", unaffected, env=env, cwd=tmp_path).returncode == 0
    uses = tmp_path / "ppo.yaml"
    uses.write_text("algorithm:\n  preset: gspo\n  clipper: {name: ppo}\n")
    proc = rlzoo_cli(venv, "config", "check", uses, env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "algorithm.clipper" in proc.stderr and "'ppo'" in proc.stderr
    assert "rlzoo-estimators" in proc.stderr and "rlzoo-dupplug" in proc.stderr


def test_a_plugin_failing_at_set_up_is_a_plain_message_naming_field_component_and_distribution(venv, tmp_path):
    source = make_distribution(tmp_path / "src", "rlzoo-fragile", "rlzoo_fragile", "fragile", "fragile-clip")
    site = tmp_path / "site"
    pip_install(venv, "--target", site, source)
    env = {**os.environ, "PYTHONPATH": str(site)}
    config = tmp_path / "run.yaml"
    config.write_text("algorithm:\n  preset: gspo\n  clipper: {name: fragile-clip}\n")
    # (train refuses it alike: it runs the same preflight first, tests/test_bad_configs.py)
    proc = rlzoo_cli(venv, "config", "check", config, env=env, cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    expected = (
        "algorithm.clipper: clipper 'fragile-clip' (rlzoo-fragile) failed to set up: RuntimeError: this clipper "
        "needs a GPU"
    )
    assert expected in proc.stderr, proc.stderr
