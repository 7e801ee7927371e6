"""Resolving a run config against the plugin registry: every component spec validated by its component's ``Params``
(defaults filled in), and the whole path from YAML to a validated :class:`RunConfig`; also the memory estimate of a
config whose engines are constructed from the registry (:func:`estimate`).

Validation is two-phase: pydantic checks the run's own structure (:mod:`rlzoo.config.schema`), then each component
spec is looked up in the registry and its parameters validated against that component's ``Params`` model (unknown
keys are errors). All problems of a phase are reported together, each with its dotted location. Before either, the
config's ``plugins`` (and ``--plugin``) are loaded into the registry (:mod:`rlzoo.local_plugins`), so that its
components can be named anywhere in the config.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rlzoo.config.base import ComponentSpec
from rlzoo.config.loading import apply_overrides, read_yaml
from rlzoo.config.presets import expand_preset
from rlzoo.config.schema import RunConfig
from rlzoo.errors import ConfigError, RegistryError, UnknownComponentError
from rlzoo.local_plugins import load_plugins
from rlzoo.registry import Registry, default_registry, format_validation_error


def iter_component_specs(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, ComponentSpec]]:
    for field_name in type(model).model_fields:
        value = getattr(model, field_name)
        loc = f"{prefix}.{field_name}" if prefix else field_name
        if isinstance(value, ComponentSpec):
            yield loc, value
        elif isinstance(value, list):  # a list of components (algorithm.reward_shaping): loc ends in the index
            yield from ((f"{loc}.{i}", item) for i, item in enumerate(value) if isinstance(item, ComponentSpec))
        elif isinstance(value, BaseModel):
            yield from iter_component_specs(value, loc)


def resolve_components(config: RunConfig, registry: Registry) -> tuple[RunConfig, list[tuple[str, str]]]:
    """Validate every component spec against the registry; return the config with defaults filled in."""
    problems: list[tuple[str, str]] = []
    replacements: dict[str, ComponentSpec] = {}
    for loc, spec in iter_component_specs(config):
        try:
            params = registry.validate_params(spec.kind, spec.name, spec.params, loc)
        except UnknownComponentError as err:
            problems.append((f"{loc}.name", str(err)))
            continue
        except ConfigError as err:
            problems.extend(err.problems)
            continue
        except RegistryError as err:
            problems.append((loc, str(err)))
            continue
        replacements[loc] = type(spec)(name=spec.name, **params.model_dump(mode="json"))
    data = config.model_dump(mode="python")
    for loc, spec in replacements.items():
        node = data
        *parents, leaf = loc.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(leaf) if isinstance(node, list) else leaf] = spec.model_dump(mode="json")
    return RunConfig.model_validate(data), problems


def fill_default_names(data: dict[str, Any], model: type[BaseModel] = None, loc: str = "") -> dict[str, Any]:
    """A component spec given without ``name`` (e.g. ``--set task.digits=3``) keeps the default component."""
    model = model or RunConfig
    for field_name, field in model.model_fields.items():
        value = data.get(field_name)
        if not isinstance(value, dict):
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, ComponentSpec) and "name" not in value:
            data[field_name] = {"name": default.name, **value}
        elif isinstance(default, BaseModel):
            fill_default_names(value, type(default))
    return data


def build_config(
    data: dict[str, Any],
    overrides: Sequence[str] = (),
    registry: Registry | None = None,
    source: str | None = None,
    plugins: Sequence[str] = (),
    folder: Path | None = None,
) -> RunConfig:
    """The validated config of YAML ``data`` with ``overrides``; ``plugins`` (``--plugin``, relative to the current
    folder) join the config's own (relative to ``folder``: the config file's, by default), all loaded into the
    registry before any component is looked up, and recorded resolved (absolute paths) in the config."""
    data = apply_overrides(data, overrides)
    registry = registry or default_registry()
    folder = folder if folder is not None else (Path(source).parent if source else Path.cwd())
    try:
        own = load_plugins(data.get("plugins") or [], registry, "plugins", folder)
        extra = load_plugins(list(plugins), registry, "--plugin", Path.cwd())
    except ConfigError as err:
        raise ConfigError(err.problems, source=source) from None
    if own or extra:
        data["plugins"] = list(dict.fromkeys([*own, *extra]))
    algorithm = data.get("algorithm")
    if isinstance(algorithm, dict):
        data["algorithm"] = expand_preset(algorithm)
    fill_default_names(data)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err), source=source) from None
    config, problems = resolve_components(config, registry)
    if problems:
        raise ConfigError(problems, source=source)
    return config


def load_config(
    path: str | Path, overrides: Sequence[str] = (), registry: Registry | None = None, plugins: Sequence[str] = ()
) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides and presets, load its ``plugins`` (and ``plugins``, as
    ``--plugin`` gives them), and validate everything."""
    return build_config(read_yaml(path), overrides, registry, source=str(path), plugins=plugins)
