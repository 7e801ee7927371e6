"""``rlzoo ablate`` end to end with tiny runs: two cells x one seed, run two at once, then resumed.

The sweep runs once (module fixture); the tests then rerun the same command: finished runs are skipped, an
interrupted run resumes from its checkpoint, a run that cannot start fails with its log named and does not stop
the other. The first sweep runs on this machine's processes; the resumed one on processes again by default, and on
a local Ray instance in the slow suite when ``ray`` is installed (the ``test`` extra installs it): the plan of what
to resume is the same code for both backends, and a Ray start costs a minute or two on two loaded cores.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from runs_testlib import EXAMPLE, FAST

from rlzoo.reporting.metrics_log import read_metrics

CELLS = ("lr-0.0001", "lr-0.0002")


def ablate(out: Path, *extra: str) -> subprocess.CompletedProcess:
    sets = [x for s in [*FAST, "train.steps=2"] for x in ("--set", s)]
    command = [sys.executable, "-m", "rlzoo.cli", "ablate", str(EXAMPLE), *sets, "--vary", "trainer.lr=0.0001,0.0002"]
    return subprocess.run(
        [*command, "--seeds", "1", "--jobs", "2", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ablate") / "sweep"
    result = ablate(out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_sweep_runs_every_cell_and_summarises(sweep):
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert manifest["vary"] == {"trainer.lr": ["0.0001", "0.0002"]} and manifest["seeds"] == 1
    for cell, lr in zip(CELLS, (0.0001, 0.0002)):
        run_dir = sweep / cell / "seed0"
        assert f"lr: {lr}" in (run_dir / "config.yaml").read_text()
        assert read_metrics(run_dir / "metrics.jsonl")[-1]["final"] == 1.0
        assert "OMP_NUM_THREADS" not in (run_dir / "process.log").read_text()  # a process per run, its own log
    assert len(list((sweep / "cold_start").iterdir())) == 2  # one cold start (and its log), shared by both cells
    table = (sweep / "summary.md").read_text()
    assert all(f"| {cell} | 1 |" in table for cell in CELLS)
    header = (sweep / "summary.csv").read_text().splitlines()[0]
    assert "final eval/accuracy mean" in header and "s/step ci95" in header
    assert (sweep / "ablation.png").stat().st_size > 0


def test_rerun_skips_finished_runs(sweep):
    logs = {cell: (sweep / cell / "seed0" / "process.log").read_text() for cell in CELLS}
    result = ablate(sweep)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 finished and verified, 0 to run" in result.stderr
    assert {cell: (sweep / cell / "seed0" / "process.log").read_text() for cell in CELLS} == logs


@pytest.mark.parametrize(  # Ray: ~1-2 minutes of Ray start-up on two loaded cores for the same resume of the sweep
    "backend",
    [
        "local",
        pytest.param(
            "ray",
            marks=[pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")],
        ),
    ],
)
def test_interrupted_run_resumes_and_a_failed_one_is_reported(sweep, backend):
    good, bad = (sweep / cell / "seed0" for cell in CELLS)
    for run_dir in (good, bad):  # as if killed before the final evaluation
        path = run_dir / "metrics.jsonl"
        rows = [r for r in read_metrics(path) if r.get("final") != 1.0]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    latest = bad / "checkpoints" / (bad / "checkpoints" / "latest").read_text().strip()
    (latest / "rng.safetensors").write_bytes(b"not a safetensors file")
    result = ablate(sweep, "--backend", backend)
    assert result.returncode == 1
    assert f"failed: {CELLS[1]}/seed0" in result.stderr and str(bad / "process.log") in result.stderr
    assert "Traceback" not in result.stderr
    commands = [line for line in (good / "process.log").read_text().splitlines() if line.startswith("$ ")]
    assert f"--resume {good}" in commands[-1]  # continued from its checkpoint, not started again
    assert read_metrics(good / "metrics.jsonl")[-1]["final"] == 1.0
    assert read_metrics(bad / "metrics.jsonl")[-1].get("final") != 1.0
    assert (sweep / "summary.md").is_file()
