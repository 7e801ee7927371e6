"""Packaging and plugin contract of rlzoo-estimators."""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib

import pytest
from estimators_testlib import REGISTRY

import rlzoo_estimators
from rlzoo.interfaces import Params

PACKAGE_DIR = pathlib.Path(rlzoo_estimators.__file__).parent
EXPECTED = {
    "ratio": ["gpg", "sequence", "sequence-token", "token"],
    "advantage": [
        "gae",
        "gdpo",
        "gpg",
        "group",
        "grpo-passk",
        "opo",
        "optimal-token-baseline",
        "process",
        "reinforce++",
        "reinforce++-baseline",
        "remax",
        "reverse-kl",
        "rloo",
        "tir-optimal-token-baseline",
    ],
    "clipper": [
        "cispo",
        "clip-cov",
        "dppo-kl",
        "dppo-tv",
        "dro",
        "dual-clip",
        "gmpo",
        "kl-cov",
        "none",
        "ppo",
        "sapo",
        "vespo",
    ],
    "aggregation": ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean"],
    "kl": ["k1", "k2", "k3"],
    "correction": ["icepop", "none", "opsm", "rejection", "tis"],
    "batch_filter": ["dynamic-sampling", "none"],
    "reward_shaper": ["length", "overlong"],
    "regulariser": ["entropy"],
    "value_loss": ["clipped", "unclipped"],
    "kl_controller": ["adaptive", "fixed"],
}


def test_registry_holds_exactly_the_expected_components():
    assert REGISTRY.load_errors == []
    for kind, names in EXPECTED.items():
        assert REGISTRY.names(kind) == names, kind
    assert {info.kind for info in REGISTRY.components()} == set(EXPECTED)


def test_entry_point_is_installed():
    eps = [ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.name == "estimators"]
    assert len(eps) == 1, "run `pip install -e estimators --no-deps`"
    assert eps[0].value == "rlzoo_estimators.plugin"
    assert eps[0].dist is not None and eps[0].dist.name == "rlzoo-estimators"
    assert eps[0].load() is __import__("rlzoo_estimators.plugin").plugin


def test_default_registry_finds_the_plugin():
    from rlzoo.registry import Registry

    registry = Registry.discover()
    for kind, names in EXPECTED.items():
        for name in names:
            assert registry.get(kind, name).distribution == "rlzoo-estimators"


@pytest.mark.parametrize("info", REGISTRY.components(), ids=lambda i: f"{i.kind}:{i.name}")
def test_component_documentation_and_params(info):
    cls = info.cls
    summary = cls.summary()
    assert summary and summary == cls.__doc__.strip().splitlines()[0].strip()
    assert len(summary) <= 110, "the summary is one short line in `rlzoo plugins list`"
    module = __import__(cls.__module__, fromlist=["_"])
    assert module.__doc__ and len(module.__doc__.strip()) > 40, "the module docstring states the formula"
    assert issubclass(cls.Params, Params)
    for field_name, field in cls.Params.model_fields.items():
        assert field.description, f"{cls.__name__}.Params.{field_name} has no description"
    cls.Params()  # every parameter has a default
    assert cls.formula, f"{cls.__name__} declares no formula (docs/components.md is generated from it)"
    if cls.name != "none":
        assert cls.reference, f"{cls.__name__} declares no reference"


def test_only_rlzoo_public_api_is_imported():
    allowed = {"rlzoo", "rlzoo.interfaces", "rlzoo.errors"}  # errors: reverse-kl reports its nested source's
    for path in PACKAGE_DIR.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rlzoo":
                assert node.module in allowed, f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "rlzoo":
                        assert alias.name in allowed, f"{path.name} imports {alias.name}"


def test_import_package_is_namespaced():
    assert rlzoo_estimators.__name__ == "rlzoo_estimators"
    assert not (PACKAGE_DIR.parent / "estimators").exists()
    assert not (PACKAGE_DIR.parent / "__init__.py").exists()
