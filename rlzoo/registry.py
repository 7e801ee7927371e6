"""The component registry: every component, built-in or third-party, is found through pluggy.

Plugins are loaded from the ``rlzoo`` entry-point group. A plugin that fails to import is recorded (by entry
point and distribution) and skipped, so one broken package never takes the others down; a name nobody registered
is reported together with those failures. Two plugins that register the same ``kind`` + ``name`` are both listed
(marked) and stop only a config that uses that name, with an error naming both distributions. A misspelt
parameter is reported with the component's valid parameter names; a component whose constructor raises is
reported as ``<config field>: <kind> <name> (<distribution>): <message>``, and one that raises later, in its
``preflight`` or in the middle of a run, by :func:`component_raised` (:func:`raising_component` finds it in the
traceback): the component, its file and line, the exception, in one line.

A plugin module contributes components through its module-level ``@rlzoo.hookimpl`` functions, or by marking a
component class with :func:`register` (``@rlzoo.register("clipper", "my-clip")``): the marked classes of a module
are handed to pluggy as that module's hook implementations, so every check above applies to them alike. Components
register where they are defined: an entry point that names a *package* (``my_plugin = "my_package"``), or a plugin
module whose ``rlzoo_component_modules`` hook names packages or modules, contributes the marked classes of every
module in them (a package's modules, recursively, but those whose name starts with ``_``). Each such module is
imported on its own: one that fails to import is reported by its name and the package's other modules still
contribute. Local files and modules (``plugins:``, ``--plugin``) are loaded into a registry by
:mod:`rlzoo.local_plugins`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import pkgutil
import traceback
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pluggy
from pydantic import ValidationError

from rlzoo import hookspecs
from rlzoo.component_errors import named
from rlzoo.errors import ConfigError, DuplicateComponentError, RegistryError, RlzooError, UnknownComponentError
from rlzoo.interfaces.base import Component, Params

ENTRY_POINT_GROUP = "rlzoo"

C = TypeVar("C", bound=type)

#: module name -> the (hook name, class) pairs :func:`register` marked in it, in definition order
_MARKED: dict[str, list[tuple[str, type]]] = {}
_HOOK_OF_KIND = {kind: hook for hook, kind in hookspecs.HOOK_KINDS.items()}


def register(kind: str, name: str) -> Callable[[C], C]:
    """Mark a component class for the plugin module that defines it: ``@rlzoo.register("clipper", "my-clip")``.

    Sets the class's ``name``; when the module is loaded as a plugin (``plugins:`` / ``--plugin``, or an entry
    point), the class is contributed through ``kind``'s hook, with the same checks as a class a hook returns (a
    ``Component`` of that kind, a name unique within it). ``kind`` is one of :data:`rlzoo.hookspecs.HOOK_KINDS`.
    """
    if kind not in _HOOK_OF_KIND:
        raise RegistryError(f"rlzoo.register: unknown component kind {kind!r}; kinds: {', '.join(_HOOK_OF_KIND)}")
    if not isinstance(name, str) or not name:
        raise RegistryError(f"rlzoo.register({kind!r}, {name!r}): the name must be a non-empty string")

    def mark(cls: C) -> C:
        here = f"@rlzoo.register({kind!r}, {name!r})"
        if not (isinstance(cls, type) and issubclass(cls, Component)):
            what = cls.__name__ if isinstance(cls, type) else repr(cls)
            raise RegistryError(
                f"{here} marks {what}, which is not a component class (subclass one of rlzoo.interfaces' base classes)"
            )
        if cls.kind != kind:  # said here, at the class, rather than when the registry collects it
            raise RegistryError(f"{here} marks {cls.__name__}, whose base class makes it a {cls.kind!r}, not {kind!r}")
        cls.name = name
        marks = _MARKED.setdefault(cls.__module__, [])
        # a module run again (a notebook cell, a reload) marks its classes again: the newer class replaces the older
        marks[:] = [(hook, c) for hook, c in marks if (hook, c.name) != (_HOOK_OF_KIND[kind], name)]
        marks.append((_HOOK_OF_KIND[kind], cls))
        return cls

    return mark


def forget_marks(module_name: str) -> None:
    """Drop what :func:`register` marked in a module that failed to load (its classes are not contributed)."""
    _MARKED.pop(module_name, None)


def _marked_hooks(plugin: Any) -> Any | None:
    """The classes marked in a plugin module, as an object whose hook implementations return them."""
    marked = _MARKED.get(plugin.__name__) if isinstance(plugin, types.ModuleType) else None
    if not marked:
        return None
    hooks = {}
    for hook_name in dict.fromkeys(hook for hook, _ in marked):
        hooks[hook_name] = _returning([cls for hook, cls in marked if hook == hook_name])
    return types.SimpleNamespace(**hooks)


def _component_modules(plugin: Any, named: Iterable[str]) -> list[str]:
    """The modules whose marked classes ``plugin`` contributes: those its ``rlzoo_component_modules`` hook ``named``
    and, when the plugin is itself a package, that package; a package stands for its public modules, recursively."""
    roots = [*named, *([plugin.__name__] if _is_package(plugin) else [])]
    return list(dict.fromkeys(roots))


def _is_package(plugin: Any) -> bool:
    return isinstance(plugin, types.ModuleType) and hasattr(plugin, "__path__")


def _import_component_modules(roots: Iterable[str]) -> tuple[list[types.ModuleType], list[tuple[str, str, str]]]:
    """Import each root module and, for a package, every module in it whose name does not start with ``_``
    (recursively); returns the modules imported and ``(module name, error, traceback)`` per module that failed to
    import (its marks forgotten, the others unaffected)."""
    modules: list[types.ModuleType] = []
    failed: list[tuple[str, str, str]] = []
    pending, seen = list(roots), set()
    while pending:
        module_name = pending.pop(0)
        if module_name in seen:
            continue
        seen.add(module_name)
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # one broken module never hides its siblings' components
            forget_marks(module_name)
            failed.append((module_name, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        modules.append(module)
        if _is_package(module):
            children = sorted(pkgutil.iter_modules(module.__path__), key=lambda m: m.name)
            pending[:0] = [f"{module_name}.{m.name}" for m in children if not m.name.startswith("_")]
    return modules, failed


def _returning(classes: list[type]) -> Callable[[], list[type]]:
    @hookspecs.hookimpl
    def hook() -> list[type]:
        return list(classes)

    return hook


@dataclass(frozen=True)
class ComponentInfo:
    kind: str
    name: str
    cls: type[Component]
    plugin: str
    distribution: str
    duplicate: bool = False  # another plugin registers the same kind and name: using it is an error

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


def format_validation_error(
    err: ValidationError, prefix: str = "", params: type[Params] | None = None
) -> list[tuple[str, str]]:
    """``(dotted location, message)`` per error; with the component's ``params`` model, an unknown parameter's
    message names the valid ones and the closest."""
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        message = e["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
        if e["type"] == "extra_forbidden" and params is not None and e["loc"]:
            valid = sorted(params.model_fields)
            close = difflib.get_close_matches(str(e["loc"][-1]), valid, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ";"
            listing = f" Valid parameters: {', '.join(valid)}" if valid else " this component takes no parameters"
            message = f"unknown parameter{hint}{listing}"
        problems.append((loc, message))
    return problems


class Registry:
    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._components: dict[tuple[str, str], ComponentInfo] = {}
        self._duplicates: dict[tuple[str, str], list[ComponentInfo]] = {}  # every registration of a clashing name
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

    def add_plugin(self, plugin: Any, *, name: str, distribution: str) -> list[ComponentInfo]:
        """Register a plugin object and collect the components its hooks return (and the classes it marks with
        :func:`register`, in it and in the modules it names); a plugin that breaks the hooks' contract is recorded
        in ``load_errors`` and contributes nothing, a module of it that fails to import is recorded by its name and
        the others contribute. Returns what it contributed."""
        try:
            return self.register_plugin(plugin, name=name, distribution=distribution, failed=self.load_errors)
        except Exception as exc:  # also a hookimpl pluggy rejects, or the same module registered twice
            self.load_errors.append(
                PluginLoadError(name, distribution, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            )
            return []

    def register_plugin(
        self, plugin: Any, *, name: str, distribution: str, failed: list[PluginLoadError] | None = None
    ) -> list[ComponentInfo]:
        """:meth:`add_plugin`, but a plugin that breaks the contract raises (and contributes nothing); so does a
        module it names that fails to import, unless ``failed`` is given to record it in."""
        key = f"{distribution}:{name}"  # pluggy's key is internal; entry-point names are unique within a distribution
        registered = []
        try:
            self._pm.register(plugin, name=key)
            registered.append(plugin)
            self._pm.check_pending()  # a misspelt hook (rlzoo_clipper) would otherwise contribute nothing, silently
            modules = [plugin, *self._scan(plugin, name, distribution, failed)]
            marked = [(m, hooks) for m in modules if (hooks := _marked_hooks(m)) is not None]
            for module, hooks in marked:
                self._pm.register(hooks, name=f"{key}:register:{getattr(module, '__name__', '')}")
                registered.append(hooks)
            self._pm.check_pending()
            found = [item for part in [plugin, *(hooks for _, hooks in marked)] for item in self._collect(part)]
        except Exception:
            for part in registered:
                self._pm.unregister(part)
            raise
        infos = [ComponentInfo(kind, cls.name, cls, name, distribution) for kind, cls in found]
        for info in infos:
            key = (info.kind, info.name)
            if key in self._components:  # both stay listed; only a config naming it fails (get)
                self._duplicates.setdefault(key, [self._components[key]]).append(info)
                continue
            self._components[key] = info
        return infos

    def _scan(
        self, plugin: Any, name: str, distribution: str, failed: list[PluginLoadError] | None
    ) -> list[types.ModuleType]:
        """The modules (other than the plugin itself) whose marked classes the plugin contributes, imported."""
        named = [
            module
            for impl in self._pm.hook.rlzoo_component_modules.get_hookimpls()
            if impl.plugin is plugin
            for module in impl.function() or []
        ]
        if not all(isinstance(module, str) and module for module in named):
            raise RegistryError(f"rlzoo_component_modules returned {named!r}: module names (strings) were expected")
        modules, errors = _import_component_modules(_component_modules(plugin, named))
        for module_name, error, details in errors:
            if failed is None:
                raise RegistryError(f"module {module_name} failed to import: {error}")
            failed.append(PluginLoadError(f"{name}: module {module_name}", distribution, error, details))
        return [module for module in modules if module is not plugin]

    def has_plugin(self, plugin: Any) -> bool:
        """Whether this plugin object (a module) is registered already."""
        return self._pm.is_registered(plugin)

    def _collect(self, plugin: Any) -> Iterable[tuple[str, type[Component]]]:
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
        """Every registration, sorted by kind and name; a name registered twice appears twice, ``duplicate``."""
        infos = []
        for key, info in self._components.items():
            if kind is None or info.kind == kind:
                clash = self._duplicates.get(key)
                infos += [replace(i, duplicate=True) for i in clash] if clash else [info]
        return sorted(infos, key=lambda i: (self.kinds().index(i.kind), i.name, i.distribution))

    def names(self, kind: str) -> list[str]:
        return sorted({i.name for i in self.components(kind)})

    def get(self, kind: str, name: str) -> ComponentInfo:
        if kind not in self.kinds():
            raise RegistryError(f"unknown component kind {kind!r}; kinds: {', '.join(self.kinds())}")
        key = (kind, name)
        if key in self._duplicates:
            first, *others = self._duplicates[key]
            raise DuplicateComponentError(kind, name, _origin(first), ", ".join(_origin(o) for o in others))
        try:
            return self._components[key]
        except KeyError:
            valid = self.names(kind)
            peer = self._peer_name(kind, name)
            close = [peer[0]] if peer else difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
            raise UnknownComponentError(
                kind,
                name,
                valid,
                close[0] if close else None,
                [str(e) for e in self.load_errors],
                peer[1] if peer else None,
            ) from None

    def _peer_name(self, kind: str, name: str) -> tuple[str, str] | None:
        """The component of ``kind`` that verl or TRL call ``name`` (a value of its ``verl_name`` / ``trl_name``,
        e.g. ``vanilla`` in ``policy_loss.loss_mode=vanilla``), and where that name comes from."""
        wanted = name.strip().lower().replace("-", "_")
        for info in self.components(kind):
            for peer, spelled in (
                ("verl", getattr(info.cls, "verl_name", "")),
                ("TRL", getattr(info.cls, "trl_name", "")),
            ):
                for part in (spelled or "").split(","):
                    value = part.split("=", 1)[-1].strip().strip("'\"")
                    if wanted in {v.strip().lower() for v in value.split("|")}:
                        return info.name, f"{peer}'s {part.strip()}"
        return None

    def validate_params(self, kind: str, name: str, params: Mapping[str, Any], loc: str = "") -> Params:
        cls = self.get(kind, name).cls
        try:
            return cls.Params.model_validate(dict(params))
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, loc, cls.Params)) from None

    def create(self, kind: str, name: str, params: Mapping[str, Any] | Params | None = None, loc: str = "") -> Any:
        """An instance of component ``name`` with ``params``; a constructor that raises is a :class:`ConfigError`
        at ``loc`` naming the component and its distribution (no traceback for the user)."""
        info = self.get(kind, name)
        if not isinstance(params, Params):
            params = self.validate_params(kind, name, params or {}, loc)
        try:
            return info.cls(params)
        except Exception as exc:  # a plugin's set-up failure, reported where the config names it
            reason = str(exc) if isinstance(exc, RlzooError) else f"{type(exc).__name__}: {exc}"
            raise ConfigError([(loc, f"{named(kind, name, info.distribution)} failed to set up: {reason}")]) from exc


def _origin(info: ComponentInfo) -> str:
    return f"{info.distribution} (plugin {info.plugin!r})"


@functools.cache
def default_registry() -> Registry:
    """The registry of every installed plugin (discovered once per process)."""
    return Registry.discover()
