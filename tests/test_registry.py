"""The plugin registry: lookups, duplicate names, broken plugins, bad hook results, parameter validation."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
import types

import pytest

import rlzoo
from rlzoo import registry as registry_module
from rlzoo.errors import ConfigError, DuplicateComponentError, RegistryError, UnknownComponentError
from rlzoo.interfaces import Clipper, ClipResult, Params, RatioEstimator
from rlzoo.registry import PluginLoadError, Registry, default_registry

# -- helpers ---------------------------------------------------------------------------------------------------


class HalfClip(Clipper):
    """Half clip: a clipper used only by these tests."""

    name = "half-clip"

    class Params(Params):
        scale: float = 0.5

    def clip(self, ratio, advantages):
        loss = -self.params.scale * ratio * advantages
        flags = ratio != ratio
        return ClipResult(loss=loss, clipped_low=flags, clipped_high=flags)


class OtherHalfClip(HalfClip):
    """Another class claiming the same name."""


class StrayRatio(RatioEstimator):
    """A ratio estimator (returned from the wrong hook in one test)."""

    name = "stray"


def plugin_module(module_name: str, **hooks) -> types.ModuleType:
    """A plugin module whose hooks (``clippers=[...]`` -> ``rlzoo_clippers``) return the given lists."""
    module = types.ModuleType(module_name)
    for short, value in hooks.items():

        def hook(value=value):
            return value

        hook.__name__ = f"rlzoo_{short}"
        setattr(module, f"rlzoo_{short}", rlzoo.hookimpl(hook))
    return module


class FakeDist:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeEntryPoint:
    """Enough of importlib.metadata.EntryPoint for Registry.discover."""

    def __init__(self, name: str, distribution: str, load) -> None:
        self.name, self.dist, self._load = name, FakeDist(distribution), load

    def load(self):
        return self._load()


def fake_entry_points(monkeypatch, eps) -> None:
    def entry_points(**kwargs):
        assert kwargs.get("group") == "rlzoo"
        return list(eps)

    monkeypatch.setattr(registry_module.importlib.metadata, "entry_points", entry_points)


@pytest.fixture
def temp_site(tmp_path, monkeypatch):
    """A folder on sys.path where a test writes distributions (dist-info + module); modules are unloaded after."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = set(sys.modules)

    def add(dist: str, module: str, source: str, ep_name: str) -> None:
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[rlzoo]\n{ep_name} = {module}\n")

    yield add
    for name in set(sys.modules) - before:
        if name.startswith("rlzoo_regtest_"):
            del sys.modules[name]


# -- unknown names ---------------------------------------------------------------------------------------------


def test_unknown_name_lists_valid_names_and_suggests_closest():
    registry = default_registry()
    with pytest.raises(UnknownComponentError) as info:
        registry.get("ratio", "sequense")
    err = info.value
    assert err.kind == "ratio" and err.name == "sequense"
    assert err.suggestion == "sequence"
    assert {"token", "sequence", "sequence-token"} <= set(err.valid)
    assert set(err.valid) == set(registry.names("ratio"))
    message = str(err)
    assert "did you mean 'sequence'?" in message
    for name in ("token", "sequence", "sequence-token"):
        assert name in message


@pytest.mark.parametrize(
    "kind, name, expected, peer",
    [
        ("clipper", "vanilla", "ppo", "verl's policy_loss.loss_mode=vanilla"),
        ("clipper", "dppo_tv", "dppo-tv", "verl's policy_loss.loss_mode=dppo_tv"),
        ("advantage", "reinforce_plus_plus", "reinforce++", "verl's adv_estimator=reinforce_plus_plus"),
        ("kl", "low_var_kl", "k3", "verl's kl_loss_type=low_var_kl"),
    ],
)
def test_a_peers_name_suggests_the_component_it_names(kind, name, expected, peer):
    registry = default_registry()
    assert expected in registry.names(kind)
    with pytest.raises(UnknownComponentError) as info:
        registry.get(kind, name)
    assert info.value.suggestion == expected
    assert f"did you mean {expected!r} ({peer})?" in str(info.value)


