"""Installed packages: the Python packages a component declares it needs (``Component.requires``), and the rule that
the chosen rollout and training engines' are installed."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from rlzoo.interfaces import Problem, RunFacts

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import ComponentCatalogue


def missing_package(registry: ComponentCatalogue, kind: str, name: str) -> str | None:
    """A package component ``name`` of ``kind`` declares it needs (``Component.requires``) that is not installed."""
    for package in registry.get(kind, name).cls.requires:
        if importlib.util.find_spec(package) is None:
            return package
    return None


def engine_package_rule(run: RunFacts) -> list[Problem]:
    """The packages the chosen rollout / training engine needs are installed."""
    config, registry, problems = run.config, run.registry, []
    for loc, kind, spec in (
        ("rollout.engine", "rollout_engine", config.rollout.engine),
        ("trainer.engine", "training_engine", config.trainer.engine),
    ):
        package = missing_package(registry, kind, spec.name)
        if package is None:
            continue
        usable = [n for n in registry.names(kind) if missing_package(registry, kind, n) is None]
        hint = registry.get(kind, spec.name).cls.install_hint
        problems.append((
            f"{loc}.name",
            f"{spec.name!r} needs the Python package {package!r}, which is not installed ({hint}); "
            f"engines usable here: {', '.join(usable) or '(none)'}",
        ))
    return problems
