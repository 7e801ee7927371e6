"""``benchmarks/gpu_check.sh``, the script docs/gpu.md's H100 numbers came from, runs end to end here (on the CPU,
``device: auto``): a random model of Qwen3's shape (2 layers here, from a shrunken copy of the recipe's
config.json) with SmolLM2's tokenizer, the recipe's config with the script's overrides, one step, and the script's
summary of step time and memory. What it needs a GPU for (the memory metric, the numbers) is not checked here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a smoke run of a GPU script on the CPU (~30 s)
def test_the_gpu_check_script_runs_the_recipe(tmp_path, smollm2_dir):
    config = json.loads((ROOT / "examples/gpu/models/qwen3-1.7b/config.json").read_text())
    config.update(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    (tmp_path / "shape").mkdir()
    (tmp_path / "shape" / "config.json").write_text(json.dumps(config))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GPU_CHECK_STEPS": "1",
        "GPU_CHECK_MODEL_CONFIG": str(tmp_path / "shape" / "config.json"),
        "GPU_CHECK_RUNS": str(tmp_path / "runs"),
        "GPU_CHECK_SET": "--set rollout.max_new_tokens=8 --set rollout.prompts_per_step=4 --set train.eval_prompts=4",
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), str(tmp_path / "out"), "recipe", str(smollm2_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "qwen3-1.7b: rlzoo train exit 0" in proc.stdout, proc.stdout
    assert "#   total" in proc.stdout  # the estimate of the same config
    rows = [json.loads(line) for line in (tmp_path / "out" / "qwen3-1.7b-metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "time/train" in r] == [0]
    assert "step 0:" in proc.stdout and "mean s/step" in proc.stdout
    model = json.loads((tmp_path / "runs" / "qwen3-1.7b-random" / "config.json").read_text())
    assert model["vocab_size"] == 49152 and model["eos_token_id"] < model["vocab_size"]  # the tokenizer's ids
