"""What the machine has: the Python packages a component declares it needs (``Component.requires``), the rule that
the chosen rollout and training engines' are installed, and a GPU where ``device: cuda`` asks for one."""

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


def device_rule(run: RunFacts) -> list[Problem]:
    """``device: cuda`` needs a GPU that torch sees (``auto`` falls back to the CPU)."""
    import torch

    if run.config.device == "cuda" and not torch.cuda.is_available():
        return [("device", "cuda, but torch sees no GPU here (allowed: auto, cpu, cuda; auto runs on the CPU)")]
    return []


def component_package_rule(run: RunFacts) -> list[Problem]:
    """The packages every other component the config names declares it needs (``Component.requires``) are
    installed: a verifier without its library would otherwise fail every response of the run's first steps."""
    problems = []
    for loc, component in run.components.items():
        if loc in ("rollout.engine", "trainer.engine") or loc.startswith("loggers"):
            continue  # engines: engine_package_rule; a tracker without its package is dropped with one warning
        for package in type(component).requires:
            if importlib.util.find_spec(package) is None:
                hint = type(component).install_hint or f"pip install {package}"
                problems.append((loc, f"{component.name!r} needs the Python package {package!r}, which is not "
                                      f"installed ({hint})"))
    return problems
