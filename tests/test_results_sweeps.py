"""What the results scripts share (results/sweeps.py): a cell's ``rlzoo ablate`` command, and which of its runs are
archived, with what (nothing is trained: the runs are fake folders, the sweep a recorded command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results import sweeps  # noqa: E402 - the repository root on the path first


def fake_run(sweep: Path, seed: int, finished: bool) -> Path:
    """A run folder as ``rlzoo ablate`` leaves it: finished when ``metrics.jsonl`` ends with the final evaluation."""
    run_dir = sweep / "grpo" / f"seed{seed}"
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    rows = [{"step": 0, "reward/mean": 0.5}, {"step": 1, "reward/mean": 0.6}]
    if finished:
        rows.append({"step": 2, "eval/accuracy": 0.3, "final": 1.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(f"seed: {seed}\n")
    return run_dir


def test_archive_copies_finished_runs_once_with_their_provenance(tmp_path):
    sweep, archive = tmp_path / "runs" / "grpo_cell", tmp_path / "archive" / "grpo_cell"
    finished = fake_run(sweep, 0, finished=True)
    fake_run(sweep, 1, finished=False)

    assert sweeps.archive_finished(sweep, archive, "nothing else ran") == 1
    assert sorted(p.name for p in archive.iterdir()) == ["seed0"]  # the unfinished run is not archived
    assert sorted(p.name for p in (archive / "seed0").iterdir()) == ["config.yaml", "metrics.jsonl", "provenance.json"]
    for name in ("config.yaml", "metrics.jsonl"):
        assert (archive / "seed0" / name).read_bytes() == (finished / name).read_bytes()
    provenance = json.loads((archive / "seed0" / "provenance.json").read_text())
    assert provenance["note"] == "nothing else ran"
    assert {"archived_at", "machine", "python", "versions", "commit", "load_average_1_5_15"} <= set(provenance)
    assert sweeps.archived_seeds(archive) == 1

    # a second call archives nothing again: the archived run keeps the provenance of when it was archived
    (archive / "seed0" / "provenance.json").write_text("{}")
    assert sweeps.archive_finished(sweep, archive, "another note") == 0
    assert (archive / "seed0" / "provenance.json").read_text() == "{}"


def test_archive_of_a_sweep_not_started_is_empty(tmp_path):
    assert sweeps.archive_finished(tmp_path / "none", tmp_path / "archive", "") == 0
    assert sweeps.archived_seeds(tmp_path / "archive") == 0


def test_a_cells_sweep_is_one_resumable_ablate_call(monkeypatch, capsys, tmp_path):
    calls = []

    def run(command, cwd):
        calls.append((command, cwd))
        return subprocess.CompletedProcess(command, 3)

    monkeypatch.setattr(sweeps.subprocess, "run", run)
    config, out = tmp_path / "base.yaml", tmp_path / "out"
    assert sweeps.run_sweep(config, ["a=1", "b=2"], 3, out, "cell") == 3
    assert sweeps.run_sweep(config, [], 2, out, "row", show_command=True) == 3
    expected = [sys.executable, "-m", "rlzoo.cli", "ablate", str(config), "--set", "a=1", "--set", "b=2"]
    expected += ["--seeds", "3", "--jobs", "1", "--out", str(out), "--drop-finished-checkpoints"]
    assert calls[0] == (expected, ROOT)
    shown = f"ablate {config} --seeds 2 --jobs 1 --out {out} --drop-finished-checkpoints"
    assert capsys.readouterr().out == f"== cell\n== row: {shown}\n"


def test_run_missing_skips_complete_cells_and_archives_a_failed_cells_finished_runs(tmp_path, capsys):
    archive, ran = tmp_path / "archive", []
    complete = archive / "done"
    for seed in range(2):
        (complete / f"seed{seed}").mkdir(parents=True)
        (complete / f"seed{seed}" / "metrics.jsonl").write_text("{}\n")

    def run(cell: str) -> int:  # "broken" finishes one run of two, then fails
        ran.append(cell)
        fake_run(tmp_path / "sweeps" / cell, 0, finished=True)
        return 1 if cell == "broken" else 0

    failed = sweeps.run_missing(
        ["done", "broken", "fine"],
        2,
        run=run,
        sweep=lambda cell: tmp_path / "sweeps" / cell,
        archive=lambda cell: archive / cell,
        note="",
    )
    assert (ran, failed) == (["broken", "fine"], ["broken"])
    assert sweeps.archived_seeds(archive / "broken") == 1 and sweeps.archived_seeds(archive / "fine") == 1

    page = sweeps.ROOT / "docs" / "results.md"
    assert sweeps.report([page], failed, "rows with failed runs") == 1
    out, err = capsys.readouterr()
    assert out == "wrote docs/results.md\n"
    assert err == "error: rows with failed runs: broken; run the same command again to retry them\n"
    assert sweeps.report([page], [], "rows with failed runs") == 0


def _archived_seed(archive: Path, config: Path, sets: list[str], out: Path, seed: int, steps: int) -> None:
    """A finished run of the sweep into ``out`` as the archive holds it (its config.yaml names ``out``'s folders)."""
    from rlzoo.config.loading import dump_config
    from rlzoo.registry import default_registry
    from rlzoo.sweep.grid import build_sweep

    run = build_sweep(str(config), [], 3, out, sets, default_registry()).runs[seed]
    (archive / f"seed{seed}").mkdir(parents=True)
    (archive / f"seed{seed}" / "config.yaml").write_text(dump_config(run.config))
    rows = [{"step": i, "reward/mean": 0.5} for i in range(steps)] + [{"step": steps, "final": 1.0}]
    (archive / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_sweep_not_started_begins_from_the_archived_seeds_ablate_would_keep(tmp_path, capsys):
    """A row half done on a machine that was lost: its archived seeds become finished runs of the sweep started
    again in the same ``--out``, which ``rlzoo ablate``'s own check then keeps; others run again, and say why."""
    from rlzoo.registry import default_registry
    from rlzoo.sweep.finished import finished_problems
    from rlzoo.sweep.grid import build_sweep, check_folder

    config = ROOT / "examples" / "gspo_tiny_moe.yaml"
    sets = ["rollout.engine={name: hf}", "trainer.engine={name: torch}", "train.steps=3"]
    out, archive = tmp_path / "sweeps" / "row", tmp_path / "archive" / "row"
    _archived_seed(archive, config, sets, out, 1, 3)
    _archived_seed(archive, config, sets, tmp_path / "elsewhere", 2, 3)  # archived from another --out

    assert sweeps.restore_archived(config, sets, 3, tmp_path / "none", tmp_path / "archive" / "none") == 0
    assert not (tmp_path / "none").exists()
    assert sweeps.restore_archived(config, sets, 3, out, archive) == 1
    assert f"{archive / 'seed2'} runs again, not restored: config.yaml differs" in capsys.readouterr().out
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "base/seed1/config.yaml",
        "base/seed1/metrics.jsonl",
        "sweep.json",
    ]
    for name in ("config.yaml", "metrics.jsonl"):
        assert (out / "base" / "seed1" / name).read_bytes() == (archive / "seed1" / name).read_bytes()
    again = build_sweep(str(config), [], 3, out, sets, default_registry())
    check_folder(again)  # the manifest is this sweep's: ablate resumes the folder instead of refusing it
    assert finished_problems(again.runs[1], default_registry()) == []
    assert sweeps.restore_archived(config, sets, 3, out, archive) == 0, "a sweep already started is left to resume"

    other = tmp_path / "sweeps" / "other"  # the same --out's seeds, but another row's settings: nothing laid in
    assert sweeps.restore_archived(config, [*sets, "trainer.lr=0.5"], 3, other, archive) == 0
    assert not other.exists()
