"""A verl-style chat parquet file trains a model folder of the user's own on hf + torch (vLLM + DeepSpeed-MoE: slow).

The model folder is a tiny random-init Qwen3-MoE whose vocabulary is a byte-level BPE with a Qwen3-style chat
template built locally (rlzoo.models.chat; no installable package ships Qwen's own tokenizer with its template).
The task reads the file with `layout: verl` and nothing else; the cold start is off; one prompt is longer than
`prompt.max_prompt_tokens` and is dropped with a count in the log.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest
import yaml

from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.checkpoint.files import latest_checkpoint

pytestmark = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="needs datasets")
needs_engines = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("vllm", "deepspeed")),
    reason="needs vLLM (bash scripts/install.sh --vllm) and DeepSpeed",
)
ENGINES = {
    "hf-torch": ({"name": "hf"}, {"name": "torch"}),
    "vllm-deepspeed-moe": (
        {"name": "vllm", "kv_cache_memory_bytes": 33554432},
        {"name": "deepspeed", "zero_stage": 2, "moe": "deepspeed"},
    ),
}

INSTRUCTION = "Put the final answer in \\boxed{}."


def verl_rows(pairs, split):
    return [
        {
            "data_source": "rlzoo/addition",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i},
        }
        for i, (a, b) in enumerate(pairs)
    ]


@pytest.mark.parametrize(  # the main job's engines slow (~3 minutes on two loaded cores): the chat dataset's path
    # (its loading, template and checkpointed tokenizer) is the engines' same; they run by default with the tiny task
    # (test_presets_end_to_end.py::test_preset_on_vllm_and_deepspeed_moe[gspo])
    "engines",
    ["hf-torch", pytest.param("vllm-deepspeed-moe", marks=[needs_engines, pytest.mark.slow])],
)
def test_chat_parquet_trains_three_steps(tmp_path, engines):
    rollout_engine, trainer_engine = ENGINES[engines]
    import datasets

    from rlzoo.config.schema import TinyModelConfig
    from rlzoo.models import build_tiny_model, save_model
    from rlzoo.models.chat import build_chat_tokenizer

    train = verl_rows([(a, b) for a in range(1, 6) for b in range(1, 5)], "train")
    train.append(verl_rows([(7, 7)], "train")[0] | {"prompt": [{"role": "user", "content": "very long " * 60}]})
    test = verl_rows([(a, 9) for a in range(10, 14)], "test")
    datasets.Dataset.from_list(train).to_parquet(str(tmp_path / "train.parquet"))
    datasets.Dataset.from_list(test).to_parquet(str(tmp_path / "test.parquet"))

    texts = [m["content"] for r in train + test for m in r["prompt"]] + [f"\\boxed{{{n}}}" for n in range(30)]
    texts += ["system\nYou are a careful solver.", "user\n", "assistant\n<think>\n\n</think>\n\n"]  # the template's
    tokenizer = build_chat_tokenizer(texts, vocab_size=384)
    model_dir = save_model(build_tiny_model(TinyModelConfig(), tokenizer, seed=0), tokenizer, tmp_path / "my-model")

    run_dir = tmp_path / "run"
    config = {
        "output_dir": str(run_dir),
        "model": {"path": str(model_dir)},
        "cold_start": {"enabled": False},
        "task": {
            "name": "dataset",
            "path": str(tmp_path / "train.parquet"),
            "layout": "verl",
            "eval_path": str(tmp_path / "test.parquet"),
            "cache_dir": str(tmp_path / "hf-cache"),
        },
        "prompt": {
            "max_prompt_tokens": 64,
            "system": "You are a careful solver.",
            "chat_template_kwargs": {"enable_thinking": False},
        },
        "algorithm": {"preset": "gspo", "minibatches_per_rollout": 2},
        "rollout": {
            "engine": rollout_engine,
            "prompts_per_step": 4,
            "group_size": 4,
            "max_new_tokens": 12,
        },
        "trainer": {"engine": trainer_engine},
        "train": {"steps": 3, "eval_every": 2, "eval_prompts": 4, "checkpoint_every": 3},
    }
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(config))
    cli = [sys.executable, "-m", "rlzoo.cli"]
    subprocess.run([*cli, "config", "check", str(config_file)], check=True, timeout=300, capture_output=True)
    done = subprocess.run([*cli, "train", str(config_file)], timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]

    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [0, 1, 2] and rows[-1].get("final") == 1.0
    for r in steps:
        for key in ("reward/mean", "loss/policy", "mismatch/abs_logp_diff", "response/length_mean"):
            assert math.isfinite(r[key]), (key, r)
        assert r["verifier/errors"] == 0 and r["mismatch/abs_logp_diff"] < 1e-4  # fp32: the rollout engine agrees
    log = done.stderr + "".join(p.read_text() for p in run_dir.glob("*.txt"))
    assert "train split: 1 of 21 prompts are longer than prompt.max_prompt_tokens=64 and are dropped" in log
    model = latest_checkpoint(run_dir) / "model"  # the tokenizer and its chat template travel with the weights
    assert json.loads((model / "config.json").read_text())["vocab_size"] == len(tokenizer)
    assert (model / "chat_template.jinja").read_text() == tokenizer.chat_template
