"""Every preset, and the process-advantage path, trains a few steps end to end on the tiny MoE."""

from __future__ import annotations

import pytest
from conftest import assert_finite_metrics, make_config

from rlzoo.presets import PRESETS
from rlzoo.run import train


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_runs_end_to_end(preset, tmp_path, cold_start_root):
    config = make_config(tmp_path / preset, cold_start_root, f"algorithm.preset={preset}")
    run_dir = train(config, progress=False)
    rows = assert_finite_metrics(run_dir, config.train.steps)
    if config.algorithm.kl_coef > 0:
        assert all("kl/ref" in r for r in rows if "reward/mean" in r)
    assert (run_dir / "checkpoints" / "latest").is_file()


def test_process_advantages_on_the_chain_task(tmp_path, cold_start_root):
    config = make_config(
        tmp_path / "process",
        cold_start_root,
        "algorithm.preset=gspo-token",
        "algorithm.advantage={name: process}",
        "task={name: chain, terms: 3}",
        "verifier={name: process}",
        "rollout.max_new_tokens=12",
        task="chain",
    )
    run_dir = train(config, progress=False)
    rows = assert_finite_metrics(run_dir, config.train.steps)
    # step rewards reach the tokens: some response has a non-zero per-token advantage
    assert any(r["advantage/abs_mean"] > 0 for r in rows if "advantage/abs_mean" in r)
