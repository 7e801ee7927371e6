"""Running a sweep's jobs on a Ray cluster: one Ray task per job, asking for the job's CPU share.

``ray.init(address)`` joins a running cluster (``ray start --head`` on one machine, ``ray start --address
HEAD:6379`` on the others; docs/ablation.md), or with no address starts a local one. Each task runs the same
``python -m rlzoo.cli ...`` command as the local backend, on whichever node Ray places it; the run folders must
therefore be on a filesystem every node mounts at the same path (NFS, a shared disk), and the nodes need the
same rlzoo install. Needs the ``ray`` extra (``pip install 'rlzoo[ray]'``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from rlzoo.errors import RlzooError
from rlzoo.sweep.jobs import Job
from rlzoo.sweep.progress import SweepProgress


def _run_job(command: list[str], log: str, env: dict[str, str]) -> int:
    """On a Ray worker: run one job's process (the node's environment plus ``env``), its output appended to its
    log; its exit status."""
    import os
    import subprocess
    from pathlib import Path

    Path(log).parent.mkdir(parents=True, exist_ok=True)
    # on a line of its own: a process killed mid-line (a progress bar) left no newline
    again = "\n" if Path(log).is_file() and Path(log).stat().st_size else ""
    with open(log, "a") as handle:
        handle.write(f"{again}$ {' '.join(command)}   (ray task)\n")
        handle.flush()
        return subprocess.run(
            command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **env}
        ).returncode


def check_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise RlzooError("--backend ray needs Ray: pip install 'rlzoo[ray]' (or use --backend local)")


def run_ray(
    jobs: list[Job],
    address: str | None,
    progress: SweepProgress,
    local_cpus: int | None = None,
    on_end: Callable[[Job, int], None] | None = None,
) -> dict[str, int]:
    """Submit every job as a Ray task with ``num_cpus=job.threads``; returns each job's exit status.

    ``local_cpus`` caps a local cluster started here (no ``address``) at that many CPUs; ``on_end(job, code)`` is
    called as each job ends.
    """
    check_ray()
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        kwargs = {"address": address} if address else {"num_cpus": local_cpus, "include_dashboard": False}
        ray.init(**kwargs, log_to_driver=False, configure_logging=False)
    try:
        remote = ray.remote(_run_job)
        futures = {}
        for job in jobs:
            env = {**_forward(), **job.thread_env()}
            future = remote.options(num_cpus=job.threads, name=job.name).remote(job.command(), str(job.log), env)
            futures[future] = job
            progress.started(job)  # queued on the cluster; Ray starts it when a node has the CPUs
        status = {}
        waiting = list(futures)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            job = futures[ready[0]]
            try:
                code = ray.get(ready[0])
            except ray.exceptions.RayError as err:  # the node or worker died: the run is failed, not the sweep
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with open(job.log, "a") as handle:
                    handle.write(f"ray task failed: {err}\n")
                code = -1
            status[job.name] = code
            progress.ended(job, code)
            if on_end is not None:
                on_end(job, code)
        return status
    finally:
        if started_here:
            ray.shutdown()


# what a run needs from the submitting shell's environment on the worker (the rest is the node's own)
_FORWARDED = ("PYTHONPATH", "PATH", "HF_HOME", "TRANSFORMERS_OFFLINE", "HF_HUB_OFFLINE")


def _forward() -> dict[str, str]:
    import os

    return {k: os.environ[k] for k in _FORWARDED if k in os.environ}
