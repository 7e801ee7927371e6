"""The rlzoo-routing distribution registers the three router policies, through rlzoo's public API only."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import pytest

from rlzoo.errors import UnknownComponentError
from rlzoo.interfaces import RouterPolicy
from rlzoo.registry import Registry

PACKAGE = Path(__file__).resolve().parents[1] / "rlzoo_routing"
EXPECTED = {"none": "none", "replay-old": "old", "replay-rollout": "rollout"}


@pytest.fixture(scope="module")
def registry() -> Registry:
    # only this distribution's entry point: other installed plugins stay out of the way
    eps = [ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.value == "rlzoo_routing.plugin"]
    assert len(eps) == 1, "rlzoo-routing is not installed (pip install -e plugins/routing --no-deps)"
    (ep,) = eps
    assert ep.name == "routing" and ep.dist.name == "rlzoo-routing"
    registry = Registry()
    registry.add_plugin(ep.load(), name=ep.name, distribution=ep.dist.name)
    assert not registry.load_errors
    return registry


def test_the_three_router_policies_are_registered(registry):
    infos = {i.name: i for i in registry.components("router")}
    assert {name: info.cls.source for name, info in infos.items()} == EXPECTED
    for info in infos.values():
        assert issubclass(info.cls, RouterPolicy) and info.kind == "router"
        assert info.distribution == "rlzoo-routing"
        assert info.summary and len((info.cls.__doc__ or "").strip().splitlines()) > 2  # states what it does
    # each in its own module
    assert len({infos[name].cls.__module__ for name in EXPECTED}) == 3


def test_create_through_the_registry(registry):
    policy = registry.create("router", "replay-old", {})
    assert policy.source == "old"
    with pytest.raises(UnknownComponentError, match="replay-old"):
        registry.get("router", "replay-olds")


def test_the_installed_registry_finds_them():
    import rlzoo

    registry = rlzoo.Registry.discover()
    assert set(EXPECTED) <= set(registry.names("router"))


def test_plugin_uses_only_the_public_api():
    allowed = {"rlzoo", "rlzoo.interfaces"}
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if module.split(".")[0] == "rlzoo":
                    assert module in allowed, f"{path.name} imports {module}"
