"""examples/plugin-template installs with pip into a fresh virtual environment and its own tests pass there.

The venv is the session's, layered over the test environment (tests/venv_testlib.py: rlzoo and its first-party
plugins come from there; a copy of the template is installed into the new venv), so nothing is downloaded.
"""

from __future__ import annotations

import pytest
from venv_testlib import PluginVenv, run

pytestmark = pytest.mark.timeout(300)


def test_the_plugin_template_installs_and_its_tests_pass(plugin_venv: PluginVenv, tmp_path):
    plugin_venv.assert_installed_here("rlzoo_plugin_template")  # pip installed a copy of examples/plugin-template
    source = plugin_venv.sources["rlzoo_plugin_template"]
    proc = run([plugin_venv.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", source / "tests"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 passed" in proc.stdout
