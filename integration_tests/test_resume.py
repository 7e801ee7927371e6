"""A run killed with SIGKILL and resumed logs the same metrics as an uninterrupted run with the same seed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import EXAMPLE, FAST, metrics_without_times

from rlzoo.config import apply_overrides, read_yaml
from rlzoo.metrics import read_metrics

STEPS = 8


def write_config(path: Path, cold_start_dir: Path) -> Path:
    data = apply_overrides(
        read_yaml(EXAMPLE),
        [*FAST, f"train.steps={STEPS}", "train.checkpoint_every=2", f"cold_start.output_dir={cold_start_dir}"],
    )
    path.write_text(yaml.safe_dump(data))
    return path


def rlzoo(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlzoo.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_sigkill_then_resume_reproduces_the_uninterrupted_metrics(tmp_path, cold_start_root):
    config = write_config(tmp_path / "run.yaml", cold_start_root / "arithmetic")

    reference = rlzoo("train", str(config), "--set", f"output_dir={tmp_path / 'reference'}")
    assert reference.wait(timeout=600) == 0, reference.stderr.read().decode()

    killed_dir = tmp_path / "killed"
    victim = rlzoo("train", str(config), "--set", f"output_dir={killed_dir}")
    latest = killed_dir / "checkpoints" / "latest"
    deadline = time.time() + 600
    while not (latest.is_file() and latest.read_text().strip() == "step_000004"):
        assert victim.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert len([r for r in read_metrics(killed_dir / "metrics.jsonl") if "reward/mean" in r]) < STEPS

    resumed = rlzoo("train", str(config), "--resume", str(killed_dir))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()

    expected = metrics_without_times(read_metrics(tmp_path / "reference" / "metrics.jsonl"))
    actual = metrics_without_times(read_metrics(killed_dir / "metrics.jsonl"))
    assert [r["step"] for r in actual] == [r["step"] for r in expected] == list(range(STEPS + 1))
    assert actual == expected


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, cold_start_root):
    config = write_config(tmp_path / "run.yaml", cold_start_root / "arithmetic")
    proc = rlzoo("train", str(config), "--resume", str(tmp_path / "nothing-here"))
    assert proc.wait(timeout=300) == 1
    err = proc.stderr.read().decode()
    assert "no complete checkpoint" in err and "Traceback" not in err
