"""Fixtures the tests/ folder shares."""

from __future__ import annotations

import pytest
from venv_testlib import PluginVenv, make_plugin_venv


@pytest.fixture(scope="session")
def plugin_venv(tmp_path_factory) -> PluginVenv:
    """One venv per session with every third-party test distribution pip-installed (tests/venv_testlib.py): the
    tests of a third party's plugin, engines and tool and of the plugin template share it (building and installing
    into a venv costs seconds of pip and setuptools each time)."""
    return make_plugin_venv(tmp_path_factory.mktemp("plugin_venv"))
