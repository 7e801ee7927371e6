"""Virtual environments for the tests of third-party distributions: one venv per session, layered over the test
environment, with every test distribution pip-installed into it in one pip call (tests/conftest.py,
``plugin_venv``). Nothing is downloaded: pip, setuptools, rlzoo and its first-party plugins come from the test
environment.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# the distributions the session's venv holds: their source folders, and the module each installs
TEMPLATE = TESTS.parent / "examples" / "plugin-template"
ENGINES = TESTS / "third_party_engines"
TOOL = TESTS / "third_party_tool"

PLUGIN_SOURCE = '''
"""A third-party rlzoo plugin used by the tests: one clipper."""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params


class HalfClip(Clipper):
    """Half clip: loss = -scale * rho * A (a test plugin's clipper)."""

    name = "{name}"

    class Params(Params):
        scale: float = Field(0.5, gt=0)

    def __init__(self, params=None) -> None:
        super().__init__(params)
        if self.name == "fragile-clip":  # the set-up failure of test_a_plugin_failing_at_set_up_...
            raise RuntimeError("this clipper needs a GPU")

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=-self.params.scale * ratio * advantages, clipped_low=never, clipped_high=never)


@rlzoo.hookimpl
def rlzoo_clippers() -> list[type]:
    return [HalfClip]
'''


def make_distribution(root: Path, dist: str, package: str, entry_point: str, clipper_name: str) -> Path:
    """The source tree of a distribution ``dist`` whose plugin registers :data:`PLUGIN_SOURCE`'s clipper."""
    source = root / dist
    (source / package).mkdir(parents=True)
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{dist}"
            version = "0.0.1"
            dependencies = ["rlzoo"]

            [project.entry-points.rlzoo]
            {entry_point} = "{package}.plugin"

            [tool.setuptools.packages.find]
            include = ["{package}*"]
            """
        )
    )
    (source / package / "__init__.py").write_text("")
    (source / package / "plugin.py").write_text(PLUGIN_SOURCE.replace("{name}", clipper_name))
    return source


def run(args: list, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=240, env=env, cwd=cwd)


def pip_install(python: Path, *args) -> None:
    proc = run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", *args])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def layered_venv(env_dir: Path) -> Path:
    """A venv whose interpreter also sees every site-packages folder of the running one; returns its python.

    ``venv --system-site-packages`` is not enough: made from a venv's python it exposes the *base* interpreter's
    site-packages (no rlzoo there, and an old setuptools without ``bdist_wheel``), not the test venv's. A ``.pth``
    line that calls ``site.addsitedir`` adds the running interpreter's folders after the new venv's own, with their
    ``.pth`` files processed (editable installs), so a distribution installed into the new venv is found first and
    pip, setuptools and rlzoo come from the test environment. No pip of its own (``--without-pip``): the test
    environment's pip, run by the new interpreter, installs into the new venv.
    """
    proc = run([sys.executable, "-m", "venv", "--without-pip", env_dir])
    assert proc.returncode == 0, proc.stderr
    python = env_dir / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "_rlzoo_test_outer.pth").write_text(f"import site; list(map(site.addsitedir, {outer!r}))\n")
    return python


@dataclass
class PluginVenv:
    """The session's venv: its ``python``, its folder ``root``, and the copies of the sources installed into it."""

    python: Path
    root: Path
    sources: dict[str, Path]

    def assert_installed_here(self, module: str) -> None:
        """``module`` imports from this venv, not from the test environment."""
        where = run([self.python, "-c", f"import {module}; print({module}.__file__)"]).stdout.strip()
        assert where.startswith(str(self.root / "venv")), where


def make_plugin_venv(root: Path) -> PluginVenv:
    """A venv layered over the test environment with ``rlzoo-myplug`` (one clipper, ``half-clip``), the plugin
    template (examples/plugin-template), ``rlzoo-thirdparty-engines`` and ``rlzoo-wordcount-tool`` installed, from
    copies of their sources (no build artefacts land in the repository); their component names are all distinct."""
    import setuptools

    # a wheel built with --no-build-isolation uses the environment's setuptools; bdist_wheel is built in from 70.1
    assert tuple(int(x) for x in setuptools.__version__.split(".")[:2]) >= (70, 1), (
        f"setuptools {setuptools.__version__} cannot build wheels without the `wheel` package: "
        "install the test tools with `bash scripts/install.sh --test`"
    )
    ignore = shutil.ignore_patterns("*.egg-info", "__pycache__", "build")
    sources = {"rlzoo_myplug": make_distribution(root / "src", "rlzoo-myplug", "rlzoo_myplug", "myplug", "half-clip")}
    for module, source in (
        ("rlzoo_plugin_template", TEMPLATE),
        ("rlzoo_thirdparty_engines", ENGINES),
        ("rlzoo_wordcount_tool", TOOL),
    ):
        sources[module] = shutil.copytree(source, root / "src" / source.name, ignore=ignore)
    python = layered_venv(root / "venv")
    pip_install(python, *sources.values())
    return PluginVenv(python, root, sources)
