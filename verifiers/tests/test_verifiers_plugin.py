"""The distribution's entry point is registered in the rlzoo group and its verifiers are configurable by name."""

from __future__ import annotations

import importlib.metadata

import pytest

from rlzoo.errors import ConfigError
from rlzoo.interfaces import Sample
from rlzoo.registry import Registry

NAMES = {"exact", "math", "regex", "process", "code", "reward-model", "weighted", "remote", "judge"}


@pytest.fixture(scope="module")
def registry() -> Registry:
    # load only this distribution's entry point: other installed plugins (and their imports) stay out of the way
    eps = [ep for ep in importlib.metadata.entry_points(group="rlzoo") if ep.value == "rlzoo_verifiers.plugin"]
    assert len(eps) == 1, "rlzoo-verifiers is not installed (pip install -e verifiers --no-deps)"
    (ep,) = eps
    assert ep.name == "verifiers" and ep.dist.name == "rlzoo-verifiers"
    registry = Registry()
    registry.add_plugin(ep.load(), name=ep.name, distribution=ep.dist.name)
    assert not registry.load_errors
    return registry


def test_verifiers_are_registered_with_summaries(registry):
    infos = {i.name: i for i in registry.components("verifier")}
    assert set(infos) == NAMES
    for info in infos.values():
        assert info.distribution == "rlzoo-verifiers"
        assert info.summary and len(info.summary) < 120


def test_create_through_registry(registry):
    exact = registry.create("verifier", "exact", {"strip": False})
    assert exact.verify(Sample("p", "1"), "1").reward == 1.0
    regex = registry.create("verifier", "regex", {"pattern": r"\d+", "reward": 0.25})
    assert regex.verify(Sample("p", ""), "12").reward == 0.25
    with pytest.raises(ConfigError, match="pattern"):
        registry.create("verifier", "regex", {})
    with pytest.raises(ConfigError, match="timeout_s"):
        registry.create("verifier", "code", {"timeout_s": 0})
    with pytest.raises(ConfigError, match="stirp"):
        registry.create("verifier", "exact", {"stirp": True})
