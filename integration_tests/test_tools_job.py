"""The second main job (examples/tools_calculator.yaml), as a user runs it: from the cold start, held-out
accuracy and tool calls per episode both rise, and the plot shows the episode panels.

Slow (several minutes: a 600-step cold start and 200 RL steps): `python3 -m pytest -m slow
integration_tests/test_tools_job.py`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlzoo.reporting.metrics_log import read_metrics

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tools_calculator.yaml"


@pytest.mark.slow
def test_tools_job_learns_to_call_the_calculator(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlzoo.cli", "train", str(EXAMPLE), "--set", f"output_dir={run_dir}"]
    subprocess.run(cmd, check=True, timeout=3600)
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last.get("final") == 1.0
    # 400 sampled held-out episodes per evaluation: a standard error of about 0.025 on each share
    assert last["eval/accuracy"] - first["eval/accuracy"] >= 0.1, (first, last)
    assert last["eval/tool_calls_per_episode"] - first["eval/tool_calls_per_episode"] >= 0.1, (first, last)
    subprocess.run([sys.executable, "-m", "rlzoo.cli", "plot", str(run_dir)], check=True, timeout=300)
    assert (run_dir / "curves.png").is_file()