def test_unknown_name_in_synthetic_registry_lists_only_that_kind():
    registry = Registry()
    registry.add_plugin(
        plugin_module("p", clippers=[HalfClip], ratio_estimators=[StrayRatio]), name="p", distribution="d"
    )
    with pytest.raises(UnknownComponentError) as info:
        registry.get("clipper", "half-clp")
    assert info.value.valid == ["half-clip"]
    assert info.value.suggestion == "half-clip"
    # nothing close: no suggestion, but still the list of valid names
    with pytest.raises(UnknownComponentError) as info:
        registry.get("clipper", "zzzzzz")
    assert info.value.suggestion is None
    assert "did you mean" not in str(info.value)
    assert "half-clip" in str(info.value)
    assert "stray" not in str(info.value)


def test_unknown_kind_is_a_registry_error():
    with pytest.raises(RegistryError, match="unknown component kind 'clippers'"):
        Registry().get("clippers", "ppo")


# -- duplicates ------------------------------------------------------------------------------------------------


def test_same_kind_and_name_from_two_plugins_names_both_distributions_when_used():
    registry = Registry()
    registry.add_plugin(plugin_module("a", clippers=[HalfClip]), name="first", distribution="dist-one")
    registry.add_plugin(plugin_module("b", clippers=[OtherHalfClip]), name="second", distribution="dist-two")
    with pytest.raises(DuplicateComponentError) as info:
        registry.get("clipper", "half-clip")
    message = str(info.value)
    assert "dist-one" in message and "dist-two" in message
    assert "'half-clip'" in message and "clipper" in message
    listed = [(i.distribution, i.duplicate) for i in registry.components("clipper") if i.name == "half-clip"]
    assert listed == [("dist-one", True), ("dist-two", True)]


def test_same_name_in_different_kinds_is_allowed():
    class NoneRatio(RatioEstimator):
        """Ratio named like a clipper."""

        name = "none"

    class NoneClip(HalfClip):
        """Clipper named like a ratio."""

        name = "none"

    registry = Registry()
    registry.add_plugin(plugin_module("a", ratio_estimators=[NoneRatio]), name="a", distribution="d1")
    registry.add_plugin(plugin_module("b", clippers=[NoneClip]), name="b", distribution="d2")
    assert registry.get("ratio", "none").cls is NoneRatio
    assert registry.get("clipper", "none").cls is NoneClip


def test_discovery_of_installed_distribution_duplicating_a_builtin(temp_site):
    temp_site(
        "rlzoo-regtest-dup",
        "rlzoo_regtest_dup",
        """
        import rlzoo
        from rlzoo.interfaces import Clipper

        class MyPPO(Clipper):
            '''Yet another ppo.'''
            name = "ppo"

        @rlzoo.hookimpl
        def rlzoo_clippers():
            return [MyPPO]
        """,
        ep_name="regtest_dup",
    )
    registry = Registry.discover()  # only a config naming ppo fails; every other component is usable
    assert registry.get("clipper", "cispo").distribution == "rlzoo-estimators"
    with pytest.raises(DuplicateComponentError) as info:
        registry.get("clipper", "ppo")
    assert "rlzoo-estimators" in str(info.value)
    assert "rlzoo-regtest-dup" in str(info.value)


# -- broken plugins --------------------------------------------------------------------------------------------


def test_plugin_failing_to_import_is_reported_and_others_load(temp_site):
    temp_site(
        "rlzoo-regtest-broken",
        "rlzoo_regtest_broken",
        "import rlzoo_this_module_does_not_exist\n",
        ep_name="regtest_broken",
    )
    temp_site(
        "rlzoo-regtest-good",
        "rlzoo_regtest_good",
        """
        import rlzoo
        from rlzoo.interfaces import Clipper

        class Good(Clipper):
            '''A good clipper.'''
            name = "regtest-good"

        @rlzoo.hookimpl
        def rlzoo_clippers():
            return [Good]
        """,
        ep_name="regtest_good",
    )
    registry = Registry.discover()
    assert [(e.plugin, e.distribution) for e in registry.load_errors] == [("regtest_broken", "rlzoo-regtest-broken")]
    error = registry.load_errors[0]
    assert "ModuleNotFoundError" in error.error and "rlzoo_this_module_does_not_exist" in error.error
    assert "regtest_broken" in str(error) and "rlzoo-regtest-broken" in str(error)
    # every other plugin still loaded: the built-ins and the good third-party one
    assert registry.get("clipper", "regtest-good").distribution == "rlzoo-regtest-good"
    assert registry.get("clipper", "ppo").distribution == "rlzoo-estimators"
    assert {"token", "sequence"} <= set(registry.names("ratio"))


