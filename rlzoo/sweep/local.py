"""Running a sweep's jobs on this machine: ``--jobs J`` processes at once, each with ``cores // J`` threads.

Every process started here is stopped before :func:`run_local` leaves, however it leaves (Ctrl-C, SIGTERM, which
``rlzoo.cli`` turns into the same exception, or any error): a run must not go on writing its folder, unseen,
after the sweep that owns the folder has ended, and a rerun would find that folder in use. A stopped run keeps its
last checkpoint, which the rerun resumes.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import IO

from rlzoo.sweep.jobs import Job
from rlzoo.sweep.progress import SweepProgress

OWN_STOP_S = 3.0  # after Ctrl-C: a terminal sends it to the runs too, and each stops by itself (says where)
TERM_GRACE_S = 10.0  # after SIGTERM: a run closes its engines and exits; then SIGKILL


def cores() -> int:
    """CPU cores this process may use (the affinity mask: a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _wait(processes: list[subprocess.Popen], seconds: float) -> list[subprocess.Popen]:
    """Those of ``processes`` still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in processes if p.poll() is None]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop_processes(processes: list[subprocess.Popen], own_s: float = 0.0, grace_s: float = TERM_GRACE_S) -> None:
    """End ``processes`` (by their PIDs, never by name): ``own_s`` seconds to end by themselves, then SIGTERM and
    ``grace_s`` seconds, then SIGKILL; each reaped."""
    alive = _wait(processes, own_s)
    for process in alive:
        process.terminate()
    for process in _wait(alive, grace_s):
        process.kill()
    for process in processes:
        process.wait()


def run_local(
    jobs: list[Job], at_once: int, progress: SweepProgress, on_end: Callable[[Job, int], None] | None = None
) -> dict[str, int]:
    """Run every job, ``at_once`` at a time; returns each job's exit status (a failure does not stop the others).
    ``on_end(job, code)`` is called as each job ends. Whatever stops this function stops the processes it started
    first (module docstring)."""
    pending, status = list(jobs), {}
    running: dict[str, tuple[Job, subprocess.Popen, IO[str]]] = {}
    try:
        while pending or running:
            while pending and len(running) < at_once:
                job = pending.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                # on a line of its own: a process killed mid-line (a progress bar) left no newline
                again = "\n" if job.log.is_file() and job.log.stat().st_size else ""
                handle = open(job.log, "a")
                handle.write(f"{again}$ {' '.join(job.command())}   (threads {job.threads})\n")
                handle.flush()
                try:
                    process = subprocess.Popen(
                        job.command(),
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=job.environment(),
                    )
                except BaseException:
                    handle.close()
                    raise
                running[job.name] = (job, process, handle)
                progress.started(job)
            for name, (job, process, handle) in list(running.items()):
                code = process.poll()
                if code is not None:
                    handle.close()
                    del running[name]
                    status[name] = code
                    progress.ended(job, code)
                    if on_end is not None:
                        on_end(job, code)
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop_processes([p for _, p, _ in running.values()], own_s=OWN_STOP_S)
        raise
    finally:
        stop_processes([p for _, p, _ in running.values()])  # a no-op once stopped above
        for _, process, handle in running.values():
            handle.write(f"stopped by the sweep (exit {process.returncode}); rerun the sweep to go on from here\n")
            handle.close()
    return status
