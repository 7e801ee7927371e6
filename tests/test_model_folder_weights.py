"""The model folder's weight check (:meth:`rlzoo.models.folder.ModelFolder.weight_problems`): damaged safetensors
files and missing shards, found from headers and file names alone, read the same for the policy, a critic, a
teacher and a reward model (each caller prefixes its field; tests/test_fault_table_models.py runs those through
the CLI)."""

from __future__ import annotations

import json
import shutil

import pytest

from rlzoo.config.schema import TinyModelConfig
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model
from rlzoo.models.folder import ModelFolder

TOKENIZER = build_char_tokenizer("0123456789+=")
TINY = TinyModelConfig(architecture="qwen3", hidden_size=32, head_dim=16, intermediate_size=64)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``whole``: one weight file; ``sharded``: the same model in three shards and an index."""
    root = tmp_path_factory.mktemp("models")
    model = build_tiny_model(TINY, TOKENIZER)
    whole = save_model(model, TOKENIZER, root / "whole")
    sharded = root / "sharded"
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="20KB")
    TOKENIZER.save_pretrained(sharded)
    return whole, sharded


def _copy(source, tmp_path):
    return shutil.copytree(source, tmp_path / source.name)


def test_whole_folders_have_no_problems(folders):
    whole, sharded = folders
    assert len(list(sharded.glob("*.safetensors"))) >= 3 and list(sharded.glob("*.index.json"))
    for folder in folders:
        assert ModelFolder.read(folder).problems(tokenizer="", ids=True) == []


def test_truncated_weights_are_named_with_their_sizes(folders, tmp_path):
    folder = _copy(folders[0], tmp_path)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(size // 2)
    assert ModelFolder.read(folder).problems() == [
        f"{weights} is damaged: truncated ({size // 2} of {size} bytes); the weights cannot be loaded: copy or save "
        "the model again"
    ]


def test_a_damaged_shard_a_missing_shard_and_a_damaged_index(folders, tmp_path):
    folder = _copy(folders[1], tmp_path)
    index = next(folder.glob("*.index.json"))
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    (folder / shards[0]).write_bytes(b"\0" * 4)
    (folder / shards[1]).unlink()
    problems = ModelFolder.read(folder).problems()
    assert problems == [
        f"{folder / shards[0]} is damaged: truncated (4 bytes, not even a header); the weights cannot be loaded: copy "
        "or save the model again",
        f"{index} names 1 weight file(s) the folder lacks, e.g. {shards[1]}: copy the model again",
    ]
    index.write_text('{"weight_map": ')
    assert ModelFolder.read(folder).weight_problems()[-1].startswith(f"{index} is not a readable shard index (")


def test_pytorch_bin_weights_are_not_read(folders, tmp_path):
    """Only safetensors headers are read: a .bin file is a pickle, not opened before the model loads."""
    folder = _copy(folders[0], tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"anything")
    assert ModelFolder.read(folder).problems() == []
