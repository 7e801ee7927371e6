"""How a command stops when it is told to: SIGINT and SIGTERM.

SIGTERM (what a scheduler sends before it kills a job) is handled as SIGINT (Ctrl-C):
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
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    from rlzoo.reporting.metrics_log import read_metrics
    from rlzoo.runtime.checkpoint.files import latest_checkpoint

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
        return (
            f"interrupted by {signal_name(signum)} {where}, before the first checkpoint: start it again with "
            f"rlzoo train {config_file}{same}"
        )
    try:
        saved = f"the last checkpoint ({checkpoint}) is at {int(checkpoint.name.removeprefix('step_'))} steps"
    except ValueError:
        saved = f"the last checkpoint is {checkpoint}"
    return (
        f"interrupted by {signal_name(signum)} {where}; {saved}; continue from it with: rlzoo train {config_file} "
        f"--resume {run_dir}{same}"
    )
