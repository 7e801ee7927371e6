"""One writer per folder: the run folder's lock, the sweep folder's, and the cold start's build lock.

**Folder locks.** A run holds an exclusive lock (``fcntl.flock``) on ``<run folder>/.rlzoo.lock`` for its whole life,
taken before it writes anything there (``config.yaml``, ``log.txt``, the cold start). The file says who holds it (pid,
host, command, start time); the lock itself is the kernel's and goes with the process, so a run killed in any way
(SIGKILL, power cut) never leaves a stale lock, and the file left behind means nothing once nobody holds it. A second
``rlzoo train`` or ``--resume`` (or ``rlzoo sft``) on a folder in use is refused at once with :class:`FolderInUse`,
naming the holder. Under a launcher only rank 0 takes it (the ranks of one run share its folder by design).
An ``rlzoo ablate`` sweep holds the same lock on its ``--out`` folder for the sweep's life, so a second sweep on it
is refused at once too (:func:`hold_sweep_folder`).

A cold start (``cold_start.output_dir``, which the runs of an ``rlzoo ablate`` sweep share) is built under a lock
on the sibling file ``.<folder name>.lock`` (removed when the build ends): a second run that needs it while another
process builds it says so and waits, then uses the finished folder instead of building it again (:func:`building`).

The lock is ``flock``, which Linux also provides on NFS (as a whole-file POSIX lock); a file system without working
locks fails the lock with a one-line error rather than running unprotected.

Stop signals (SIGINT, SIGTERM) are :mod:`rlzoo.runtime.signals`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlzoo.errors import RlzooError

LOCK_NAME = ".rlzoo.lock"


class FolderInUse(RlzooError):
    """Another process holds the folder's lock (``holder``)."""

    def __init__(self, message: str, holder: Holder) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass
class Holder:
    """Who holds a lock, as its lock file says."""

    pid: int | None = None
    host: str = ""
    command: str = ""
    since: str = ""

    def describe(self) -> str:
        if self.pid is None:
            return "another process (it has not said which yet)"
        where = f" on host {self.host}" if self.host else ""
        what = f" ({self.command})" if self.command else ""
        since = f", since {self.since}" if self.since else ""
        return f"pid {self.pid}{where}{what}{since}"

    def stop_hint(self) -> str:
        if self.pid is None:
            return "stop it"
        if self.host and self.host != socket.gethostname():
            return f"stop it on {self.host} (kill {self.pid})"
        return f"stop it (kill {self.pid})"


class FileLock:
    """A held lock: the open lock file. :meth:`release` (or leaving the ``with`` block, or the process ending)
    lets it go; the file stays, unless ``remove`` (then it is removed first, while still held)."""

    def __init__(self, path: Path, fd: int | None, remove: bool = False) -> None:
        self.path = path
        self._fd: int | None = fd
        self._remove = remove

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if _HELD.get(self.path) is self:
            del _HELD[self.path]
        if self._remove:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(fd)  # closing the last descriptor of the open file releases the flock

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _read_holder(fd: int) -> Holder | None:
    try:
        data = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    return Holder(data["pid"], str(data.get("host", "")), str(data.get("command", "")), str(data.get("since", "")))


def _holder(fd: int) -> Holder:
    """The holder's details; it writes them right after it takes the lock, so a moment is allowed for that."""
    holder = None
    for _ in range(50):
        holder = _read_holder(fd)
        if holder is not None and (holder.host != socket.gethostname() or _alive(holder.pid)):
            return holder
        time.sleep(0.02)  # nothing yet, or a former holder's details not yet overwritten
    return holder or Holder()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _try_flock(fd: int, path: Path, mode: int = fcntl.LOCK_EX) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise RlzooError(f"could not lock {path}: {err.strerror or err} (the file system must support flock)") from None


def _open(path: Path, create: bool) -> int | None:
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        if create:
            raise RlzooError(f"could not create {path}: its folder cannot be made") from None
        return None
    except OSError as err:
        if not create:  # cannot even open it: whoever made it is not us; acquiring will say more
            return None
        raise RlzooError(f"could not create {path}: {err.strerror or err}") from None


def holder_of(path: Path) -> Holder | None:
    """Who holds the lock file ``path`` now (``None``: nobody, or no such file). Creates nothing."""
    fd = _open(Path(path), create=False)
    if fd is None:
        return None
    try:
        if _try_flock(fd, Path(path), fcntl.LOCK_SH):  # shared: two processes looking do not stop each other
            return None  # closing the descriptor below releases it
        return _holder(fd)
    finally:
        os.close(fd)


def acquire(path: Path, command: str, wait: bool = False, on_wait=None, remove: bool = False) -> FileLock:
    """Take the lock file ``path`` (created with its folder if needed) and write this process's details into it.

    Held by another process: raise :class:`FolderInUse` naming it, or with ``wait`` call ``on_wait(holder)`` once
    and block until it is released (a signal still interrupts the wait). ``remove``: the holder removes the file
    when it lets go, so a process that was waiting on the removed file locks the one at ``path`` instead."""
    path = Path(path)
    told = False
    while True:
        fd = _open(path, create=True)
        try:
            if not _try_flock_for(fd, path, 1.0):
                holder = _holder(fd)
                if not wait:
                    raise FolderInUse(f"{path.parent} is in use by {holder.describe()}", holder)
                if on_wait is not None and not told:
                    on_wait(holder)
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if remove and not _same_file(fd, path):
                os.close(fd)  # removed by its last holder meanwhile: lock the file now at ``path``
                continue
            details = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": _now()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(details) + "\n").encode(), 0)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return FileLock(path, fd, remove)


