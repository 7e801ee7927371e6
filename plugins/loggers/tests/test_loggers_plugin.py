"""The rlzoo-loggers distribution registers its loggers, cheaply, through rlzoo's public API only."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from rlzoo.errors import ConfigError
from rlzoo.interfaces import Logger
from rlzoo.registry import Registry, default_registry

PACKAGE = Path(__file__).resolve().parents[1] / "rlzoo_loggers"
EXPECTED = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # logger -> the package it needs


@pytest.fixture(scope="module")
def registry() -> Registry:
    eps = [ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.value == "rlzoo_loggers.plugin"]
    assert len(eps) == 1, "rlzoo-loggers is not installed (pip install --no-deps -e plugins/loggers)"
    (ep,) = eps
    assert ep.name == "loggers" and ep.dist.name == "rlzoo-loggers"
    registry = Registry()
    registry.add_plugin(ep.load(), name=ep.name, distribution=ep.dist.name)
    assert not registry.load_errors
    return registry


def test_the_loggers_are_registered(registry):
    infos = {i.name: i for i in registry.components()}
    assert set(infos) == set(EXPECTED) and {i.kind for i in infos.values()} == {"logger"}
    for name, info in infos.items():
        assert issubclass(info.cls, Logger) and info.distribution == "rlzoo-loggers"
        assert info.summary and len((info.cls.__doc__ or "").strip().splitlines()) > 2 and info.cls.reference
        assert info.cls.requires == (EXPECTED[name],)
        assert info.cls.install_hint == f"pip install 'rlzoo-loggers[{name}]'"
    assert len({info.cls.__module__ for info in infos.values()}) == 3  # each in its own module


def test_the_installed_registry_finds_them():
    infos = {i.name: i for i in default_registry().components("logger")}
    assert {infos[name].distribution for name in EXPECTED} == {"rlzoo-loggers"}


def test_parameters_and_their_defaults(registry):
    wandb = registry.create("logger", "wandb", {}, loc="loggers.0")
    assert (wandb.params.project, wandb.params.entity, wandb.params.mode) == ("rlzoo", None, "offline")
    mlflow = registry.create("logger", "mlflow", {"experiment": "e"}, loc="loggers.1")
    assert (mlflow.params.tracking_uri, mlflow.params.experiment, mlflow.params.http_retries) == (None, "e", 2)
    with pytest.raises(ConfigError) as info:
        registry.create("logger", "wandb", {"mode": "disabled"}, loc="loggers.0")
    assert info.value.problems[0][0] == "loggers.0.mode"
    with pytest.raises(ConfigError) as info:
        registry.create("logger", "tensorboard", {"log_dir": "x"}, loc="loggers.2")
    assert info.value.problems[0][0] == "loggers.2.log_dir"


def test_discovery_imports_no_tracker_library():
    code = (
        "import sys, rlzoo_loggers.plugin as p\n"
        "from rlzoo.registry import Registry\n"
        "registry = Registry()\n"
        "found = registry.add_plugin(p, name='loggers', distribution='rlzoo-loggers')\n"
        "assert not registry.load_errors and len(found) == 3, (registry.load_errors, found)\n"
        "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plugin_uses_only_the_public_api():
    allowed = {"rlzoo", "rlzoo.interfaces"}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if module.split(".")[0] == "rlzoo":
                    assert module in allowed, f"{path.name} imports {module}"
