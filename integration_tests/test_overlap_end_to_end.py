"""``rollout.overlap: 1`` end to end (transformers rollouts, torch training): a run trains with finite metrics,
every batch after the first sampled one step stale, and resumes from a checkpoint by sampling its first batch
afresh (staleness 0 at that step, as rlzoo.rl.overlap documents)."""

from __future__ import annotations

import math

from runs_testlib import assert_finite_metrics, make_config

from rlzoo.runtime.run import train


def _train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "reward/mean" in r]


def test_overlap_trains_end_to_end_and_resumes(tmp_path, cold_start_root):
    run_dir = tmp_path / "run"
    overrides = ("rollout.overlap=1", "train.checkpoint_every=2")
    train(make_config(run_dir, cold_start_root, *overrides, "train.steps=4"), progress=False)
    rows = _train_rows(assert_finite_metrics(run_dir, 4))
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(math.isfinite(r["time/prefetch_wait"]) for r in rows[:3])  # the last step prefetches nothing
    assert "time/prefetch_wait" not in rows[3]

    train(make_config(run_dir, cold_start_root, *overrides, "train.steps=6"), resume=run_dir, progress=False)
    resumed = _train_rows(assert_finite_metrics(run_dir, 6))
    assert resumed[:4] == rows  # the steps before the checkpoint are kept as they were
    assert [r["rollout/staleness"] for r in resumed[4:]] == [0.0, 1.0]  # the prefetched batch is sampled afresh
