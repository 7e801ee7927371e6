"""The README main job, as a user runs it: held-out accuracy ends clearly above the cold start.

Slow (a few minutes): run with `python3 -m pytest -m slow integration_tests/test_main_job.py`.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from runs_testlib import EXAMPLE

from rlzoo.reporting.metrics_log import read_metrics


@pytest.mark.slow
def test_main_job_raises_held_out_accuracy(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlzoo.cli", "train", str(EXAMPLE), "--set", f"output_dir={run_dir}"]
    subprocess.run(cmd, check=True, timeout=1200)
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/accuracy" in r]
    first, last = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
    assert evals[0]["step"] == 0 and evals[-1].get("final") == 1.0
    # 800 sampled held-out responses per evaluation: a standard error of about 0.017
    assert last - first >= 0.04, (first, last)
    subprocess.run([sys.executable, "-m", "rlzoo.cli", "plot", str(run_dir)], check=True, timeout=300)
    assert (run_dir / "curves.png").is_file()
