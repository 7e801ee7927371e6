"""A ``pids`` cgroup per sandboxed response: a process cap the kernel enforces for uid 0 too.

``RLIMIT_NPROC`` counts a real user's processes, and the kernel exempts uid 0 from it (``copy_process`` in
kernel/fork.c). When a root trainer's bubblewrap has to run as root (the interpreter is unreadable to the
sandbox user), code in the sandbox is uid 0 outside it and a fork bomb would be bounded by the wall-clock timeout
only. A cgroup's ``pids.max`` counts every task in the group, whoever owns it; ``fork``/``clone`` beyond it fail
with ``EAGAIN`` (Linux Documentation/admin-guide/cgroup-v1/pids.rst; cgroup-v2.rst, "PID").

:func:`pids_root` finds a ``pids`` hierarchy this process may create groups in: cgroup v1's
``/sys/fs/cgroup/pids`` (under this process's own group where that directory is visible), or on cgroup v2 this
process's own group when its ``cgroup.subtree_control`` enables ``pids``. :class:`PidsGroup` is one group:
the command is wrapped so that its first process moves itself in before ``exec`` (every descendant inherits the
group), and :meth:`PidsGroup.remove` deletes it once the sandbox's processes are gone.
"""

from __future__ import annotations

import os
import secrets
import time

MOUNT = "/sys/fs/cgroup"
#: bwrap, its PID-namespace init and the interpreter run before the response's code: room for them
OVERHEAD = 4


def _own_group(controller: str) -> str | None:
    """This process's group path in the hierarchy of ``controller`` (``""`` selects the cgroup v2 line)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as lines:
            for line in lines:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path
    except OSError:
        return None
    return None


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def pids_root() -> str | None:
    """A directory in which :class:`PidsGroup` may create a group, or ``None`` where there is none."""
    v1 = os.path.join(MOUNT, "pids")
    if os.path.isfile(os.path.join(v1, "cgroup.procs")):
        own = _own_group("pids") or "/"
        for candidate in (os.path.normpath(os.path.join(v1, own.lstrip("/"))), v1):
            if _writable_dir(candidate):
                return candidate
        return None
    own = _own_group("")
    if own is None or not os.path.isfile(os.path.join(MOUNT, "cgroup.controllers")):
        return None
    parent = os.path.join(MOUNT, own.lstrip("/"))
    try:
        with open(os.path.join(parent, "cgroup.subtree_control"), encoding="utf-8") as control:
            enabled = control.read().split()
    except OSError:
        return None
    return parent if "pids" in enabled and _writable_dir(parent) else None


class PidsGroup:
    """One ``pids`` group capped at ``max_processes`` (+ :data:`OVERHEAD`) tasks, threads included."""

    def __init__(self, root: str, max_processes: int) -> None:
        self.path = os.path.join(root, f"rlzoo-sandbox-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(self.path, 0o755)
        try:
            with open(os.path.join(self.path, "pids.max"), "w", encoding="utf-8") as limit:
                limit.write(str(max_processes + OVERHEAD))
        except OSError:
            os.rmdir(self.path)
            raise

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` preceded by a shell that moves itself into the group and then ``exec``s it (same pid, same
        file descriptors), so no process of the command ever runs outside the group."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def remove(self, wait_s: float = 5.0) -> None:
        """Delete the group; the kernel refuses while a task is still in it, so retry until ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # an empty group left behind caps nothing and holds no process
                time.sleep(0.02)
