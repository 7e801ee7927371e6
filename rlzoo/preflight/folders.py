"""The run folder: ``--resume`` names a folder with a checkpoint, or ``output_dir`` holds no run; the folders a run
writes (``output_dir``, ``cold_start.output_dir`` when a cold start is built there) can be written or made.

Whether the checkpoint ``--resume`` finds (``checkpoints/latest``) or an earlier one is intact is verified against
its digests when the run starts.
"""

from __future__ import annotations

from pathlib import Path

from rlzoo.interfaces import Problem, RunFacts
from rlzoo.runtime.checkpoint.files import checkpoint_candidates, latest_checkpoint
from rlzoo.util.folders import exists, folder_problem


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
            return [
                (
                    "--resume",
                    f"{resume} is not a folder, so it holds no complete checkpoint; name the run folder of an earlier run "
                    "(its output_dir)",
                )
            ]
        if not checkpoint_candidates(resume):  # which one is intact is verified when the run starts (digests)
            return [
                (
                    "--resume",
                    f"no complete checkpoint found in {resume / 'checkpoints'}; start a new run without --resume",
                )
            ]
        return []
    run_dir = Path(run.config.output_dir)
    if latest_checkpoint(run_dir) is not None:
        return [
            (
                "output_dir",
                f"{run_dir} already holds a run; resume it with --resume {run_dir} or choose another output_dir",
            )
        ]
    return []


def _output_dir_problems(run: RunFacts) -> list[Problem]:
    """``output_dir`` (a new run's folder; with ``--resume`` the run folder named there is used instead) can be
    written, and so can ``cold_start.output_dir`` when the cold start builds a model there."""
    config, problems = run.config, []
    if run.resume is None and (problem := folder_problem(Path(config.output_dir), "output_dir")):
        problems.append(("output_dir", problem))
    cold = config.cold_start
    if config.model.path is None and cold.enabled and cold.output_dir:
        folder = Path(cold.output_dir)
        reused = bool(exists(folder / "cold_start.json"))
        if not reused and (problem := folder_problem(folder, "cold_start.output_dir")):
            problems.append(("cold_start.output_dir", problem))
    return problems
