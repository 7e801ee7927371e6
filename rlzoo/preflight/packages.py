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
    return missing_requirement(registry.get(kind, name).cls)


def missing_requirement(cls: type) -> str | None:
    """The first package of ``cls.requires`` that is not installed."""
    return next((package for package in cls.requires if importlib.util.find_spec(package) is None), None)


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
        problems.append(
            (
                f"{loc}.name",
                f"{spec.name!r} needs the Python package {package!r}, which is not installed ({hint}); "
                f"engines usable here: {', '.join(usable) or '(none)'}",
            )
        )
    return problems


def device_rule(run: RunFacts) -> list[Problem]:
    """``device: cuda`` needs a GPU that torch sees (``auto`` falls back to the CPU)."""
    import torch

    from rlzoo.engines.device import NO_GPU

    return [("device", NO_GPU)] if run.config.device == "cuda" and not torch.cuda.is_available() else []


def component_package_rule(run: RunFacts) -> list[Problem]:
    """The packages every other component the config names declares it needs (``Component.requires``) are
    installed: a verifier without its library would otherwise fail every response of the run's first steps."""
    problems = []
    for loc, component in run.components.items():
        if loc in ("rollout.engine", "trainer.engine") or loc.startswith("loggers"):
            continue  # engines: engine_package_rule; a tracker without its package is dropped with one warning
        package = missing_requirement(type(component))
        if package is not None:
            hint = type(component).install_hint or f"pip install {package}"
            problems.append(
                (loc, f"{component.name!r} needs the Python package {package!r}, which is not installed ({hint})")
            )
    return problems
