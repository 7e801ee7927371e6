"""One writer per run folder (rlzoo.runtime.runlock): the lock itself, and through the real CLI a second ``train`` or a
``--resume`` on a folder in use refused at once, and two runs sharing one cold-start folder building it once.
A second stop signal ends a process stuck in its clean-up at once. (SIGTERM / SIGINT on the README main job's
engines: integration_tests/test_signals.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_cli import TINY_RUN

from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime import runlock
from rlzoo.runtime.checkpoint.store import PAUSE_ENV

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"
ENGINES = ["rollout.engine={name: hf}", "trainer.engine={name: torch}"]
TINY = [*ENGINES, *TINY_RUN, "train.eval_every=2"]  # tests/test_cli.py's tiny run on the in-process engines


def _python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


HOLD = """
    import sys, time
    from rlzoo.runtime import runlock
    lock = runlock.hold_run_folder(sys.argv[1], "holder-command")
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_held_run_folder_is_refused_naming_its_holder_and_freed_when_the_holder_is_killed(tmp_path):
    run_dir = tmp_path / "run"
    holder = _python(HOLD, str(run_dir))
    try:
        assert holder.stdout.readline().strip() == "held"
        for check in (
            lambda: runlock.check_run_folder(run_dir),
            lambda: runlock.hold_run_folder(run_dir, "second"),
            lambda: runlock.hold_run_folder(run_dir, "second", resume=True),
        ):
            with pytest.raises(runlock.FolderInUse) as caught:
                check()
            message = str(caught.value)
            assert (
                f"{run_dir} is in use by another rlzoo process: pid {holder.pid} on host {socket.gethostname()}"
                in message
            )
            assert "(holder-command), since 20" in message and f"kill {holder.pid}" in message
        found = runlock.holder_of(run_dir / runlock.LOCK_NAME)
        assert found is not None and found.pid == holder.pid and found.command == "holder-command"
    finally:
        holder.kill()  # SIGKILL: nothing of the holder runs again, the kernel drops its lock
        holder.wait(timeout=30)
    assert runlock.holder_of(run_dir / runlock.LOCK_NAME) is None
    runlock.check_run_folder(run_dir)
    with runlock.hold_run_folder(run_dir, "third") as lock:
        assert lock.held and runlock.holder_of(lock.path).command == "third"
    assert runlock.holder_of(run_dir / runlock.LOCK_NAME) is None  # released with the block


def test_holding_a_folder_this_process_holds_is_a_no_op(tmp_path):
    """``rlzoo train`` holds the folder, then the TrainingRun it starts asks too: not a clash with itself; the
    inner hold lets nothing go, the outer one releases it."""
    run_dir = tmp_path / "run"
    outer = runlock.hold_run_folder(run_dir, "outer")
    inner = runlock.hold_run_folder(tmp_path / "." / "run", "inner")  # the same folder, spelled differently
    runlock.check_run_folder(run_dir)  # this process's own folder is not "in use by another"
    inner.release()
    holder = runlock.holder_of(run_dir / runlock.LOCK_NAME)
    assert holder is not None and (holder.pid, holder.command) == (os.getpid(), "outer")
    outer.release()
    assert runlock.holder_of(run_dir / runlock.LOCK_NAME) is None
    with runlock.hold_run_folder(run_dir, "again") as lock:  # held anew, not mistaken for the released one
        assert lock.held


def _tiny_run(run_dir: Path):
    from rlzoo.config.resolution import load_config
    from rlzoo.registry import default_registry
    from rlzoo.runtime.run import TrainingRun

    registry = default_registry()
    sets = [*TINY, "train.steps=1", f"output_dir={run_dir}", f"cold_start.output_dir={run_dir.parent / 'cold'}"]
    return TrainingRun(load_config(EXAMPLE, sets, registry), registry, progress=False)


