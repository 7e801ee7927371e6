"""Components from a script (rlzoo.local_plugins, rlzoo.register): loading, origins, every bad input named by its
field, the digests a resume and a sweep compare, and a spawned worker finding the module. In process; the real
command lines are in test_fault_table_plugins.py."""

from __future__ import annotations

import json
import multiprocessing
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

import rlzoo
from rlzoo import local_plugins
from rlzoo import registry as registry_module
from rlzoo.config.loading import dump_config
from rlzoo.config.resolution import build_config
from rlzoo.config.schema import RunConfig
from rlzoo.errors import ConfigError, DuplicateComponentError, RegistryError, RlzooError
from rlzoo.interfaces import Clipper, RatioEstimator
from rlzoo.local_plugins import digests, load_plugins
from rlzoo.preflight.resume_changes import (
    CHANGES_FILE,
    PLUGINS_FILE,
    config_changes,
    record_changes,
    record_plugins,
    refusal_problems,
    refused,
)
from rlzoo.registry import Registry

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"
ENGINES = ["rollout.engine={name: hf}", "trainer.engine={name: torch}"]

CLIPPER = '''\
"""A script's clipper."""
import torch

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult


@rlzoo.register("clipper", "{name}")
class ScriptClip(Clipper):
    """Scaled surrogate: loss = -0.5 * rho * A."""

    def clip(self, ratio, advantages):
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=-0.5 * ratio * advantages, clipped_low=never, clipped_high=never)


def work(value):
    """Run in a spawned worker: the component built there, from this module found by its name."""
    ratio = torch.tensor([[value]])
    return float(ScriptClip().clip(ratio, torch.ones(1, 1)).loss)
'''


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder for scripts; the modules, marks and ``sys.path`` entries the test's loads add are undone after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(local_plugins, "_LOADED", {})
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]
            registry_module.forget_marks(name)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def problem(call) -> tuple[str, str]:
    with pytest.raises(ConfigError) as info:
        call()
    [found] = info.value.problems
    return found


# -- the decorator ---------------------------------------------------------------------------------------------


def test_register_sets_the_name_and_refuses_an_unknown_kind_or_a_class_of_another():
    assert rlzoo.register is registry_module.register

    class Marked(Clipper):
        """Marked."""

    assert rlzoo.register("clipper", "marked")(Marked) is Marked and Marked.name == "marked"
    again = rlzoo.register("clipper", "marked")(type("Marked", (Clipper,), {"__doc__": "Run again."}))
    assert registry_module._MARKED[__name__] == [("rlzoo_clippers", again)]  # a module run twice: the newer class
    with pytest.raises(RegistryError, match=r"unknown component kind 'clip'; kinds: ratio, advantage, clipper"):
        rlzoo.register("clip", "x")
    with pytest.raises(RegistryError, match="name must be a non-empty string"):
        rlzoo.register("clipper", "")
    with pytest.raises(RegistryError, match=r"marks Marked, whose base class makes it a 'clipper', not 'ratio'"):
        rlzoo.register("ratio", "x")(Marked)
    with pytest.raises(RegistryError, match="marks Plain, which is not a component class"):
        rlzoo.register("ratio", "x")(type("Plain", (), {}))
    registry_module.forget_marks(__name__)


def test_marked_classes_of_a_module_are_contributed_through_their_hooks():
    """The decorator's classes go through pluggy as the module's hook implementations, beside its own hooks."""
    import types

    module = types.ModuleType("rlzoo_marktest_plugin")

    class Ratio(RatioEstimator):
        """A ratio."""

    Ratio.__module__ = module.__name__
    rlzoo.register("ratio", "marked-ratio")(Ratio)
    module.rlzoo_clippers = rlzoo.hookimpl(lambda: [])
    registry = Registry()
    try:
        infos = registry.add_plugin(module, name="marks", distribution="rlzoo-marktest")
    finally:
        registry_module.forget_marks(module.__name__)
    assert [(i.kind, i.name) for i in infos] == [("ratio", "marked-ratio")]
    assert registry.get("ratio", "marked-ratio").distribution == "rlzoo-marktest" and not registry.load_errors


