"""The component registry: every component, built-in or third-party, is found through pluggy.

Plugins are loaded from the ``rlzoo`` entry-point group. A plugin that fails to import is recorded (by entry
point and distribution) and skipped, so one broken package never takes the others down. Two plugins that
register the same ``kind`` + ``name`` is an error naming both distributions.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy
from pydantic import ValidationError

from rlzoo import hookspecs
from rlzoo.errors import ConfigError, DuplicateComponentError, RegistryError, UnknownComponentError
from rlzoo.interfaces.base import Component, Params

ENTRY_POINT_GROUP = "rlzoo"


@dataclass(frozen=True)
class ComponentInfo:
    kind: str
    name: str
    cls: type[Component]
    plugin: str
    distribution: str

    @property
    def summary(self) -> str:
        return self.cls.summary()


@dataclass(frozen=True)
class PluginLoadError:
    plugin: str
    distribution: str
    error: str
    details: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r} from {self.distribution} failed to load: {self.error}"


def format_validation_error(err: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        problems.append((loc, e["msg"]))
    return problems


class Registry:
    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._components: dict[tuple[str, str], ComponentInfo] = {}
        self.load_errors: list[PluginLoadError] = []

    # -- discovery -------------------------------------------------------------------------------------------
    @classmethod
    def discover(cls, group: str = ENTRY_POINT_GROUP) -> Registry:
        registry = cls()
        for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
            distribution = ep.dist.name if ep.dist is not None else "<unknown distribution>"
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin is reported, never fatal for the others
                registry.load_errors.append(
                    PluginLoadError(ep.name, distribution, f"{type(exc).__name__}: {exc}", traceback.format_exc())
                )
                continue
            registry.add_plugin(plugin, name=ep.name, distribution=distribution)
        return registry

    def add_plugin(self, plugin: Any, *, name: str, distribution: str) -> None:
        """Register a plugin object and collect the components its hooks return."""
        registered = False
        try:
            # pluggy's key is internal; entry-point names are only unique within one distribution
            self._pm.register(plugin, name=f"{distribution}:{name}")
            registered = True
            found = list(self._collect(plugin, name))
        except Exception as exc:  # also a hookimpl pluggy rejects, or the same module registered twice
            if registered:
                self._pm.unregister(plugin)
            self.load_errors.append(
                PluginLoadError(name, distribution, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            )
            return
        for kind, cls in found:
            key = (kind, cls.name)
            if key in self._components:
                first = self._components[key]
                raise DuplicateComponentError(
                    kind, cls.name, f"{first.distribution} (plugin {first.plugin!r})", f"{distribution} (plugin {name!r})"
                )
            self._components[key] = ComponentInfo(kind, cls.name, cls, name, distribution)

    def _collect(self, plugin: Any, plugin_name: str) -> Iterable[tuple[str, type[Component]]]:
        for hook_name, kind in hookspecs.HOOK_KINDS.items():
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                for cls in impl.function() or []:
                    if not (isinstance(cls, type) and issubclass(cls, Component)):
                        raise RegistryError(f"{hook_name} returned {cls!r}, which is not a Component class")
                    if cls.kind != kind:
                        raise RegistryError(f"{hook_name} returned {cls.__name__} of kind {cls.kind!r}, not {kind!r}")
                    if not cls.name:
                        raise RegistryError(f"{cls.__name__} returned by {hook_name} has no name")
                    yield kind, cls

    # -- lookup ----------------------------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        return list(hookspecs.HOOK_KINDS.values())

    def components(self, kind: str | None = None) -> list[ComponentInfo]:
        infos = [i for i in self._components.values() if kind is None or i.kind == kind]
        return sorted(infos, key=lambda i: (self.kinds().index(i.kind), i.name))

    def names(self, kind: str) -> list[str]:
        return [i.name for i in self.components(kind)]

    def get(self, kind: str, name: str) -> ComponentInfo:
        if kind not in self.kinds():
            raise RegistryError(f"unknown component kind {kind!r}; kinds: {', '.join(self.kinds())}")
        try:
            return self._components[(kind, name)]
        except KeyError:
            valid = self.names(kind)
            close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
            raise UnknownComponentError(kind, name, valid, close[0] if close else None) from None

    def validate_params(self, kind: str, name: str, params: Mapping[str, Any], loc: str = "") -> Params:
        cls = self.get(kind, name).cls
        try:
            return cls.Params.model_validate(dict(params))
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, loc)) from None

    def create(self, kind: str, name: str, params: Mapping[str, Any] | Params | None = None, loc: str = "") -> Any:
        cls = self.get(kind, name).cls
        if not isinstance(params, Params):
            params = self.validate_params(kind, name, params or {}, loc)
        return cls(params)


@functools.cache
def default_registry() -> Registry:
    """The registry of every installed plugin (discovered once per process)."""
    return Registry.discover()
