"""LoRA trains on every training engine as full fine-tuning does: DeepSpeed ZeRO-1 and ZeRO-2 (the adapters'
optimizer state partitioned; ZeRO-3 is refused, test_bad_configs.py) and DeepSpeed-MoE at ZeRO 0 log the plain
torch engine's metrics, with a KL reference that is the policy's own base; the run's checkpoint holds adapters
that ``rlzoo export`` merges.

A LoRA run killed and resumed (torch, and the main job's vLLM + DeepSpeed): test_resume.py (``lora`` variants)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from runs_testlib import make_config

from rlzoo.models import load_model
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.checkpoint.files import latest_checkpoint
from rlzoo.runtime.run import train

KEYS = ("reward/mean", "train/grad_norm", "kl/ref", "policy/entropy", "clip/fraction")
ATTENTION = "[q_proj, k_proj, v_proj, o_proj]"
EXPERTS = "[q_proj, v_proj, experts.gate_up_proj, experts.down_proj]"


def _rows(run_dir):
    return [{k: r[k] for k in KEYS if k in r} for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]


def _lora_config(run_dir, cold_start_root, engine: str, targets: str, *extra: str):
    return make_config(
        run_dir,
        cold_start_root,
        f"trainer.engine={engine}",
        "trainer.lr=0.002",
        "algorithm.kl_coef=0.05",
        f"model.lora={{rank: 4, alpha: 8, target_modules: {targets}}}",
        *extra,
    )


@pytest.mark.parametrize(
    "engine, targets",
    [
        ("{name: deepspeed, zero_stage: 2}", EXPERTS),
        ("{name: deepspeed, zero_stage: 1}", ATTENTION),
        ("{name: deepspeed, zero_stage: 0, moe: deepspeed}", ATTENTION),
    ],
    ids=["zero2", "zero1", "ds-moe-zero0"],
)
def test_lora_on_deepspeed_matches_the_torch_engine(tmp_path, cold_start_root, engine, targets):
    pytest.importorskip("deepspeed")
    expected = _rows(train(_lora_config(tmp_path / "torch", cold_start_root, "{name: torch}", targets), progress=False))
    actual = _rows(train(_lora_config(tmp_path / "ds", cold_start_root, engine, targets), progress=False))
    assert len(expected) == 3 and expected[-1]["kl/ref"] > 0  # the adapters moved away from the base
    for torch_row, ds_row in zip(expected, actual, strict=True):
        assert ds_row == pytest.approx(torch_row, rel=1e-4, abs=1e-6)


def test_rlzoo_export_merges_a_lora_checkpoint(tmp_path, cold_start_root):
    run_dir = train(_lora_config(tmp_path / "run", cold_start_root, "{name: torch}", EXPERTS), progress=False)
    checkpoint = latest_checkpoint(run_dir)
    assert (checkpoint / "model" / "adapter_model.safetensors").is_file()
    command = [sys.executable, "-m", "rlzoo.cli", "export", str(checkpoint), str(tmp_path / "merged")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "not empty" in again.stderr and "Traceback" not in again.stderr

    from peft import PeftModel

    base = load_model(_base_of(checkpoint))[0]  # the folder the adapters record as their base
    wrapped = PeftModel.from_pretrained(base, str(checkpoint / "model"))
    merged = load_model(tmp_path / "merged")[0]
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, wrapped(input_ids=ids).logits, atol=1e-5)


def _base_of(checkpoint):
    import json

    return json.loads((checkpoint / "model" / "adapter_config.json").read_text())["base_model_name_or_path"]