# -- loading ---------------------------------------------------------------------------------------------------


def test_a_script_registers_under_its_origin_and_is_importable_by_its_name(folder):
    path = write(folder, "exp/my_clip.py", CLIPPER.replace("{name}", "my-clip"))
    registry = Registry()
    assert load_plugins(["./exp/my_clip.py"], registry, "plugins", folder) == [str(path)]
    info = registry.get("clipper", "my-clip")
    assert (info.distribution, info.plugin) == ("script my_clip.py", str(path))
    assert sys.modules["my_clip"].ScriptClip is info.cls and str(path.parent) in sys.path
    assert isinstance(registry.create("clipper", "my-clip"), info.cls)
    assert digests([str(path)])[str(path)].startswith("sha256:")


def test_hooks_and_marks_in_one_file_both_count_and_a_second_load_is_a_no_op(folder):
    write(
        folder,
        "both.py",
        CLIPPER.replace("{name}", "marked-clip")
        + textwrap.dedent('''
        class HookClip(ScriptClip):
            """Returned by the hook."""
            name = "hook-clip"


        @rlzoo.hookimpl
        def rlzoo_clippers():
            return [HookClip]
        '''),
    )
    registry = Registry()
    for _ in range(2):
        load_plugins(["both.py", "both.py"], registry, "plugins", folder)
    assert sorted(i.name for i in registry.components("clipper")) == ["hook-clip", "marked-clip"]
    fresh = Registry()  # another registry in the same process gets the same module, not a second import
    load_plugins([str(folder / "both.py")], fresh, "--plugin", Path("/"))
    assert fresh.get("clipper", "hook-clip").cls is registry.get("clipper", "hook-clip").cls


def test_a_module_by_its_dotted_name(folder, monkeypatch):
    write(folder, "site/rlzoo_lptest_pkg/__init__.py", "")
    write(folder, "site/rlzoo_lptest_pkg/clip.py", CLIPPER.replace("{name}", "pkg-clip"))
    monkeypatch.syspath_prepend(str(folder / "site"))
    registry = Registry()
    assert load_plugins(["rlzoo_lptest_pkg.clip"], registry, "plugins", folder) == ["rlzoo_lptest_pkg.clip"]
    assert registry.get("clipper", "pkg-clip").distribution == "module rlzoo_lptest_pkg.clip"
    assert digests(["rlzoo_lptest_pkg.clip"]) == {
        "rlzoo_lptest_pkg.clip": local_plugins.file_digest(folder / "site/rlzoo_lptest_pkg/clip.py")
    }


BAD = {
    "missing": ({}, "nope.py", "nope.py does not exist ("),
    "a-folder": ({"lib/x.txt": ""}, "./lib", "./lib is a folder, not a Python file"),
    "syntax-error": (
        {"broken.py": "import rlzoo\nx = 1\ndef f(:\n    pass\n"},
        "broken.py",
        "broken.py, line 3: SyntaxError: invalid syntax",
    ),
    "raises-on-import": (
        {"boom.py": "import rlzoo\n\nraise ValueError('no')\n"},
        "boom.py",
        "boom.py, line 3: ValueError: no",
    ),
    "raises-in-a-module-it-imports": (
        {"uses.py": "x = 1\nimport helper_lp\n", "helper_lp.py": "y = 1 / 0\n"},
        "uses.py",
        "uses.py, line 2 ({folder}/helper_lp.py, line 1): ZeroDivisionError",
    ),
    "registers-nothing": (
        {"empty.py": "import rlzoo\n"},
        "empty.py",
        "empty.py registers no component: give it module-level @rlzoo.hookimpl functions",
    ),
    "unknown-kind": (
        {"kind.py": "import rlzoo\n\n@rlzoo.register('clip', 'x')\nclass C:\n    pass\n"},
        "kind.py",
        "kind.py, line 3: rlzoo.register: unknown component kind 'clip'; kinds: ratio,",
    ),
    "hook-returns-junk": (
        {"junk.py": "import rlzoo\n\n@rlzoo.hookimpl\ndef rlzoo_clippers():\n    return [1]\n"},
        "junk.py",
        "junk.py: rlzoo_clippers returned 1, which is not a Component class",
    ),
    "not-a-python-name": (
        {"my-clip.py": "x = 1\n"},
        "my-clip.py",
        "its name must be a Python name (letters, digits, _): rename it, e.g. my_clip.py",
    ),
    "name-taken": ({"json.py": "x = 1\n"}, "json.py", "json.py: the module name 'json' is taken by "),
    "unknown-module": ({}, "rlzoo_lptest_nowhere.mod", "no module named 'rlzoo_lptest_nowhere.mod'"),
    "neither": ({}, "my clip", "'my clip' is neither a Python file (ending in .py) nor a module name"),
}


