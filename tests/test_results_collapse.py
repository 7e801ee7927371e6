"""Issue 50's collapse experiment (results/collapse.py): the collapse rule, the per-run values, the generated page."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results.collapse import CELLS, folder, run_values, write_page  # noqa: E402 - the repository root on the path first


def fake_run(archive: Path, cell: str, seed: int, accuracies: list[float], flips: float = 0.01) -> Path:
    """A finished 100-step run evaluated every 25 steps, with the MoE diagnostics the page averages."""
    run_dir = archive / folder(cell) / f"seed{seed}"
    run_dir.mkdir(parents=True)
    rows = []
    for step in range(100):
        row = {"step": step, "reward/mean": 0.5, "train/grad_norm": 1.0 + step / 100, "moe/flip_rate": flips}
        row.update({"moe/rollout_train_disagreement": 0.002, "mismatch/abs_logp_diff": 0.01})
        if step % 25 == 0:
            row["eval/accuracy"] = accuracies[step // 25]
        rows.append(row)
    rows.append({"step": 100, "eval/accuracy": accuracies[4], "final": 1.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"seed": seed}))
    provenance = {
        "machine": {"cpu": "test cpu", "cores": 2},
        "commit": "abc1234",
        "load_average_1_5_15": [1.0, 1.0, 1.0],
        "archived_at": "2026-11-29 05:00:00 UTC",
        "note": "",
    }
    (run_dir / "provenance.json").write_text(json.dumps(provenance))
    return run_dir


@pytest.mark.parametrize(
    ("accuracies", "collapsed"),
    [
        ([0.2, 0.4, 0.5, 0.6, 0.6], False),  # rises and stays
        ([0.2, 0.6, 0.5, 0.4, 0.31], False),  # falls back, but to more than half its peak
        ([0.2, 0.6, 0.5, 0.4, 0.29], True),  # below half of its peak
        ([0.4, 0.3, 0.25, 0.2, 0.19], True),  # below half of its start (the start counts as a point)
        ([0.4, 0.3, 0.25, 0.21, 0.21], False),  # lower than its start, but not by half: a change, not a collapse
    ],
)
def test_the_collapse_rule(tmp_path, accuracies, collapsed):
    values = run_values(fake_run(tmp_path, "grpo, lr 2e-4", 0, accuracies))
    assert values["collapsed"] is collapsed
    assert values["peak accuracy"] == max(accuracies) and values["final accuracy"] == accuracies[-1]
    assert values["drawdown (peak - final)"] == pytest.approx(max(accuracies) - accuracies[-1])
    assert values["change (final - start)"] == pytest.approx(accuracies[-1] - accuracies[0])
    assert values["max grad norm"] == pytest.approx(1.99)
    assert values["router flips between minibatches"] == pytest.approx(0.01)


def test_the_page_counts_collapses_per_cell_and_lists_cells_not_run(tmp_path):
    archive, docs = tmp_path / "archive", tmp_path / "docs"
    grpo, gspo = "grpo, lr 1e-3", "gspo, lr 1e-3"
    fake_run(archive, grpo, 0, [0.2, 0.6, 0.3, 0.2, 0.1])
    fake_run(archive, grpo, 1, [0.2, 0.4, 0.5, 0.6, 0.6])
    fake_run(archive, gspo, 0, [0.2, 0.4, 0.5, 0.6, 0.7], flips=0.02)
    page, plot = write_page(archive, docs)
    text = page.read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 2 | 1 of 2 |" in rows[grpo]
    assert "| 1 | 0 of 1 | 0.200 |" in rows[gspo] and "0.020" in rows[gspo]
    assert all("not run yet" in rows[cell] for cell in CELLS if cell not in (grpo, gspo))
    assert "- grpo, lr 1e-3, seed 1: test cpu (2 cores), commit abc1234" in text
    assert plot.is_file() and plot.stat().st_size > 0


def test_every_cell_has_its_own_folder_and_learning_rate():
    assert len({folder(cell) for cell in CELLS}) == len(CELLS) == 8
    assert folder("grpo + R2 (replay-old), lr 1e-3") == "grpo+R2_lr1e-3"
    assert all(f"trainer.lr={cell.split(', lr ')[1]}" in sets for cell, sets in CELLS.items())
