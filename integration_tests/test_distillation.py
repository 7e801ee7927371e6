"""On-policy distillation end to end: ``rlzoo train examples/distill_tiny.yaml`` on the in-process engines, a small
student (1 layer, width 32) distilling a larger tiny teacher (width 128) that the run cold-starts itself
(``teacher.tiny``), with the reverse KL alone as the advantage (``reverse-kl``, ``task: null``).

Both cold starts are short (40 SFT steps) and the student is the smaller, so its samples are far from the teacher's
distribution at the start: over seeds 0-2 the first three steps' reverse KL averages 0.55-0.91 nats per token, and
after 15 steps of 64 responses at lr 1e-3 the last three average 0.28-0.53 of that (seed 0, tested: 0.88 -> 0.46).
A resumed run starts the teacher again from the same folder (reused, not rebuilt), and a teacher given as a folder
composes with the task reward's advantage."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from runs_testlib import FAST, REPO

from rlzoo.reporting.metrics_log import read_metrics

EXAMPLE = REPO / "examples" / "distill_tiny.yaml"
STEPS = 15
DISTILL = [
    *FAST,
    "model.tiny.hidden_size=32",  # the student: smaller than the teacher
    "model.tiny.num_hidden_layers=1",
    "teacher.model=null",
    "teacher.tiny={hidden_size: 128}",  # the teacher: the example's sizes, four times as wide
    "rollout.prompts_per_step=8",
    "rollout.group_size=8",
    "trainer.lr=1.0e-3",
    f"train.steps={STEPS}",
    "train.eval_every=100",
    "train.checkpoint_every=5",
]


def rlzoo_train(cwd: Path, overrides: list[str], *args: str) -> None:
    sets = [a for o in overrides for a in ("--set", o)]
    command = [sys.executable, "-m", "rlzoo.cli", "train", str(EXAMPLE), *sets, *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, cold_start_root) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("distill")
    overrides = [*DISTILL, f"output_dir={root / 'run'}", f"cold_start.output_dir={cold_start_root / 'distill-student'}"]
    rlzoo_train(root, overrides)
    return root / "run", overrides


def _train_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]


def test_the_reverse_kl_and_the_teachers_time_are_logged_every_step(distilled):
    run_dir, _ = distilled
    rows = _train_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:
        for key in ("distill/reverse_kl", "time/teacher", "advantage/abs_mean"):
            assert math.isfinite(row[key]), (key, row)
    report = json.loads((run_dir / "teacher_cold_start" / "cold_start.json").read_text())
    assert report["steps"] == 40  # the run cold-started its teacher with its own cold_start settings


def test_pure_distillation_lowers_the_reverse_kl(distilled):
    kl = [r["distill/reverse_kl"] for r in _train_rows(distilled[0])]
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    assert last < 0.8 * first, kl


def test_a_resumed_run_starts_the_same_teacher_again(distilled):
    run_dir, overrides = distilled
    report = run_dir / "teacher_cold_start" / "cold_start.json"
    built = report.stat().st_mtime_ns
    rlzoo_train(run_dir.parent, [*overrides, f"train.steps={STEPS + 1}"], "--resume", str(run_dir))
    assert report.stat().st_mtime_ns == built  # reused by its fingerprint, not trained again
    resumed = _train_rows(run_dir)[-1]
    assert resumed["step"] == STEPS and math.isfinite(resumed["distill/reverse_kl"])


def test_a_teacher_folder_composes_with_the_task_reward(distilled, tmp_path):
    run_dir, overrides = distilled
    folder = run_dir / "teacher_cold_start"
    composed = [
        *overrides,
        f"output_dir={tmp_path / 'run'}",
        "teacher.tiny=null",
        f"teacher.model={folder}",
        "algorithm.advantage={name: reverse-kl, kl_coef: 0.5, task: {name: group}}",
        "train.steps=2",
    ]
    rlzoo_train(tmp_path, composed)
    rows = _train_rows(tmp_path / "run")
    assert len(rows) == 2 and all(math.isfinite(r["distill/reverse_kl"]) for r in rows)
    assert not (tmp_path / "run" / "teacher_cold_start").exists()  # a teacher folder is used where it is
