"""Fixtures for the end-to-end runs: the cold starts' shared folder, and no process group left between modules.
What the tests share besides fixtures is in ``runs_testlib.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module", autouse=True)
def _no_process_group_left_behind():
    """A module that trains with DeepSpeed in this process leaves a torch.distributed group listening on the port
    it put in ``MASTER_PORT``; later modules' subprocesses would inherit that variable and fail to bind the port."""
    yield
    from rlzoo.engines.deepspeed.env import shutdown_distributed

    shutdown_distributed()


@pytest.fixture(scope="session")
def cold_start_root(tmp_path_factory) -> Path:
    """Where the tests' cold starts are built, one folder per setting: shared by the session's xdist workers (their
    temporary folders share a parent), so a cold start two workers need is built once. rlzoo's own build lock
    (:func:`rlzoo.runtime.runlock.building`) makes the second worker wait for the first's and reuse it."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "cold_start"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """Where vLLM finds rlzoo's entry point when this environment's install predates it (``pip install -e .`` adds
    it): a dist-info folder on sys.path and on the servers' PYTHONPATH, for this module only."""
    from rlzoo.engines.vllm_server import launcher

    if launcher.plugin_installed():
        yield
        return
    root = tmp_path_factory.mktemp("plugin")
    info = root / "rlzoo_gloo_dev-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlzoo-gloo-dev\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nrlzoo_gloo = {launcher.PLUGIN}\n")
    old = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *sys.path[1:]])
    yield
    sys.path.remove(str(root))
    os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
