"""The distribution's entry point is registered in the rlzoo group and its tasks are configurable by name."""

from __future__ import annotations

import importlib.metadata

import pytest

from rlzoo.errors import ConfigError
from rlzoo.registry import Registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    # load only this distribution's entry point: other installed plugins (and their imports) stay out of the way
    eps = [ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.value == "rlzoo_tasks.plugin"]
    assert len(eps) == 1, "rlzoo-tasks is not installed (pip install -e plugins/tasks --no-deps)"
    (ep,) = eps
    assert ep.name == "tasks" and ep.dist.name == "rlzoo-tasks"
    registry = Registry()
    registry.add_plugin(ep.load(), name=ep.name, distribution=ep.dist.name)
    assert not registry.load_errors
    return registry


def test_tasks_are_registered(registry):
    infos = {i.name: i for i in registry.components("task")}
    assert set(infos) == {"arithmetic", "calculator-arithmetic", "chain", "dataset", "jsonl"}
    for info in infos.values():
        assert info.distribution == "rlzoo-tasks"
        assert info.summary and not info.summary.startswith("``")


def test_create_through_registry(registry):
    task = registry.create("task", "arithmetic", {"digits": 3, "operations": ["*"]})
    assert task.samples("train", 1, 0)[0].prompt.count("*") == 1
    with pytest.raises(ConfigError, match="digits"):
        registry.create("task", "arithmetic", {"digits": 9})
    with pytest.raises(ConfigError, match="operations"):
        registry.create("task", "arithmetic", {"operations": ["/"]})
    with pytest.raises(ConfigError, match="path"):
        registry.create("task", "jsonl", {})
    with pytest.raises(ConfigError, match="terms"):
        registry.create("task", "chain", {"terms": 1})
