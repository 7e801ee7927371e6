"""SIGTERM (what a scheduler sends before it kills a job) and SIGINT (Ctrl-C) on the README main job's engines
(vLLM rollouts, DeepSpeed ZeRO-2 with DeepSpeed-MoE): the run stops, says where and how to continue, exits 143 /
130 without a traceback, leaves no process behind and its folder unlocked, and ``--resume`` then logs exactly the
metrics of an uninterrupted run. A second signal ends it at once. (The lock and a second signal during a stuck
clean-up, on their own: tests/test_runlock.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from runs_testlib import EXAMPLE, FAST, metrics_without_times

from rlzoo.config.loading import apply_overrides, read_yaml
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime import runlock
from rlzoo.runtime.checkpoint.files import latest_checkpoint

pytestmark = pytest.mark.skipif(
    not all(__import__("importlib").util.find_spec(m) for m in ("vllm", "deepspeed")), reason="needs vLLM and DeepSpeed"
)

STEPS = 6
MAIN_JOB = [  # the example's own engines, small (as test_resume.py's main-job test, whose cold start this reuses)
    "rollout.engine={name: vllm, kv_cache_memory_bytes: 67108864}",
    "trainer.engine={name: deepspeed, zero_stage: 2, moe: deepspeed}",
    "task.digits=1",
    "cold_start.steps=100",
    f"train.steps={STEPS}",
    "train.eval_every=3",
    "algorithm.minibatches_per_rollout=2",
]


def rlzoo(*args: str, err: Path) -> subprocess.Popen:
    with open(err, "w") as handle:  # a file, not a pipe: nothing blocks on a full pipe
        return subprocess.Popen([sys.executable, "-m", "rlzoo.cli", *args], stdout=subprocess.DEVNULL, stderr=handle)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory, cold_start_root) -> tuple[Path, list[dict]]:
    """The config, and the metrics of its uninterrupted run (shared by the tests)."""
    root = tmp_path_factory.mktemp("signals")
    data = apply_overrides(
        read_yaml(EXAMPLE), [*FAST, *MAIN_JOB, f"cold_start.output_dir={cold_start_root / 'arithmetic-1digit'}"]
    )
    config = root / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    reference = rlzoo("train", str(config), "--set", f"output_dir={root / 'reference'}", err=root / "reference.err")
    assert reference.wait(timeout=900) == 0, (root / "reference.err").read_text()[-3000:]
    return config, metrics_without_times(read_metrics(root / "reference" / "metrics.jsonl"))


def _descendants(pid: int) -> set[int]:
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            return set()
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(
                    int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]), []
                ).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running_after_first_checkpoint(config: Path, run_dir: Path, err: Path) -> tuple[subprocess.Popen, set[int]]:
    """A run of the main job, once its first checkpoint exists; with every process seen below it until then."""
    victim = rlzoo("train", str(config), "--set", f"output_dir={run_dir}", err=err)
    seen: set[int] = set()
    deadline = time.time() + 600
    while latest_checkpoint(run_dir) is None:
        assert victim.poll() is None, f"the run ended before its first checkpoint: {err.read_text()[-3000:]}"
        assert time.time() < deadline
        seen |= _descendants(victim.pid)
        time.sleep(0.05)
    return victim, seen | _descendants(victim.pid)


def _assert_none_left(pids: set[int], timeout: float = 30) -> None:
    """Every one of ``pids`` has ended (a zombie not yet reaped by its new parent has ended)."""
    deadline = time.time() + timeout
    while True:
        alive = set()
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
            except (OSError, IndexError):
                pass
        if not alive:
            return
        assert time.time() < deadline, f"processes left behind: {alive}"
        time.sleep(0.1)


@pytest.mark.parametrize(  # both take the same path (rlzoo.runtime.signals); SIGINT in the slow suite
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)], ids=["SIGTERM", "SIGINT"]
)
def test_a_stop_signal_stops_the_main_job_cleanly_and_resume_reproduces_it(tmp_path, main_job, signum):
    config, expected = main_job
    run_dir, err_file = tmp_path / "run", tmp_path / "victim.err"
    victim, children = _running_after_first_checkpoint(config, run_dir, err_file)
    victim.send_signal(signum)
    assert victim.wait(timeout=120) == 128 + signum  # 143 for SIGTERM, 130 for SIGINT
    err = err_file.read_text()
    assert "Traceback" not in err, err[-3000:]
    assert f"{signum.name} received: stopping" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"interrupted by {signum.name} after "), last
    assert f"continue from it with: rlzoo train {config} --resume {run_dir} (with the same --set options)" in last
    _assert_none_left(children)
    assert runlock.holder_of(run_dir / runlock.LOCK_NAME) is None  # the folder is free again
    assert len([r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]) < STEPS

    resumed = rlzoo("train", str(config), "--resume", str(run_dir), err=tmp_path / "resumed.err")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "resumed.err").read_text()[-3000:]
    actual = metrics_without_times(read_metrics(run_dir / "metrics.jsonl"))
    assert [r["step"] for r in actual] == list(range(STEPS + 1))
    assert actual == expected


def test_a_second_signal_ends_the_main_job_at_once(tmp_path, main_job):
    """Two signals delivered together (the process is stopped while they are sent, so the first is not handled
    before the second arrives): no clean-up, exit 128 + the second's number, nothing left behind. (Which of the
    two counts as the second depends on the threads the kernel hands them to.)"""
    config, _ = main_job
    run_dir, err_file = tmp_path / "run", tmp_path / "victim.err"
    victim, children = _running_after_first_checkpoint(config, run_dir, err_file)
    victim.send_signal(signal.SIGSTOP)
    victim.send_signal(signal.SIGINT)
    victim.send_signal(signal.SIGTERM)
    victim.send_signal(signal.SIGCONT)
    start = time.monotonic()
    code = victim.wait(timeout=60)
    assert time.monotonic() - start < 10
    err = err_file.read_text()
    assert code in (128 + signal.SIGINT, 128 + signal.SIGTERM), err[-3000:]
    second = signal.Signals(code - 128).name
    assert f"{second} received while stopping: stopped at once, without cleaning up" in err, err[-3000:]
    assert "Traceback" not in err and "interrupted by" not in err
    _assert_none_left(children | _descendants(victim.pid))
    assert runlock.holder_of(run_dir / runlock.LOCK_NAME) is None
    assert latest_checkpoint(run_dir) is not None  # what was written stays whole: --resume continues from it
