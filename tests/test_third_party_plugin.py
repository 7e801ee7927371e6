"""A third party's plugin, pip-installed into a fresh virtual environment, is found and usable by name.

The venv is layered over the environment running the tests (rlzoo and its first-party plugins are installed
there) and gets one more distribution, ``rlzoo-myplug``, built from a throwaway source tree with that environment's
own pip and setuptools. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.timeout(300)

PLUGIN_SOURCE = '''
"""A third-party rlzoo plugin used by the tests: one clipper."""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params


class HalfClip(Clipper):
    """Half clip: loss = -scale * rho * A (a test plugin's clipper)."""

    name = "{name}"

    class Params(Params):
        scale: float = Field(0.5, gt=0)

    def __init__(self, params=None) -> None:
        super().__init__(params)
        if self.name == "fragile-clip":  # the set-up failure of test_a_plugin_failing_at_set_up_...
            raise RuntimeError("this clipper needs a GPU")

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=-self.params.scale * ratio * advantages, clipped_low=never, clipped_high=never)


@rlzoo.hookimpl
def rlzoo_clippers() -> list[type]:
    return [HalfClip]
'''


def make_distribution(root: Path, dist: str, package: str, entry_point: str, clipper_name: str) -> Path:
    source = root / dist
    (source / package).mkdir(parents=True)
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{dist}"
            version = "0.0.1"
            dependencies = ["rlzoo"]

            [project.entry-points.rlzoo]
            {entry_point} = "{package}.plugin"

            [tool.setuptools.packages.find]
            include = ["{package}*"]
            """
        )
    )
    (source / package / "__init__.py").write_text("")
    (source / package / "plugin.py").write_text(PLUGIN_SOURCE.replace("{name}", clipper_name))
    return source


def run(args: list, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=240, env=env, cwd=cwd)


def pip_install(python: Path, *args) -> None:
    proc = run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", *args])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def layered_venv(env_dir: Path) -> Path:
    """A venv whose interpreter also sees every site-packages folder of the running one; returns its python.

    ``venv --system-site-packages`` is not enough: made from a venv's python it exposes the *base* interpreter's
    site-packages (no rlzoo there, and an old setuptools without ``bdist_wheel``), not the test venv's. A ``.pth``
    line that calls ``site.addsitedir`` adds the running interpreter's folders after the new venv's own, with their
    ``.pth`` files processed (editable installs), so a distribution installed into the new venv is found first and
    pip, setuptools and rlzoo come from the test environment. No pip of its own (``--without-pip``): the test
    environment's pip, run by the new interpreter, installs into the new venv.
    """
    proc = run([sys.executable, "-m", "venv", "--without-pip", env_dir])
    assert proc.returncode == 0, proc.stderr
    python = env_dir / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "_rlzoo_test_outer.pth").write_text(f"import site; list(map(site.addsitedir, {outer!r}))\n")
    return python


def venv_with_distribution(root: Path, source: Path, module: str) -> Path:
    """A copy of the distribution folder ``source`` installed into a venv layered over the test environment, in
    ``root``; returns the venv's python, after checking that ``module`` imports from the new venv."""
    copy = root / "src"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    python = layered_venv(root / "venv")
    pip_install(python, copy)
    where = run([python, "-c", f"import {module}; print({module}.__file__)"]).stdout
    assert where.strip().startswith(str(root / "venv")), where  # installed into the new venv, not the test environment
    return python


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv layered over the test environment with ``rlzoo-myplug`` installed; returns its python."""
    import setuptools

    # a wheel built with --no-build-isolation uses the environment's setuptools; bdist_wheel is built in from 70.1
    assert tuple(int(x) for x in setuptools.__version__.split(".")[:2]) >= (70, 1), (
        f"setuptools {setuptools.__version__} cannot build wheels without the `wheel` package: "
        "install the test tools with `bash scripts/install.sh --test`"
    )
    root = tmp_path_factory.mktemp("thirdparty")
    python = layered_venv(root / "venv")
    source = make_distribution(root / "src", "rlzoo-myplug", "rlzoo_myplug", "myplug", "half-clip")
    pip_install(python, source)
    where = run([python, "-c", "import rlzoo_myplug; print(rlzoo_myplug.__file__)"]).stdout.strip()
    assert where.startswith(str(root / "venv")), where  # installed into the new venv, not the test environment
    return python


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
    ppo = [(r["distribution"], r["duplicate"]) for r in json.loads(proc.stdout) if r["kind"] == "clipper" and r["name"] == "ppo"]
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
    for command in (["config", "check", config], ["train", config, "--set", f"output_dir={tmp_path / 'run'}"]):
        proc = rlzoo_cli(venv, *command, env=env, cwd=tmp_path)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        expected = "algorithm.clipper: clipper 'fragile-clip' (rlzoo-fragile) failed to set up: RuntimeError: this clipper needs a GPU"
        assert expected in proc.stderr, proc.stderr