def _try_flock_for(fd: int, path: Path, seconds: float) -> bool:
    """The lock, tried for a moment: another process may only be looking (:func:`holder_of` locks it briefly)."""
    deadline = time.monotonic() + seconds
    while not _try_flock(fd, path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


# -- run folders ---------------------------------------------------------------------------------------------


def _in_use(run_dir: Path, holder: Holder, resume: bool) -> FolderInUse:
    if resume:
        advice = f"wait for it to end, or {holder.stop_hint()} and resume again"
    else:
        advice = f"wait for it to end, {holder.stop_hint()}, or choose another output_dir"
    return FolderInUse(
        f"{run_dir} is in use by another rlzoo process: {holder.describe()}; one process writes a run folder at a "
        f"time: {advice}",
        holder,
    )


_HELD: dict[Path, FileLock] = {}
"""The run (and sweep) folders' locks this process holds: holding one again (``rlzoo train`` holds it, then
:class:`rlzoo.runtime.run.TrainingRun` asks too, as it does for a run started from Python) is a no-op, not a clash."""


def _lock_path(run_dir: Path) -> Path:
    return Path(os.path.abspath(run_dir)) / LOCK_NAME


def check_run_folder(run_dir: Path, resume: bool = False) -> None:
    """Refuse a run folder another process holds, without creating anything (before the config's checks)."""
    if _lock_path(run_dir) in _HELD:
        return
    holder = holder_of(Path(run_dir) / LOCK_NAME)
    if holder is not None:
        raise _in_use(Path(run_dir), holder, resume)


def hold_run_folder(run_dir: Path, command: str, resume: bool = False) -> FileLock:
    """Take the run folder's lock (creating the folder) for the run's life, or refuse naming who holds it. Where
    this process holds it already, the lock returned holds nothing: the first one lets it go."""
    path = _lock_path(run_dir)
    if path in _HELD:
        return FileLock(path, None)
    try:
        lock = acquire(path, command)
    except FolderInUse as err:
        raise _in_use(Path(run_dir), err.holder, resume) from None
    _HELD[path] = lock
    return lock


# -- sweep folders -------------------------------------------------------------------------------------------


def _sweep_in_use(out: Path, holder: Holder) -> FolderInUse:
    return FolderInUse(
        f"sweep folder {out} is in use by another rlzoo process: {holder.describe()}; one process writes a sweep's "
        f"--out folder at a time: wait for it to end (rerunning the same command then resumes what is left), "
        f"{holder.stop_hint()}, or choose another --out",
        holder,
    )


def check_sweep_folder(out: Path) -> None:
    """Refuse an ``rlzoo ablate --out`` folder another process holds, without creating anything."""
    if _lock_path(out) in _HELD:
        return
    holder = holder_of(Path(out) / LOCK_NAME)
    if holder is not None:
        raise _sweep_in_use(Path(out), holder)


def hold_sweep_folder(out: Path, command: str) -> FileLock:
    """Take the sweep folder's lock (its ``.rlzoo.lock``, the file a run folder's lock uses, so a ``train`` there is
    refused too) until this process ends, or refuse naming who holds it. The sweep's runs lock their own folders.
    Where this process holds it already, the lock returned holds nothing, as :func:`hold_run_folder`'s."""
    path = _lock_path(out)
    if path in _HELD:
        return FileLock(path, None)
    try:
        lock = acquire(path, command)
    except FolderInUse as err:
        raise _sweep_in_use(Path(out), err.holder) from None
    _HELD[path] = lock
    return lock


# -- cold starts ---------------------------------------------------------------------------------------------


def build_lock_path(directory: Path) -> Path:
    """The lock of a folder that is built whole and renamed into place: a sibling, since the folder is replaced."""
    directory = Path(directory)
    return directory.parent / f".{directory.name}.lock"


@contextlib.contextmanager
def building(directory: Path, what: str = "cold start") -> Iterator[None]:
    """Hold the build lock of ``directory``; while another process holds it, say so on the console and wait."""

    def waiting(holder: Holder) -> None:
        print(f"{what}: waiting for {holder.describe()} to finish building {directory}", file=sys.stderr, flush=True)

    # removed when released: a finished cold-start folder (a sweep's cold_start/) keeps no lock file beside it
    with acquire(build_lock_path(directory), process_command(), wait=True, on_wait=waiting, remove=True):
        yield


def process_command() -> str:
    """This process's command line, shortened, for a lock file's details."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    if name in ("__main__.py", "cli.py"):
        name = "rlzoo"
    command = " ".join([name, *sys.argv[1:]])
    return command if len(command) <= 160 else command[:157] + "..."