def test_fake_entry_points_broken_import_reported_by_name(monkeypatch):
    def broken():
        raise ImportError("no module named 'torchx'")

    fake_entry_points(
        monkeypatch,
        [
            FakeEntryPoint("zz_good", "good-dist", lambda: plugin_module("good", clippers=[HalfClip])),
            FakeEntryPoint("aa_broken", "broken-dist", broken),
        ],
    )
    registry = Registry.discover()
    assert len(registry.load_errors) == 1
    error = registry.load_errors[0]
    assert (error.plugin, error.distribution) == ("aa_broken", "broken-dist")
    assert error.error == "ImportError: no module named 'torchx'"
    assert "Traceback" in error.details
    assert registry.names("clipper") == ["half-clip"]
    assert registry.get("clipper", "half-clip").distribution == "good-dist"


@pytest.mark.parametrize(
    "bad, expected",
    [
        ("not a class", "is not a Component class"),
        (int, "is not a Component class"),
        (StrayRatio, "of kind 'ratio', not 'clipper'"),
    ],
)
def test_hook_returning_wrong_thing_is_a_load_error_of_that_plugin(monkeypatch, bad, expected):
    fake_entry_points(
        monkeypatch,
        [
            FakeEntryPoint("bad", "bad-dist", lambda: plugin_module("bad", clippers=[bad], kl_estimators=[])),
            FakeEntryPoint("good", "good-dist", lambda: plugin_module("good", clippers=[HalfClip])),
        ],
    )
    registry = Registry.discover()
    assert [(e.plugin, e.distribution) for e in registry.load_errors] == [("bad", "bad-dist")]
    assert "rlzoo_clippers" in registry.load_errors[0].error
    assert expected in registry.load_errors[0].error
    assert registry.names("clipper") == ["half-clip"]
    assert registry.names("ratio") == []  # the wrong-kind class was not registered under either kind


def test_bad_plugin_contributes_nothing_even_from_its_valid_hooks():
    registry = Registry()
    registry.add_plugin(
        plugin_module("bad", ratio_estimators=[StrayRatio], clippers=[object]), name="bad", distribution="d"
    )
    assert registry.components() == []
    assert [e.plugin for e in registry.load_errors] == ["bad"]


def test_component_without_name_is_a_load_error():
    class Nameless(Clipper):
        """No name."""

    registry = Registry()
    registry.add_plugin(plugin_module("p", clippers=[Nameless]), name="p", distribution="d")
    assert "has no name" in registry.load_errors[0].error


def test_hookimpl_with_invalid_signature_is_a_load_error_not_a_crash(monkeypatch):
    module = types.ModuleType("badsig")

    @rlzoo.hookimpl
    def rlzoo_clippers(config):  # the spec takes no arguments
        return [HalfClip]

    module.rlzoo_clippers = rlzoo_clippers
    fake_entry_points(
        monkeypatch,
        [
            FakeEntryPoint("badsig", "badsig-dist", lambda: module),
            FakeEntryPoint("good", "good-dist", lambda: plugin_module("good", kl_estimators=[])),
        ],
    )
    registry = Registry.discover()
    assert [(e.plugin, e.distribution) for e in registry.load_errors] == [("badsig", "badsig-dist")]
    assert "config" in registry.load_errors[0].error


