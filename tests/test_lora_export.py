"""``rlzoo export``'s checks (:func:`rlzoo.engines.lora.export_merged`, the checkpoint's digests): adapters and a base
that do not fit, damaged or non-finite adapters, a damaged base, each refused before anything is written; the
export itself stays exact (tests/test_lora.py). Through the real CLI: tests/test_fault_table_models.py."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_critic import TOKENIZER, policy_dir  # noqa: F401  (the tiny dense and MoE policies)
from test_lora import _engine, _train

from rlzoo.config.schema import TinyModelConfig
from rlzoo.engines.lora import export_merged, fit_problem
from rlzoo.errors import RlzooError
from rlzoo.models import build_tiny_model, save_model
from rlzoo.runtime.checkpoint.digests import verify_checkpoint, write_manifest


@pytest.fixture(scope="module")
def saved(policy_dir, tmp_path_factory):  # noqa: F811
    """A trained policy's checkpoint-like folder (``model/`` adapters, an optimizer file, ``digests.json``), a
    base of the same architecture with another hidden size, and whether the policy is a mixture of experts."""
    root = tmp_path_factory.mktemp("export")
    engine = _engine(policy_dir)
    _train(engine)
    engine.save(root / "ckpt")
    write_manifest(root / "ckpt")
    moe = "moe" in str(policy_dir)
    other = TinyModelConfig(
        architecture="qwen3_moe" if moe else "qwen3",
        hidden_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        intermediate_size=64,
    )
    base = save_model(build_tiny_model(other, TOKENIZER), TOKENIZER, root / "other")
    return root / "ckpt", base, moe


def _adapters(saved, tmp_path):
    return shutil.copytree(saved[0] / "model", tmp_path / "adapters")


def test_fit_names_both_shapes_then_extra_then_missing_tensors():
    needed = {"x.lora_A.weight": (4, 32), "x.lora_B.weight": (32, 4), "y.lora_A.weight": (4, 32)}
    assert fit_problem(dict(needed), needed) is None
    assert fit_problem({**needed, "x.lora_A.weight": (4, 64)}, needed) == (
        "1 of 3 adapter tensors have another shape than this base needs, e.g. x.lora_A.weight is [4, 64] in the "
        "adapters and [4, 32] for this base"
    )
    assert fit_problem({**needed, "z.lora_A.weight": (4, 32)}, needed) == (
        "the adapters hold 1 tensors for modules this base lacks, e.g. z.lora_A.weight"
    )
    assert fit_problem({"x.lora_A.weight": (4, 32)}, needed) == (
        "this base has 2 adapted weights the adapters hold nothing for, e.g. x.lora_B.weight"
    )


def test_a_base_of_another_shape_is_refused_naming_both_shapes(saved, tmp_path):
    """Dense attention adapters, and a MoE policy's fused-expert adapters (peft's target_parameters), alike."""
    with pytest.raises(RlzooError) as refused:
        export_merged(saved[0] / "model", tmp_path / "out", saved[1])
    message = str(refused.value)
    assert message.startswith(f"export: --base {saved[1]} does not fit the adapters in ")
    assert "adapter tensors have another shape than this base needs" in message
    shapes = re.search(r"\.lora_[AB]\.weight is (\[[\d, ]+\]) in the adapters and (\[[\d, ]+\]) for this base", message)
    assert shapes and shapes[1] != shapes[2], message
    if saved[2]:  # the fused experts' adapters are compared too (sorted first: mlp.experts before self_attn)
        assert ".mlp.experts." in message, message
    assert not (tmp_path / "out").exists()


def test_the_recorded_base_and_the_same_base_as_a_flag_export(saved, policy_dir, tmp_path):  # noqa: F811
    out = export_merged(saved[0] / "model", tmp_path / "out", policy_dir)
    assert (out / "model.safetensors").is_file() and not list(tmp_path.glob(".out.tmp-*"))


def test_non_finite_adapters_are_refused(saved, tmp_path):
    folder = _adapters(saved, tmp_path)
    file = folder / "adapter_model.safetensors"
    tensors = load_file(str(file))
    name = sorted(tensors)[3]
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(file))
    with pytest.raises(
        RlzooError,
        match=rf"export: {file} holds values that are not finite \(NaN or infinite\) in 1 "
        rf"tensors, e.g. {name}: ",
    ):
        export_merged(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_truncated_adapter_file_and_a_broken_adapter_config_are_refused(saved, tmp_path):
    folder = _adapters(saved, tmp_path)
    file = folder / "adapter_model.safetensors"
    size = file.stat().st_size
    with open(file, "r+b") as handle:
        handle.truncate(size - 16)
    with pytest.raises(RlzooError, match=rf"export: {file} is damaged: truncated \({size - 16} of {size} bytes\)"):
        export_merged(folder, tmp_path / "out")
    (folder / "adapter_config.json").write_text('{"r": 4,')
    with pytest.raises(RlzooError, match=rf"export: {folder / 'adapter_config.json'} is not readable JSON"):
        export_merged(folder, tmp_path / "out")


def test_a_base_with_damaged_weights_is_refused_naming_the_file(saved, policy_dir, tmp_path):  # noqa: F811
    base = shutil.copytree(policy_dir, tmp_path / "base")
    (base / "model.safetensors").write_bytes((base / "model.safetensors").read_bytes()[:100])
    with pytest.raises(RlzooError, match=rf"export: --base {base}: {base / 'model.safetensors'} is damaged: truncated"):
        export_merged(saved[0] / "model", tmp_path / "out", base)


def test_a_base_of_another_model_class_is_refused(saved, policy_dir, tmp_path):  # noqa: F811
    base = shutil.copytree(policy_dir, tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (base / "config.json").write_text(json.dumps(config))
    recorded = json.loads((saved[0] / "model" / "adapter_config.json").read_text())
    trained_on = recorded["auto_mapping"]["base_model_class"]
    with pytest.raises(RlzooError, match=rf"is a LlamaForCausalLM, but the adapters were trained on a {trained_on}"):
        export_merged(saved[0] / "model", tmp_path / "out", base)


def test_export_verifies_the_model_files_only(saved, tmp_path):
    """Against digests.json (a damaged optimizer does not stop an export; a changed adapter does), and by structure
    where a checkpoint has no digests.json."""
    checkpoint = shutil.copytree(saved[0], tmp_path / "ckpt")
    assert verify_checkpoint(checkpoint, within="model").intact
    (checkpoint / "optimizer.safetensors").write_bytes(b"damaged")
    assert verify_checkpoint(checkpoint, within="model").intact and not verify_checkpoint(checkpoint).intact
    adapter = checkpoint / "model" / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-8] ^= 0xFF
    adapter.write_bytes(bytes(data))
    assert verify_checkpoint(checkpoint, within="model").problems == [
        "model/adapter_model.safetensors: content differs from its recorded sha256 digest"
    ]
    (checkpoint / "digests.json").unlink()
    assert verify_checkpoint(checkpoint, within="model").problems == []  # flipped bytes: only a digest tells
    adapter.write_bytes(bytes(data[:-8]))
    check = verify_checkpoint(checkpoint, within="model")
    assert not check.verified and check.problems[0].startswith("model/adapter_model.safetensors: truncated (")
