"""The run folder: ``--resume`` names a folder with a checkpoint, or ``output_dir`` holds no run; the folders a run
writes (``output_dir``, ``cold_start.output_dir`` when a cold start is built there) can be written or made.

Whether the checkpoint ``--resume`` finds (``checkpoints/latest``) or an earlier one is intact is verified against
its digests when the run starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlzoo.interfaces import Problem, RunFacts
from rlzoo.runtime.checkpoint.files import checkpoint_candidates, latest_checkpoint


def run_folder_rule(run: RunFacts) -> list[Problem]:
    """The folders a run writes can be written; then (unless ``output_dir`` cannot be searched) ``--resume`` names a
    run with a checkpoint, or a new run's ``output_dir`` holds none."""
    problems = _output_dir_problems(run)
    if not any(loc == "output_dir" for loc, _ in problems):  # a folder it cannot search is not looked into
        problems += _run_problems(run)
    return problems


def _run_problems(run: RunFacts) -> list[Problem]:
    if run.resume is not None:
        resume = Path(run.resume)
        if not resume.is_dir():
            return [(
                "--resume",
                f"{resume} is not a folder, so it holds no complete checkpoint; name the run folder of an earlier run "
                "(its output_dir)",
            )]
        if not checkpoint_candidates(resume):  # which one is intact is verified when the run starts (digests)
            return [(
                "--resume",
                f"no complete checkpoint found in {resume / 'checkpoints'}; start a new run without --resume",
            )]
        return []
    run_dir = Path(run.config.output_dir)
    if latest_checkpoint(run_dir) is not None:
        return [(
            "output_dir",
            f"{run_dir} already holds a run; resume it with --resume {run_dir} or choose another output_dir",
        )]
    return []


def _exists(path: Path) -> bool | None:
    """Whether ``path`` exists; ``None`` when a folder on the way cannot be searched (no x permission)."""
    try:
        return path.exists()
    except OSError:
        return None


def folder_problem(folder: Path, field: str) -> str | None:
    """Why a run cannot write into ``folder`` (made if missing), or ``None``: it is a file, or a folder this user
    cannot write to, or it is missing and cannot be made (an ancestor is a file, or the nearest existing one is not
    writable). Permissions by :func:`os.access`, so root passes them (a read-only file system still fails)."""
    folder = Path(folder)
    if _exists(folder):
        if not folder.is_dir():
            return f"{folder} is a file, not a folder: choose another {field}, or move the file away"
        if not os.access(folder, os.W_OK | os.X_OK):
            return (f"{folder} is a folder this user cannot write to: make it writable (chmod u+rwx {folder}) or "
                    f"choose another {field}")
        return None
    ancestor = folder.absolute().parent
    while not _exists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{folder} cannot be made: {ancestor} is a file, not a folder; choose another {field}"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"{folder} cannot be made: its parent folder {ancestor} is not writable by this user; choose another "
                f"{field}, or make the folder yourself with write permission")
    return None


def _output_dir_problems(run: RunFacts) -> list[Problem]:
    """``output_dir`` (a new run's folder; with ``--resume`` the run folder named there is used instead) can be
    written, and so can ``cold_start.output_dir`` when the cold start builds a model there."""
    config, problems = run.config, []
    if run.resume is None and (problem := folder_problem(Path(config.output_dir), "output_dir")):
        problems.append(("output_dir", problem))
    cold = config.cold_start
    if config.model.path is None and cold.enabled and cold.output_dir:
        folder = Path(cold.output_dir)
        reused = bool(_exists(folder / "cold_start.json"))
        if not reused and (problem := folder_problem(folder, "cold_start.output_dir")):
            problems.append(("cold_start.output_dir", problem))
    return problems
