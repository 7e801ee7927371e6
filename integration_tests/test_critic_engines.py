"""A critic trains on every training engine as the policy does: the `ppo` preset on DeepSpeed ZeRO-3 (parameters
partitioned, the value head included) logs the critic metrics of the plain torch engine, and its value loss falls.

ZeRO-2 with DeepSpeed-MoE and two processes are in test_resume.py and test_multiprocess.py (``ppo`` variants)."""

from __future__ import annotations

import pytest
from runs_testlib import make_config

from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.run import train

CRITIC_KEYS = ("critic/value_mean", "critic/vf_loss", "critic/grad_norm", "critic/explained_variance", "kl/in_reward")


def _critic_rows(run_dir):
    return [{k: r[k] for k in CRITIC_KEYS} for r in read_metrics(run_dir / "metrics.jsonl") if "critic/vf_loss" in r]


def test_ppo_on_deepspeed_zero3_matches_the_torch_engine(tmp_path, cold_start_root):
    pytest.importorskip("deepspeed")
    runs = {}
    for name, engine in [("torch", "{name: torch}"), ("zero3", "{name: deepspeed, zero_stage: 3}")]:
        config = make_config(tmp_path / name, cold_start_root, "algorithm.preset=ppo", f"trainer.engine={engine}")
        runs[name] = _critic_rows(train(config, progress=False))
    assert len(runs["torch"]) == 3
    for torch_row, zero3_row in zip(runs["torch"], runs["zero3"], strict=True):
        assert zero3_row == pytest.approx(torch_row, rel=1e-4, abs=1e-6)
    assert runs["torch"][-1]["critic/vf_loss"] < runs["torch"][0]["critic/vf_loss"]  # the critic learns
