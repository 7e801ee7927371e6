"""examples/plugin-template installs with pip into a fresh virtual environment and its own tests pass there.

The venv is layered over the test environment as in test_third_party_plugin.py (rlzoo and its first-party plugins
come from there; the template is installed into the new venv), so nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_third_party_plugin import layered_venv, pip_install, run

pytestmark = pytest.mark.timeout(300)

TEMPLATE = Path(__file__).resolve().parents[1] / "examples" / "plugin-template"


def test_the_plugin_template_installs_and_its_tests_pass(tmp_path):
    source = tmp_path / "template"
    shutil.copytree(TEMPLATE, source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    python = layered_venv(tmp_path / "venv")
    pip_install(python, source)
    where = run([python, "-c", "import rlzoo_plugin_template; print(rlzoo_plugin_template.__file__)"]).stdout.strip()
    assert where.startswith(str(tmp_path / "venv")), where  # installed into the new venv
    proc = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(source / "tests")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 passed" in proc.stdout
