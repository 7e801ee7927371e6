"""A damaged cold-start folder (one a run would reuse) is built again with one warning, never loaded into a traceback.

Through the real CLI: ``rlzoo sft`` builds the tiny cold start, its weights are truncated (or its report torn), and
the next ``rlzoo sft`` warns once, naming the damaged file, rebuilds it and exits 0; the rebuilt weights load.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_testlib import CliResult, run_cli
from safetensors.torch import load_file
from test_cli import TINY_RUN

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gspo_tiny_moe.yaml"


def sft(run_dir: Path) -> CliResult:
    overrides = [
        arg
        for item in [*TINY_RUN, f"output_dir={run_dir}", "rollout.engine={name: hf}", "trainer.engine={name: torch}"]
        for arg in ("--set", item)
    ]
    return run_cli(["sft", str(EXAMPLE), *overrides], run_dir.parent)


def truncate_weights(folder: Path) -> str:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return "model.safetensors"


def tear_report(folder: Path) -> str:
    report = folder / "cold_start.json"
    report.write_text(report.read_text()[:10])
    return "cold_start.json"


@pytest.mark.parametrize(  # both are a digest mismatch to the check; the torn report in the slow suite
    "damage",
    [truncate_weights, pytest.param(tear_report, marks=pytest.mark.slow)],
    ids=["truncated-weights", "torn-report"],
)
def test_a_damaged_cold_start_is_built_again(tmp_path, damage):
    run_dir = tmp_path / "run"
    first = sft(run_dir)
    assert first.returncode == 0, first.stderr
    folder = run_dir / "cold_start"
    damaged_file = damage(folder)

    again = sft(run_dir)
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    warnings = [line for line in again.stderr.splitlines() if "is damaged" in line]
    assert len(warnings) == 1 and damaged_file in warnings[0] and str(folder) in warnings[0], again.stderr
    assert load_file(folder / "model.safetensors")  # the rebuilt weights are whole
