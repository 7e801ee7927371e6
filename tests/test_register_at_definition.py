"""Components registered where they are defined: an entry point (or a plugin's ``rlzoo_component_modules`` hook)
names a package, and every class marked ``@rlzoo.register`` in its modules is found -- one broken module reported by
its name without hiding its siblings, a name claimed by two plugins an error naming both, ``_`` modules left alone."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import textwrap
from pathlib import Path

import pytest

import rlzoo
from rlzoo import registry as registry_module
from rlzoo.errors import DuplicateComponentError, RegistryError
from rlzoo.registry import Registry

CLIPPER = '''
import rlzoo
from rlzoo.interfaces import Clipper, ClipResult


@rlzoo.register("clipper", "{name}")
class Clip(Clipper):
    """A clipper of the package {package}."""

    def clip(self, ratio, advantages):
        flags = ratio != ratio
        return ClipResult(loss=-ratio * advantages, clipped_low=flags, clipped_high=flags)
'''
RATIO = '''
import rlzoo
from rlzoo.interfaces import RatioEstimator


@rlzoo.register("ratio", "{name}")
class Ratio(RatioEstimator):
    """A ratio of the package {package}."""
'''


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """``make(package, {relative path: source})`` writes a package under a folder on ``sys.path``; every module
    written is dropped from ``sys.modules`` and from the marks afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def make(package: str, files: dict[str, str]) -> str:
        root = tmp_path / package
        for relative, source in {"__init__.py": "", **files}.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.name != "__init__.py" and not (path.parent / "__init__.py").exists():
                (path.parent / "__init__.py").write_text("")
            path.write_text(textwrap.dedent(source).format(package=package, name=Path(relative).stem))
            module = ".".join([package, *Path(relative).with_suffix("").parts])
            written.append(module.removesuffix(".__init__"))
        importlib.invalidate_caches()
        return package

    yield make
    for module in written:
        sys.modules.pop(module, None)
        registry_module.forget_marks(module)


def names_hook(*modules: str):
    """A plugin module whose ``rlzoo_component_modules`` hook names ``modules``."""
    import types

    plugin = types.ModuleType("names_hook_plugin")

    @rlzoo.hookimpl
    def rlzoo_component_modules():
        return list(modules)

    plugin.rlzoo_component_modules = rlzoo_component_modules
    return plugin


def test_an_entry_point_naming_a_package_finds_every_marked_class_in_it(packages):
    package = packages(
        "rlzoo_pkg_found",
        {
            "clip_a.py": CLIPPER,
            "deeper/ratio_b.py": RATIO,
            "_helper.py": "raise RuntimeError('never imported')",
        },
    )
    registry = Registry()
    found = registry.add_plugin(importlib.import_module(package), name="found", distribution="dist-found")
    assert registry.load_errors == []
    assert sorted((i.kind, i.name) for i in found) == [("clipper", "clip_a"), ("ratio", "ratio_b")]
    info = registry.get("ratio", "ratio_b")
    assert (info.plugin, info.distribution, info.cls.__module__) == ("found", "dist-found", f"{package}.deeper.ratio_b")
    assert f"{package}._helper" not in sys.modules  # helpers are for the modules that import them


def test_adding_a_component_is_adding_its_module(packages):
    package = packages("rlzoo_pkg_grows", {"clip_a.py": CLIPPER})
    before = Registry()
    before.add_plugin(names_hook(package), name="grows", distribution="dist-grows")
    packages(package, {"clip_new.py": CLIPPER})  # one new file, no list to edit
    after = Registry()
    after.add_plugin(names_hook(package), name="grows", distribution="dist-grows")
    assert before.names("clipper") == ["clip_a"]
    assert after.names("clipper") == ["clip_a", "clip_new"]


def test_a_module_that_fails_to_import_is_named_and_its_siblings_still_load(packages):
    package = packages(
        "rlzoo_pkg_broken",
        {
            "clip_good.py": CLIPPER,
            "clip_bad.py": CLIPPER + "\nimport torchx_not_installed\n",
        },
    )
    registry = Registry()
    registry.add_plugin(names_hook(package), name="broken", distribution="dist-broken")
    assert [(e.plugin, e.distribution) for e in registry.load_errors] == [
        (f"broken: module {package}.clip_bad", "dist-broken")
    ]
    assert "ModuleNotFoundError: No module named 'torchx_not_installed'" in registry.load_errors[0].error
    assert "Traceback" in registry.load_errors[0].details
    assert registry.names("clipper") == ["clip_good"]  # the broken module's class, marked before it failed, is not


def test_a_local_plugin_package_with_a_broken_module_raises_naming_it(packages):
    package = packages("rlzoo_pkg_strict", {"clip_bad.py": "raise ValueError('bad module')"})
    with pytest.raises(RegistryError, match=rf"module {package}.clip_bad failed to import: ValueError: bad module"):
        Registry().register_plugin(names_hook(package), name="strict", distribution="script strict")


def test_a_missing_module_named_by_the_hook_is_reported_by_name():
    registry = Registry()
    registry.add_plugin(names_hook("rlzoo_pkg_nowhere"), name="nowhere", distribution="dist-nowhere")
    assert [e.plugin for e in registry.load_errors] == ["nowhere: module rlzoo_pkg_nowhere"]
    assert "No module named 'rlzoo_pkg_nowhere'" in registry.load_errors[0].error


def test_a_hook_naming_something_other_than_modules_is_a_load_error():
    registry = Registry()
    registry.add_plugin(names_hook("ok", 3), name="odd", distribution="dist-odd")
    assert [e.plugin for e in registry.load_errors] == ["odd"]
    assert "module names (strings) were expected" in registry.load_errors[0].error


def test_two_plugins_claiming_one_name_is_an_error_naming_both(packages):
    one = packages("rlzoo_pkg_one", {"shared.py": CLIPPER})
    two = packages("rlzoo_pkg_two", {"shared.py": CLIPPER})
    registry = Registry()
    registry.add_plugin(names_hook(one), name="one", distribution="dist-one")
    registry.add_plugin(importlib.import_module(two), name="two", distribution="dist-two")
    assert registry.load_errors == []
    assert [(i.distribution, i.duplicate) for i in registry.components("clipper")] == [
        ("dist-one", True),
        ("dist-two", True),
    ]
    with pytest.raises(DuplicateComponentError) as caught:
        registry.get("clipper", "shared")
    assert "dist-one (plugin 'one')" in str(caught.value) and "dist-two (plugin 'two')" in str(caught.value)


def test_a_package_named_twice_registers_each_module_once(packages):
    package = packages("rlzoo_pkg_twice", {"clip_a.py": CLIPPER})
    registry = Registry()
    registry.add_plugin(names_hook(package, f"{package}.clip_a"), name="twice", distribution="dist-twice")
    assert registry.load_errors == []
    assert [i.duplicate for i in registry.components("clipper")] == [False]


def test_the_first_party_plugin_modules_list_no_component():
    """Each first-party ``plugin.py`` names its package and imports no component: the classes register themselves."""
    import ast

    import rlzoo_estimators.plugin

    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != "rlzoo" or not dist.metadata["Name"].startswith("rlzoo-"):
                continue
            module = importlib.import_module(ep.value.split(":")[0])
            tree = ast.parse(Path(module.__file__).read_text())
            imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert imported <= {"__future__", "rlzoo"}, (ep.value, imported)
    assert rlzoo_estimators.plugin.rlzoo_component_modules() == ["rlzoo_estimators"]