def test_two_distributions_may_use_the_same_entry_point_name(monkeypatch):
    """Entry-point names are per distribution; a clash must not crash discovery or drop a plugin."""

    class Other(HalfClip):
        """Other clipper."""

        name = "other-clip"

    fake_entry_points(
        monkeypatch,
        [
            FakeEntryPoint("plugin", "dist-a", lambda: plugin_module("a", clippers=[HalfClip])),
            FakeEntryPoint("plugin", "dist-b", lambda: plugin_module("b", clippers=[Other])),
        ],
    )
    registry = Registry.discover()
    assert registry.load_errors == []
    assert {i.name: i.distribution for i in registry.components("clipper")} == {
        "half-clip": "dist-a",
        "other-clip": "dist-b",
    }


def test_real_environment_loads_without_errors():
    registry = default_registry()
    assert registry.load_errors == []
    assert registry.get("clipper", "ppo").distribution == "rlzoo-estimators"


# -- parameters ------------------------------------------------------------------------------------------------


def test_misspelt_param_is_config_error_with_field_path():
    with pytest.raises(ConfigError) as info:
        default_registry().validate_params("clipper", "ppo", {"eps_hgh": 0.3}, loc="algorithm.clipper")
    assert len(info.value.problems) == 1
    loc, reason = info.value.problems[0]
    assert loc == "algorithm.clipper.eps_hgh"
    assert "unknown parameter; did you mean 'eps_high'?" in reason
    assert reason.endswith("? Valid parameters: eps_high, eps_low")
    assert "algorithm.clipper.eps_hgh" in str(info.value)


def test_a_constructor_that_raises_is_a_config_error_naming_component_and_distribution():
    class Fragile(HalfClip):
        """Fails at set-up."""

        name = "fragile"

        def __init__(self, params=None):
            raise RuntimeError("needs a GPU")

    registry = Registry()
    registry.add_plugin(plugin_module("f", clippers=[Fragile]), name="fragile", distribution="rlzoo-fragile")
    with pytest.raises(ConfigError) as info:
        registry.create("clipper", "fragile", {}, loc="algorithm.clipper")
    assert info.value.problems == [
        ("algorithm.clipper", "clipper 'fragile' (rlzoo-fragile) failed to set up: RuntimeError: needs a GPU")
    ]


def test_an_unknown_name_mentions_plugins_that_failed_to_load():
    registry = Registry()
    registry.add_plugin(plugin_module("a", clippers=[HalfClip]), name="a", distribution="dist-a")
    registry.load_errors.append(PluginLoadError("broken", "rlzoo-broken", "ImportError: no module named x", ""))
    with pytest.raises(UnknownComponentError) as info:
        registry.get("clipper", "broken-clip")
    assert "plugin 'broken' from rlzoo-broken failed to load: ImportError: no module named x" in str(info.value)


def test_out_of_range_and_wrong_type_params_are_reported_together():
    with pytest.raises(ConfigError) as info:
        default_registry().create("clipper", "ppo", {"eps_low": 1.5, "eps_high": "wide"}, loc="algorithm.clipper")
    problems = dict(info.value.problems)
    assert set(problems) == {"algorithm.clipper.eps_low", "algorithm.clipper.eps_high"}
    assert "less than or equal to 1" in problems["algorithm.clipper.eps_low"]
    assert "valid number" in problems["algorithm.clipper.eps_high"]


def test_create_validates_and_fills_defaults():
    clipper = default_registry().create("clipper", "ppo", {"eps_high": 0.28})
    assert type(clipper).name == "ppo"
    assert clipper.params.eps_high == 0.28
    assert clipper.params.eps_low == 0.2


def test_entry_points_are_read_from_the_rlzoo_group():
    names = {ep.name for ep in importlib.metadata.entry_points(group="rlzoo")}
    assert {"estimators", "engines"} <= names


def test_a_misspelt_hook_is_a_load_error_of_that_plugin():
    """pluggy accepts an implementation without a spec; the registry must not let its components vanish silently."""
    registry = Registry()
    registry.add_plugin(plugin_module("misspelt", clipper=[HalfClip]), name="misspelt", distribution="dist-m")
    (error,) = registry.load_errors
    assert error.plugin == "misspelt" and "rlzoo_clipper" in error.error
    assert ("clipper", "half-clip") not in {(i.kind, i.name) for i in registry.components("clipper")}
