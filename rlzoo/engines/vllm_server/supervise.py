"""The process rlzoo launches for each vLLM server: it runs the server and takes it down when the trainer dies.

``python -m rlzoo.engines.vllm_server.supervise TRAINER_PID -- COMMAND...`` runs ``COMMAND`` (vLLM's api_server) as
its child. The launcher starts this process in a session of its own (``start_new_session``), so the server and the
processes vLLM starts under it (its engine core, its workers) share one process group, which a stop signals as one.
This watcher is that group's leader: it checks every half second that its parent is still ``TRAINER_PID`` and, when
the trainer is gone (killed with SIGKILL, no ``finally`` run), or on SIGTERM / SIGINT, it signals the whole group
(SIGTERM, then SIGKILL after a grace period). A SIGKILL of vLLM's api_server alone would leave its engine core and
workers running (seen with vLLM 0.32); ``PR_SET_PDEATHSIG`` is not used because it fires when the *thread* that
started the child ends, and a server restarted from a pool thread would then die with that thread.

``--detach`` (servers on a Ray cluster, :mod:`rlzoo.engines.vllm_server.ray_pool`): the watched process is a Ray
actor, and Ray SIGKILLs an actor's direct children when the actor ends (the trainer died, ``ray.kill``), which would
take this watcher down and leave vLLM's processes running (seen with Ray 2.60). So this process forks the watcher
and exits at once: the watcher, no child of the actor, stays in the group (whose id is this process's PID), and it
watches the actor through a pidfd opened before the fork (its PID may be reused; the pidfd's process cannot be).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 10.0


def stop_group(signum: int = signal.SIGTERM) -> None:
    """SIGTERM to this process group (this process ignores it), then SIGKILL to all of it after ``GRACE_S``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    group = os.getpgrp()
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and others_alive(group):
        time.sleep(0.2)
    os.killpg(group, signal.SIGKILL)  # this process too: the group ends as one


def others_alive(group: int) -> bool:
    """Whether a process of ``group`` other than this one is still running (zombies aside), read from /proc."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            return True
    return False


def main(argv: list[str]) -> int:
    detach = argv[0] == "--detach"
    argv = argv[1:] if detach else argv
    trainer, command = int(argv[0]), argv[argv.index("--") + 1 :]
    signal.signal(signal.SIGTERM, lambda *_: stop_group())
    signal.signal(signal.SIGINT, lambda *_: stop_group())
    try:  # opened before the parent is checked: once it is, the pidfd is the trainer's
        watched = os.pidfd_open(trainer) if detach else -1
    except ProcessLookupError:
        return 1
    if os.getppid() != trainer:  # the trainer died before this process could watch it
        return 1
    if detach and os.fork():
        os._exit(0)  # the group's id stays this PID: its members outlive it

    def trainer_gone() -> bool:
        if detach:  # a pidfd is readable once its process has ended
            return bool(select.select([watched], [], [], 0)[0])
        return os.getppid() != trainer

    server = subprocess.Popen(command)
    while server.poll() is None:
        if trainer_gone():
            stop_group()
        time.sleep(0.5)
    stop_group()  # the server ended by itself: what it started goes with it
    return server.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
