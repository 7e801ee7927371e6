"""The rlzoo-tools distribution registers its tools and parser, through rlzoo's public API only."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import pytest

from rlzoo.errors import ConfigError, UnknownComponentError
from rlzoo.interfaces import Environment, Tool, ToolCallParser
from rlzoo.registry import Registry, default_registry

PACKAGE = Path(__file__).resolve().parents[1] / "rlzoo_tools"
EXPECTED = {("tool", "calculator"), ("tool", "python"), ("tool_parser", "hermes"), ("environment", "tools")}


@pytest.fixture(scope="module")
def registry() -> Registry:
    eps = [ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.value == "rlzoo_tools.plugin"]
    assert len(eps) == 1, "rlzoo-tools is not installed (pip install -e plugins/tools --no-deps)"
    (ep,) = eps
    assert ep.name == "tools" and ep.dist.name == "rlzoo-tools"
    registry = Registry()
    registry.add_plugin(ep.load(), name=ep.name, distribution=ep.dist.name)
    assert not registry.load_errors
    return registry


def test_the_tools_and_the_parser_are_registered(registry):
    infos = {(i.kind, i.name): i for i in registry.components()}
    assert set(infos) == EXPECTED
    for (kind, _), info in infos.items():
        assert issubclass(info.cls, {"tool": Tool, "tool_parser": ToolCallParser, "environment": Environment}[kind])
        assert info.distribution == "rlzoo-tools"
        assert info.summary and len((info.cls.__doc__ or "").strip().splitlines()) > 2  # states what it does
        assert info.cls.reference
    assert len({info.cls.__module__ for info in infos.values()}) == 4  # each in its own module


def test_the_installed_registry_finds_them():
    infos = {
        (i.kind, i.name): i for i in default_registry().components() if i.kind in ("tool", "tool_parser", "environment")
    }
    assert EXPECTED <= set(infos)
    assert {infos[key].distribution for key in EXPECTED} == {"rlzoo-tools"}


def test_every_tool_describes_itself_for_tools_equals(registry):
    for info in registry.components("tool"):
        schema = info.cls.schema(info.cls.__new__(info.cls))
        function = schema["function"]
        assert schema["type"] == "function" and function["name"] == info.name and function["description"]
        parameters = function["parameters"]
        assert parameters["type"] == "object" and set(parameters["required"]) <= set(parameters["properties"])


def test_a_tool_that_is_not_registered_is_named(registry):
    with pytest.raises(UnknownComponentError, match="unknown tool 'calculater'; did you mean 'calculator'"):
        registry.get("tool", "calculater")
    with pytest.raises(ConfigError) as info:
        registry.create("tool", "calculator", {"max_digit": 5}, loc="rollout.tools.0")
    assert info.value.problems[0][0] == "rollout.tools.0.max_digit"


def test_plugin_uses_only_the_public_api():
    allowed = {"rlzoo", "rlzoo.interfaces", "rlzoo.tools"}  # rlzoo.tools: the public runner of a turn's calls
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
