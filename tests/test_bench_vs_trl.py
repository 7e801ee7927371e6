"""benchmarks/vs_trl.py end to end in a minimal mode: the JSON's structure, and positive measurements."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl not installed (pip install -e '.[bench]')")
def test_vs_trl_tiny_minimal(tmp_path):
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "vs_trl.py"),
            "--scale",
            "tiny",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--systems",
            "hf+torch,trl",
            "--work",
            str(tmp_path / "work"),
            "--json",
            str(out),
            "--set",
            "cold_start.steps=20",
            "--set",
            "train.eval_prompts=8",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["cold_start"]["seconds"] > 0 and result["model"]["parameters"] > 0
    for name in ("hf+torch", "trl"):
        system = result["systems"][name]
        assert system["status"] == "ok", system
        assert system["step_s"] > 0 and system["tokens_per_s"] > 0 and system["steps_measured"] == 2
        assert system["peak_process_rss_mb"] > 0
        assert 0.0 <= system["eval_accuracy_after"] <= 1.0
    assert set(result["systems"]["hf+torch"]["phases_s"]) >= {"rollout", "verify", "old_logprobs", "train", "sync"}
    assert result["derived"]["hf+torch"]["speed_vs_trl"] > 0
