"""Running a sweep's jobs on this machine: ``--jobs J`` processes at once, each with ``cores // J`` threads."""

from __future__ import annotations

import os
import subprocess
import time

from rlzoo.sweep.jobs import Job
from rlzoo.sweep.progress import SweepProgress


def cores() -> int:
    """CPU cores this process may use (the affinity mask: a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_local(jobs: list[Job], at_once: int, progress: SweepProgress) -> dict[str, int]:
    """Run every job, ``at_once`` at a time; returns each job's exit status (a failure does not stop the others)."""
    pending, running, status = list(jobs), {}, {}
    while pending or running:
        while pending and len(running) < at_once:
            job = pending.pop(0)
            job.log.parent.mkdir(parents=True, exist_ok=True)
            handle = open(job.log, "a")
            handle.write(f"$ {' '.join(job.command())}   (threads {job.threads})\n")
            handle.flush()
            process = subprocess.Popen(
                job.command(), stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=job.environment()
            )
            running[job.name] = (job, process, handle)
            progress.started(job)
        for name, (job, process, handle) in list(running.items()):
            code = process.poll()
            if code is not None:
                handle.close()
                del running[name]
                status[name] = code
                progress.ended(job, code)
        time.sleep(0.2)
    return status