def test_a_run_started_from_python_is_refused_on_a_folder_in_use(tmp_path):
    run_dir = tmp_path / "run"
    holder = _python(HOLD, str(run_dir))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(runlock.FolderInUse, match=f"in use by another rlzoo process: pid {holder.pid} "):
            _tiny_run(run_dir).run()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert sorted(p.name for p in run_dir.iterdir()) == [runlock.LOCK_NAME]  # refused before writing anything


def test_a_run_started_from_python_holds_its_folder_until_run_returns_or_raises(tmp_path, monkeypatch):
    from rlzoo.runtime.run import TrainingRun

    run_dir = tmp_path / "run"
    seen = []

    def train(self):
        seen.append(runlock.holder_of(run_dir / runlock.LOCK_NAME))
        raise RuntimeError("stopped inside the run")

    monkeypatch.setattr(TrainingRun, "_train", train)
    with pytest.raises(RuntimeError, match="stopped inside the run"):
        _tiny_run(run_dir).run()
    assert seen[0] is not None and seen[0].pid == os.getpid()
    assert runlock.holder_of(run_dir / runlock.LOCK_NAME) is None


def test_checking_a_folder_creates_nothing(tmp_path):
    runlock.check_run_folder(tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_build_lock_waits_for_its_holder_and_says_so(tmp_path, capfd):
    directory = tmp_path / "shared" / "cold_start"
    holder = _python(
        """
        import sys, time
        from rlzoo.runtime import runlock
        lock = runlock.acquire(runlock.build_lock_path(sys.argv[1]), "builder")
        print("held", flush=True)
        sys.stdin.readline()
        """,
        str(directory),
        stdin=subprocess.PIPE,
    )
    assert holder.stdout.readline().strip() == "held"
    assert runlock.build_lock_path(directory) == tmp_path / "shared" / ".cold_start.lock"
    waited = []
    with runlock.acquire(
        runlock.build_lock_path(directory), "x", wait=True, on_wait=lambda h: (waited.append(h), holder.stdin.close())
    ):
        assert [h.pid for h in waited] == [holder.pid]  # it waited for the builder, which then let go
    holder.wait(timeout=30)
    with runlock.building(directory):  # free now: no wait, nothing said
        assert runlock.holder_of(runlock.build_lock_path(directory)).pid == os.getpid()
    assert "waiting" not in capfd.readouterr().err
    assert not runlock.build_lock_path(directory).exists()  # removed with the build's end


STUCK = """
    import subprocess, threading, time
    from rlzoo.runtime import signals
    with signals.stop_signals():
        try:  # the signal may land anywhere after the pid is printed
            child = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(child.pid, flush=True)
            time.sleep(600)
        except KeyboardInterrupt as err:
            print("stopping", err.signum, flush=True)
            threading.Event().wait()  # a clean-up that never ends
"""


@pytest.mark.parametrize("first,second", [(signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGTERM)])
def test_a_second_signal_ends_a_process_stuck_in_its_cleanup_at_once(first, second):
    proc = _python(STUCK)
    child = int(proc.stdout.readline())
    proc.send_signal(first)
    assert proc.stdout.readline().split() == ["stopping", str(int(first))]
    start = time.monotonic()
    proc.send_signal(second)
    assert proc.wait(timeout=10) == 128 + second
    assert time.monotonic() - start < 5
    err = proc.stderr.read()
    assert f"{first.name} received: stopping" in err
    assert f"{second.name} received while stopping: stopped at once" in err and "Traceback" not in err
    _assert_gone([child])


def _assert_gone(pids: list[int], timeout: float = 10) -> None:
    """Each process has ended (a zombie not yet reaped by its new parent counts as ended)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return
        assert time.monotonic() < deadline, f"left behind: {alive}"
        time.sleep(0.05)


# -- through the real CLI ---------------------------------------------------------------------------------------


def _rlzoo_command() -> list[str]:
    script = Path(sys.executable).with_name("rlzoo")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rlzoo.cli"]


def _train(run_dir: Path, *overrides: str, resume: bool = False, **kwargs) -> list[str]:
    sets = [a for o in [*TINY, *overrides, f"output_dir={run_dir}"] for a in ("--set", o)]
    return [*_rlzoo_command(), "train", str(EXAMPLE), *sets, *(["--resume", str(run_dir)] if resume else [])]


def _wait_for(proc: subprocess.Popen, done, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_train_or_resume_on_a_folder_in_use_is_refused_at_once(tmp_path):
    run_dir, marker, log = tmp_path / "run", tmp_path / "half-written", tmp_path / "first.err"
    with open(log, "w") as handle:  # the first run waits in each checkpoint while `marker` exists
        first = subprocess.Popen(
            _train(run_dir, "train.steps=3", f"cold_start.output_dir={tmp_path / 'cold'}"),
            stdout=subprocess.DEVNULL,
            stderr=handle,
            env={**os.environ, PAUSE_ENV: str(marker)},
        )
    try:
        _wait_for(first, marker.exists, "the first checkpoint")
        marker.unlink()
        _wait_for(first, marker.exists, "the second checkpoint")  # paused in it: alive, with step 1's checkpoint
        for resume in (False, True):
            start = time.monotonic()
            second = subprocess.run(_train(run_dir, resume=resume), capture_output=True, text=True, timeout=300)
            assert second.returncode == 1, second.stderr
            assert time.monotonic() - start < 120
            assert "Traceback" not in second.stderr and second.stdout == ""
            [line] = second.stderr.splitlines()
            assert line.startswith(f"error: {run_dir} is in use by another rlzoo process: pid {first.pid} on host "), (
                line
            )
            assert f"kill {first.pid}" in line
            assert ("resume again" in line) == resume and ("choose another output_dir" in line) == (not resume)
        deadline = time.monotonic() + 300
        while first.poll() is None and time.monotonic() < deadline:  # let it through its other checkpoints
            marker.unlink(missing_ok=True)
            time.sleep(0.05)
        assert first.wait(timeout=10) == 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]  # 3 steps and the final eval
    assert runlock.holder_of(run_dir / runlock.LOCK_NAME) is None


def test_runs_sharing_a_cold_start_build_it_once(tmp_path):
    cold = tmp_path / "shared" / "cold_start"
    logs = {name: tmp_path / f"{name}.err" for name in ("a", "b")}
    # held by this test first, so that both runs are seen waiting for it; then one builds and the other waits for it
    lock = runlock.acquire(runlock.build_lock_path(cold), "the test")
    procs = {}
    try:
        for name, log in logs.items():
            with open(log, "w") as handle:
                command = _train(tmp_path / name, "train.steps=1", f"cold_start.output_dir={cold}")
                procs[name] = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=handle)
        waiting = f"cold start: waiting for pid {os.getpid()} on host {socket.gethostname()} (the test"
        for name, proc in procs.items():
            _wait_for(proc, lambda name=name: waiting in logs[name].read_text(), f"run {name} to wait")
        lock.release()
        for name, proc in procs.items():
            assert proc.wait(timeout=300) == 0, logs[name].read_text()[-3000:]
    finally:
        lock.release()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    errs = {name: log.read_text() for name, log in logs.items()}
    [builder] = [name for name, err in errs.items() if "cold start (SFT)" in err]  # built once
    [other] = {"a", "b"} - {builder}
    assert f"cold start: using {cold}, built meanwhile by another process" in errs[other]
    assert "Traceback" not in errs[builder] + errs[other]
    assert (cold / "cold_start.json").is_file()
    assert not runlock.build_lock_path(cold).exists()  # the last builder removed it: nothing beside the cold start
    for name in ("a", "b"):
        assert [r["step"] for r in read_metrics(tmp_path / name / "metrics.jsonl")] == [0, 1]
