"""One writer per folder, and how a run stops when it is told to.

**Folder locks.** A run holds an exclusive lock (``fcntl.flock``) on ``<run folder>/.rlzoo.lock`` for its whole life,
taken before it writes anything there (``config.yaml``, ``log.txt``, the cold start). The file says who holds it (pid,
host, command, start time); the lock itself is the kernel's and goes with the process, so a run killed in any way
(SIGKILL, power cut) never leaves a stale lock, and the file left behind means nothing once nobody holds it. A second
``rlzoo train`` or ``--resume`` (or ``rlzoo sft``) on a folder in use is refused at once with :class:`FolderInUse`,
naming the holder. Under a launcher only rank 0 takes it (the ranks of one run share its folder by design).

A cold start (``cold_start.output_dir``, which the runs of an ``rlzoo ablate`` sweep share) is built under a lock
on the sibling file ``.<folder name>.lock`` (removed when the build ends): a second run that needs it while another
process builds it says so and waits, then uses the finished folder instead of building it again (:func:`building`).

The lock is ``flock``, which Linux also provides on NFS (as a whole-file POSIX lock); a file system without working
locks fails the lock with a one-line error rather than running unprotected.

**Stop signals.** SIGTERM (what a scheduler sends before it kills a job) is handled as SIGINT (Ctrl-C):
:func:`stop_signals` makes both raise :class:`Interrupted` in the main thread wherever it is. That is a safe point
anywhere: every file a run writes is written atomically (checkpoints into a temporary folder renamed into place,
``latest``, ``config.yaml``, the cold start; ``metrics.jsonl`` one whole line at a time, and rows after the resumed
checkpoint are dropped on resume), so the work lost is the steps after the last checkpoint, which ``--resume``
runs again exactly. The engines are closed by the run's ``finally``, the command says where it stopped and how to
continue, and the process exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), after stopping any
child process still running (SIGTERM, then SIGKILL). A second SIGINT or SIGTERM ends the process at once (its child
processes killed, exit 128 + the number), also when the main thread is stuck in a library call: a watcher thread
sees every delivery through :func:`signal.set_wakeup_fd`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlzoo.errors import RlzooError

LOCK_NAME = ".rlzoo.lock"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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

    def __init__(self, path: Path, fd: int, remove: bool = False) -> None:
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


def check_run_folder(run_dir: Path, resume: bool = False) -> None:
    """Refuse a run folder another process holds, without creating anything (before the config's checks)."""
    holder = holder_of(Path(run_dir) / LOCK_NAME)
    if holder is not None:
        raise _in_use(Path(run_dir), holder, resume)


def hold_run_folder(run_dir: Path, command: str, resume: bool = False) -> FileLock:
    """Take the run folder's lock (creating the folder) for the run's life, or refuse naming who holds it."""
    try:
        return acquire(Path(run_dir) / LOCK_NAME, command)
    except FolderInUse as err:
        raise _in_use(Path(run_dir), err.holder, resume) from None


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
    with acquire(build_lock_path(directory), _command(), wait=True, on_wait=waiting, remove=True):
        yield


def _command() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    if name in ("__main__.py", "cli.py"):
        name = "rlzoo"
    command = " ".join([name, *sys.argv[1:]])
    return command if len(command) <= 160 else command[:157] + "..."


# -- stop signals --------------------------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the command; ``message`` says where it stopped and how to go on."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(signum, message)
        self.signum = signum
        self.message = message or f"interrupted by {signal_name(signum)}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopSignals:
    """While installed: the first SIGINT / SIGTERM raises :class:`Interrupted` in the main thread; a second one
    (counted by a watcher thread at each delivery, so also while the main thread is stuck) kills this process's
    children and exits at once with 128 + its number."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal received
        self._raised = False
        self._deliveries = 0
        self._exit_lock = threading.Lock()
        self._told = threading.Lock()  # acquired once, by whichever thread first says it is stopping
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[int, int] | None = None
        self._old_wakeup = -1

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            self._old_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:
            os.close(read)
            os.close(write)
            return False
        self._wakeup = (read, write)
        for s in STOP_SIGNALS:
            signal.signal(s, self._handler)
        threading.Thread(target=self._watch, args=(read,), name="rlzoo-stop-signals", daemon=True).start()
        global _ACTIVE
        _ACTIVE = self
        return True

    def uninstall(self) -> None:
        global _ACTIVE
        if self._wakeup is None:
            return
        _ACTIVE = None
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self._old_wakeup)
        read, write = self._wakeup
        self._wakeup = None
        os.close(write)  # the watcher reads end-of-file and ends; it closes ``read``

    def _forget_in_child(self) -> None:
        """In a forked child: the parent's handlers and wakeup pipe are not its own (a signal to the child must not
        count as one to the parent), so it gets back what it had before."""
        global _ACTIVE
        _ACTIVE = None
        if self._wakeup is None:
            return
        with contextlib.suppress(Exception):
            signal.set_wakeup_fd(self._old_wakeup)
            for s, handler in self._previous.items():
                signal.signal(s, handler)
        for fd in self._wakeup:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wakeup = None

    def _handler(self, signum: int, frame: object) -> None:  # the main thread, between two bytecodes
        if self.signum is None:
            self.signum = signum
        if self._raised:  # a second one the watcher has not acted on yet (or cannot see)
            self.hard_exit(signum)
        self._raised = True
        self._tell_stopping(signum)
        raise Interrupted(signum)

    def _tell_stopping(self, signum: int) -> None:
        if self._told.acquire(blocking=False):
            _notice(f"{signal_name(signum)} received: stopping (a second SIGINT or SIGTERM ends it at once)")

    def _watch(self, read: int) -> None:
        try:
            while True:
                try:
                    data = os.read(read, 64)
                except InterruptedError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                for signum in data:
                    if signum not in STOP_SIGNALS:
                        continue
                    self._deliveries += 1
                    if self._deliveries == 1:  # said at once, also while the main thread is busy in a library
                        self._tell_stopping(signum)
                    else:
                        self.hard_exit(signum)
        finally:
            with contextlib.suppress(OSError):
                os.close(read)

    def hard_exit(self, signum: int) -> None:
        """Kill the children and leave now, without cleaning up (files are atomic, so none is left half written)."""
        if not self._exit_lock.acquire(blocking=False):
            time.sleep(3600)  # the other thread is exiting the process
        _notice(f"{signal_name(signum)} received while stopping: stopped at once, without cleaning up")
        stop_children(grace_s=0.0)
        os._exit(128 + signum)


_ACTIVE: StopSignals | None = None


def _after_fork_in_child() -> None:
    if _ACTIVE is not None:
        _ACTIVE._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _notice(text: str) -> None:
    """One line on the console's stderr, written with a system call (safe from any thread, at any moment)."""
    try:
        fd = sys.stderr.fileno()
    except Exception:
        fd = 2
    with contextlib.suppress(OSError):
        os.write(fd, f"\n{text}\n".encode())


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Handle SIGINT and SIGTERM as described in the module docstring for the ``with`` block (main thread only;
    elsewhere nothing is installed)."""
    stops = StopSignals()
    stops.install()
    try:
        yield stops
    finally:
        stops.uninstall()


def stop_signal(err: BaseException, stops: StopSignals | None = None) -> int | None:
    """The signal that ``err`` stands for: an :class:`Interrupted`'s, SIGINT for another ``KeyboardInterrupt``,
    else the signal received before it (an error raised while stopping); ``None`` when no signal was involved."""
    if isinstance(err, Interrupted):
        return err.signum
    if isinstance(err, KeyboardInterrupt):
        return signal.SIGINT
    stops = stops if stops is not None else _ACTIVE
    return stops.signum if stops is not None else None


# -- child processes -----------------------------------------------------------------------------------------


def descendants(pid: int | None = None) -> list[int]:
    """The processes below ``pid`` (this one), children first; zombies excluded."""
    pid = os.getpid() if pid is None else pid
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            found = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []
        alive = []
        for child in found:
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child.pid)
        return alive
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def stop_children(grace_s: float = 10.0, own_s: float = 3.0) -> None:
    """End every process below this one: first ``own_s`` seconds for those that got the signal too (a terminal's
    Ctrl-C reaches the whole process group) to stop by themselves, then SIGTERM and ``grace_s`` seconds, then
    SIGKILL. ``grace_s`` 0: SIGKILL at once."""

    def wait(pids: list[int], seconds: float) -> list[int]:
        deadline = time.monotonic() + seconds
        while True:
            alive = [p for p in pids if p in set(descendants())]
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.05)

    pids = descendants()
    if pids and grace_s > 0:
        pids = wait(pids, own_s)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        pids = wait(pids, grace_s)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# -- where an interrupted run stopped ------------------------------------------------------------------------


def stopped_message(signum: int, run_dir: Path, config_file: str, steps: int, sets: bool, since: float) -> str:
    """``interrupted by SIGTERM after 5 of 8 steps; the last checkpoint (...) is at 4 steps; continue from it with:
    rlzoo train CONFIG --resume RUN_DIR``."""
    from rlzoo.checkpoint import latest_checkpoint
    from rlzoo.metrics import read_metrics

    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    done = None
    try:
        if metrics.stat().st_mtime >= since - 1.0:  # logged by this process (a resumed run first rewrites it)
            logged = [r["step"] for r in read_metrics(metrics) if "step" in r and not r.get("final")]
            done = max(logged) + 1 if logged else 0
    except (OSError, ValueError, TypeError):
        pass
    where = f"after {done} of {steps} steps" if done else "before its first step"
    same = " (with the same --set options)" if sets else ""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return (f"interrupted by {signal_name(signum)} {where}, before the first checkpoint: start it again with "
                f"rlzoo train {config_file}{same}")
    try:
        saved = f"the last checkpoint ({checkpoint}) is at {int(checkpoint.name.removeprefix('step_'))} steps"
    except ValueError:
        saved = f"the last checkpoint is {checkpoint}"
    return (f"interrupted by {signal_name(signum)} {where}; {saved}; continue from it with: rlzoo train {config_file} "
            f"--resume {run_dir}{same}")
