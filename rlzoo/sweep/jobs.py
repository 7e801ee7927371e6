"""What each run of a sweep still needs, as commands: build a cold start, start, resume, or nothing.

A run is *finished* when its ``metrics.jsonl`` ends with the final evaluation (``"final": 1.0``), and is kept
only once verified (:mod:`rlzoo.sweep.finished`: every step logged once, its config this sweep's); *interrupted*
when it has a complete checkpoint (``rlzoo train --resume``); otherwise it starts afresh (a run cut before its
first checkpoint starts again; its old ``metrics.jsonl`` is dropped by the loop). Cold starts shared by several
runs are built first, each once (``rlzoo sft``), so that no two runs build the same one at the same time.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rlzoo.preflight.checks import preflight
from rlzoo.registry import Registry
from rlzoo.runtime.checkpoint.files import latest_checkpoint
from rlzoo.runtime.cold_start import cold_start_dir
from rlzoo.sweep.finished import check_finished, is_finished
from rlzoo.sweep.grid import Run, write_config

PROCESS_LOG = "process.log"  # each job's stdout and stderr (the run's own log.txt holds the engines' messages)


@dataclass
class Job:
    """One process to run: ``python -m rlzoo.cli <args>``, its output appended to ``log``."""

    name: str
    args: list[str]
    log: Path
    threads: int = 1
    needs: Path | None = None  # a file an earlier job makes (a cold start's report); without it the job cannot run

    def command(self) -> list[str]:
        return [sys.executable, "-m", "rlzoo.cli", *self.args]

    def thread_env(self) -> dict[str, str]:
        """The CPU share: torch (intra-op) and BLAS use ``threads`` threads."""
        return {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.thread_env()}


def job_name(run: Run) -> str:
    """A run's job's name, as the progress line and the failure messages show it: ``<cell>/seed<S>``."""
    return f"{run.cell}/seed{run.seed}"


def plan(runs: list[Run], registry: Registry, threads: int) -> tuple[list[Job], list[Job], list[Run]]:
    """``(cold-start jobs, run jobs, finished runs)``: :func:`preflight_runs`, then :func:`make_jobs`."""
    todo, done = preflight_runs(runs, registry)
    cold_jobs, jobs = make_jobs(todo, threads)
    return cold_jobs, jobs, done


def preflight_runs(runs: list[Run], registry: Registry) -> tuple[list[tuple[Run, Path | None]], list[Run]]:
    """``(runs still to do with the run folder each resumes or None, finished runs)``. Every finished run is
    verified (:func:`rlzoo.sweep.finished.check_finished`: an ``RlzooError`` naming each one that cannot be kept)
    and every run still to do preflighted (``ConfigError`` naming every failing run), before any starts; nothing
    is written."""
    from rlzoo.errors import ConfigError

    todo, done, problems = [], [], []
    for run in runs:
        if is_finished(run.run_dir):
            done.append(run)
            continue
        resume = run.run_dir if latest_checkpoint(run.run_dir) is not None else None
        try:
            preflight(run.config, registry, resume=resume)
        except ConfigError as err:
            problems.extend((f"{run.cell}/seed{run.seed}: {loc}", msg) for loc, msg in err.problems)
        todo.append((run, resume))
    check_finished(done, registry)
    if problems:
        raise ConfigError(problems)
    return todo, done


def make_jobs(todo: list[tuple[Run, Path | None]], threads: int) -> tuple[list[Job], list[Job]]:
    """``(cold-start jobs, run jobs)`` of the preflighted runs: each new run's resolved config is written to
    ``run_dir/config.yaml``, which its command starts from; a run to resume starts from the ``config.yaml`` it
    recorded, left as it is."""
    cold_jobs: dict[Path, Job] = {}
    jobs = []
    for run, resume in todo:
        # a run to resume goes on from the config it recorded, never rewritten (its changes are refused above)
        config_file = run.run_dir / "config.yaml" if resume is not None else write_config(run)
        name = job_name(run)
        args = ["train", str(config_file), *(["--resume", str(resume)] if resume is not None else [])]
        cold = cold_start_dir(run.config)
        needs = cold / "cold_start.json" if resume is None and run.config.cold_start.output_dir else None
        jobs.append(Job(name, args, run.run_dir / PROCESS_LOG, threads, needs))
        if needs is not None and not needs.is_file():
            cold_jobs.setdefault(
                cold,
                Job(f"cold start {cold.name}", ["sft", str(config_file)], cold.parent / f"{cold.name}.log", threads),
            )
    return list(cold_jobs.values()), jobs