@pytest.mark.parametrize("case", list(BAD), ids=str)
def test_a_plugin_that_cannot_contribute_is_one_problem_naming_the_field(folder, case):
    files, entry, expected = BAD[case]
    for name, text in files.items():
        write(folder, name, text)
    registry = Registry()
    loc, message = problem(lambda: load_plugins([entry], registry, "plugins", folder))
    assert loc == "plugins.0" and expected.format(folder=folder) in message, message
    assert "Traceback" not in message
    loc, _ = problem(
        lambda: load_plugins(
            [str(folder / entry) if entry.endswith(".py") else entry], Registry(), "--plugin", Path("/")
        )
    )
    assert loc == "--plugin"


def test_a_script_that_failed_leaves_nothing_behind(folder):
    write(folder, "half.py", CLIPPER.replace("{name}", "half-clip") + "\nraise RuntimeError('late')\n")
    registry = Registry()
    problem(lambda: load_plugins(["half.py"], registry, "plugins", folder))
    assert "half" not in sys.modules and str(folder) not in sys.path
    assert registry.components("clipper") == [] and "half" not in registry_module._MARKED
    loc, _ = problem(lambda: load_plugins("half.py", registry, "plugins", folder))
    assert loc == "plugins"  # a string, not a list


@pytest.fixture(scope="module")
def installed() -> Registry:
    return Registry.discover()


def test_a_clash_with_a_builtin_name_names_both_origins_when_used(folder):
    installed = Registry.discover()
    path = write(folder, "clash.py", CLIPPER.replace("{name}", "ppo"))
    load_plugins(["clash.py"], installed, "plugins", folder)
    with pytest.raises(DuplicateComponentError) as info:
        installed.get("clipper", "ppo")
    assert str(info.value).startswith(
        f"clipper 'ppo' is registered twice: by rlzoo-estimators (plugin 'estimators') and by script clash.py "
        f"(plugin '{path}')"
    )
    assert sum(i.name == "ppo" and i.duplicate for i in installed.components("clipper")) == 2


# -- in a config -----------------------------------------------------------------------------------------------


def test_config_paths_resolve_against_its_folder_and_are_recorded_absolute(folder, monkeypatch, installed):
    write(folder, "exp/a_clip.py", CLIPPER.replace("{name}", "a-clip"))
    write(folder, "b_clip.py", CLIPPER.replace("{name}", "b-clip"))
    write(folder, "exp/run.yaml", "plugins: [./a_clip.py]\nalgorithm: {clipper: {name: b-clip}}\n")
    monkeypatch.chdir(folder)  # --plugin paths: the current folder's
    from rlzoo.config.loading import read_yaml

    config = build_config(
        read_yaml(folder / "exp/run.yaml"),
        [],
        installed,
        source=str(folder / "exp/run.yaml"),
        plugins=["b_clip.py", "./exp/a_clip.py"],
    )
    assert config.plugins == [str(folder / "exp/a_clip.py"), str(folder / "b_clip.py")]
    assert config.algorithm.clipper.name == "b-clip"
    again = build_config(json.loads(json.dumps(config.model_dump(mode="json"))), [], installed)  # a run's config.yaml
    assert again.plugins == config.plugins
    with pytest.raises(ConfigError) as info:
        build_config({"plugins": ["./missing.py"]}, [], installed, source="exp/run.yaml", folder=folder / "exp")
    assert (
        str(info.value)
        == f"invalid config exp/run.yaml:\n  plugins.0: ./missing.py does not exist ({folder}/exp/missing.py)"
    )


