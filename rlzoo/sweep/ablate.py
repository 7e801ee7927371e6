"""``rlzoo ablate``: build and check the grid, run what is left of it (local processes or Ray), summarise."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from rlzoo.errors import RlzooError
from rlzoo.registry import Registry
from rlzoo.runtime import runlock
from rlzoo.sweep.finished import drop_checkpoints, finished_problems
from rlzoo.sweep.grid import Run, Sweep, build_sweep, check_folder, parse_vary, write_manifest
from rlzoo.sweep.jobs import Job, job_name, make_jobs, preflight_runs
from rlzoo.sweep.limits import DEFAULT_MAX_RUNS
from rlzoo.sweep.local import cores, run_local
from rlzoo.sweep.plot import plot_ablation
from rlzoo.sweep.progress import SweepProgress
from rlzoo.sweep.summary import collect, summarise, write_tables


@dataclass
class AblateOptions:
    config: str
    vary: list[str]
    seeds: int
    out: Path
    sets: list[str]
    jobs: int = 1
    backend: str = "local"
    ray_address: str | None = None
    cpus_per_run: int | None = None
    max_runs: int = DEFAULT_MAX_RUNS
    yes: bool = False
    progress: bool = True
    plugins: list[str] = field(default_factory=list)  # --plugin: loaded here, recorded in each run's config.yaml
    drop_finished_checkpoints: bool = False  # a finished, verified run never resumes: its checkpoints are only disk


def ablate(options: AblateOptions, registry: Registry) -> tuple[Sweep, dict[str, int]]:
    """Run the sweep (what is not finished); returns it and the exit status of each job run now.

    The sweep holds its ``--out`` folder's lock from before it writes there until this process ends (the summary
    written after this returns is the sweep's too): another sweep on the folder is refused at once, naming it."""
    runlock.check_sweep_folder(options.out)  # before the grid's configs are built: a second sweep stops at once
    varies = [parse_vary(text) for text in options.vary]
    size = math.prod(len(v.values) for v in varies) * options.seeds
    if size > options.max_runs and not options.yes:
        raise RlzooError(
            f"the grid has {size} runs ({' x '.join(str(len(v.values)) for v in varies) or '1'} cells x {options.seeds} "
            f"seeds), more than --max-runs {options.max_runs}: pass --yes to run them all, or raise --max-runs"
        )
    if options.backend == "ray":
        from rlzoo.sweep.ray_backend import check_ray

        check_ray()
    sweep = build_sweep(options.config, varies, options.seeds, options.out, options.sets, registry, options.plugins)
    check_folder(sweep)
    # every finished run verified and every other one preflighted before anything is written
    todo, done = preflight_runs(sweep.runs, registry)
    # from here on the sweep writes into --out (a folder refused above is left untouched, without a lock file)
    runlock.hold_sweep_folder(sweep.out, runlock.process_command())
    threads = options.cpus_per_run or max(1, cores() // options.jobs)
    cold_jobs, jobs = make_jobs(todo, threads)
    write_manifest(sweep)
    dropping = ""
    if options.drop_finished_checkpoints:
        dropped = sum(drop_checkpoints(run.run_dir) for run in done)
        later = ", the others' as they finish" if jobs else ""
        dropping = f"; finished runs' checkpoints dropped ({dropped} now{later})"
    print(
        f"sweep {sweep.out}: {len(sweep.cells)} cells x {options.seeds} seeds = {len(sweep.runs)} runs; "
        f"{len(done)} finished and verified, {len(jobs)} to run ({sum('--resume' in j.args for j in jobs)} resumed), "
        f"{options.jobs if options.backend == 'local' else 'ray'} at once, {threads} threads each{dropping}",
        file=sys.stderr,
    )
    on_end = _dropping_checkpoints(sweep.runs, registry) if options.drop_finished_checkpoints else None
    status: dict[str, int] = {}
    for stage, stage_jobs, total, finished in (
        ("cold start", cold_jobs, len(cold_jobs), 0),
        ("runs", jobs, len(sweep.runs), len(done)),
    ):
        if stage == "runs":  # a run whose cold start failed to build is failed too (its log says why)
            for job in [j for j in stage_jobs if j.needs is not None and not j.needs.is_file()]:
                print(f"failed: {job.name}: its cold start was not built; log: {job.needs.parent}.log", file=sys.stderr)
                status[job.name] = -1
                stage_jobs.remove(job)
        if not stage_jobs:
            continue
        progress = SweepProgress(total, finished, stage, options.progress)
        try:
            if options.backend == "ray":
                from rlzoo.sweep.ray_backend import run_ray

                status.update(run_ray(stage_jobs, options.ray_address, progress, local_cpus=cores(), on_end=on_end))
            else:
                status.update(run_local(stage_jobs, options.jobs, progress, on_end))
        finally:
            progress.close()
    return sweep, status


def _dropping_checkpoints(runs: list[Run], registry: Registry) -> Callable[[Job, int], None]:
    """``on_end`` for the backends under ``--drop-finished-checkpoints``: a run that ends finished and verified
    (:mod:`rlzoo.sweep.finished`) loses its ``checkpoints/`` at once, before the sweep's other runs fill the disk;
    one that does not keep them (a rerun resumes from them), said on the console."""
    by_name = {job_name(run): run for run in runs}

    def on_end(job: Job, code: int) -> None:
        run = by_name.get(job.name)  # a cold start's job is no run
        if run is None or code != 0:
            return
        problems = finished_problems(run, registry)
        if problems:
            tqdm.write(
                f"checkpoints kept: {job.name} did not finish as verified: {'; '.join(problems)}", file=sys.stderr
            )
        else:
            drop_checkpoints(run.run_dir)

    return on_end


def report(paths: list[Path], out: Path, title: str = "") -> list[Path]:
    """``summary.csv``, ``summary.md`` and ``ablation.png`` in ``out`` from sweep and run folders."""
    records = collect(paths)
    written = write_tables(summarise(records), out, [r.run_dir for r in records if not r.finished])
    written.append(plot_ablation(records, out / "ablation.png", title))
    return written