def test_a_spawned_worker_finds_the_script_module_by_name(folder):
    """A process the component starts (multiprocessing, spawn) unpickles the script's function by its module's name:
    the parent put the file's folder on sys.path, which a spawned child inherits."""
    write(folder, "spawn_clip.py", CLIPPER.replace("{name}", "spawn-clip"))
    load_plugins(["spawn_clip.py"], Registry(), "plugins", folder)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(sys.modules["spawn_clip"].work, 2.0).result(timeout=300) == -1.0


# -- what a resume and a sweep compare -------------------------------------------------------------------------


def test_a_resume_refuses_a_changed_file_unless_allowed_and_records_the_change(folder):
    path = write(folder, "r_clip.py", CLIPPER.replace("{name}", "r-clip"))
    config = RunConfig(plugins=[str(path)])
    run = folder / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(config))
    record_plugins(run, config)
    old = digests([str(path)])[str(path)]
    assert json.loads((run / PLUGINS_FILE).read_text()) == {str(path): old}
    assert config_changes(run, config) == {}
    path.write_text(path.read_text() + "\n# tuned\n")
    new = local_plugins.file_digest(path)
    changes = config_changes(run, config)
    assert changes == {f"plugins.{path}": (old, new)}
    [(loc, message)] = refusal_problems(refused(changes))
    assert (
        loc == "plugins"
        and message.startswith(
            f"{path} changed since the run started (sha256 {old[7:19]}... -> {new[7:19]}...); a resume runs the code"
        )
        and "--allow-changes plugins" in message
    )
    assert refused(changes, ["plugins"]) == {}
    record_changes(run, 3, changes)  # as the run does when the resume goes ahead
    record_plugins(run, config)
    assert config_changes(run, config) == {}
    assert json.loads((run / CHANGES_FILE).read_text())["changes"] == {f"plugins.{path}": [old, new]}
    # a file dropped from the list: the list's change names it, the digest's is not a second problem
    dropped = config_changes(run, RunConfig())
    assert [loc for loc, _ in refusal_problems(refused(dropped))] == ["plugins"] and len(dropped) == 2


def test_a_sweep_records_its_plugins_and_refuses_a_changed_file(folder, installed):
    from rlzoo.sweep.grid import build_sweep, check_folder, parse_vary, write_manifest

    path = write(folder, "s_clip.py", CLIPPER.replace("{name}", "s-clip"))
    varies = [parse_vary("algorithm.clipper.name=ppo,s-clip")]
    sweep = build_sweep(str(EXAMPLE), varies, 1, folder / "out", ENGINES, installed, plugins=[str(path)])
    assert [r.config.algorithm.clipper.name for r in sweep.runs] == ["ppo", "s-clip"]
    assert all(r.config.plugins == [str(path)] for r in sweep.runs)
    assert sweep.manifest["plugins"] == {str(path): local_plugins.file_digest(path)}
    write_manifest(sweep)
    check_folder(sweep)  # the same sweep: resumed
    changed = dict(sweep.manifest["plugins"])
    changed[str(path)] = "sha256:0"
    sweep.manifest["plugins"] = changed
    with pytest.raises(RlzooError, match="holds a different sweep \\(its plugins differs"):
        check_folder(sweep)
