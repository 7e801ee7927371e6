"""What the end-to-end tests share besides fixtures: the tiny main job's fast overrides (``FAST``, from
``fast_job.py``), a config builder and metric checks. A plain module (imported as ``runs_testlib``; pytest puts this
folder on ``sys.path``), not ``conftest``: every test folder has a ``conftest.py``, and which of them
``import conftest`` finds depends on the order pytest loaded them in."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from fast_job import FAST

from rlzoo.config.loading import read_yaml
from rlzoo.config.resolution import build_config
from rlzoo.reporting.metrics_log import read_metrics

__all__ = ["FAST", "read_yaml"]  # re-exported: the tests take the fast overrides and read the example through it

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gspo_tiny_moe.yaml"


# a preset whose advantage normalises the reward's named parts one by one (gdpo) needs a verifier that returns them
VERIFIER_FOR = {
    "gdpo": "verifier={name: weighted, verifiers: [{name: math, label: correct}, "
    "{name: regex, pattern: '[0-9]+', label: format, weight: 0.5}]}",
}


def preset_needs(preset: str) -> list[str]:
    """The overrides a preset needs beyond the main job's config to run at all (its verifier's reward parts)."""
    return [VERIFIER_FOR[preset]] if preset in VERIFIER_FOR else []


def make_config(run_dir: Path, cold_start_root: Path, *overrides: str, task: str = "arithmetic", registry=None):
    cold = cold_start_root / task
    return build_config(
        read_yaml(EXAMPLE),
        [*FAST, f"output_dir={run_dir}", f"cold_start.output_dir={cold}", *overrides],
        registry,
    )


def assert_finite_metrics(run_dir: Path, steps: int) -> list[dict]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train_rows] == list(range(steps))
    for row in train_rows:
        for key in ("reward/mean", "clip/fraction", "ratio/mean", "time/rollout", "time/train", "loss/policy"):
            assert key in row, (key, row)
            assert math.isfinite(row[key]), (key, row)
    assert rows[-1].get("final") == 1.0 and "eval/accuracy" in rows[-1]
    return rows


def metrics_without_times(rows: list[dict]) -> list[dict]:
    return [json.loads(json.dumps({k: v for k, v in r.items() if not k.startswith("time/")})) for r in rows]


# -- vLLM servers (test_vllm_server*.py) ----------------------------------------------------------------------------


def group_processes(group: int) -> list[int]:
    """The live (not zombie) processes of process group ``group``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == group:
                found.append(int(entry))
    return found


def wait_gone(group: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while group_processes(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    return group_processes(group)


# what torchrun sets for its workers: a test run from inside a launched process must not hand them down
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}


def torchrun(processes: int, *target: str) -> list[str]:
    """The command that runs ``target`` (a script and its arguments, or ``-m module ...``) in ``processes``
    processes on a free port of this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(processes),
        "--master_port",
        str(free_port()),
        *target,
    ]


def run_two_processes(script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``script`` under torchrun in two processes (gloo, one thread each); asserts it exited 0.

    Tried twice, each on a fresh port: the port is chosen free, then bound by torchrun, and once in the full suite
    (vLLM servers starting in the other process) a run failed there and passed alone; a real fault fails twice."""
    env = {**launcher_env(), "OMP_NUM_THREADS": "1"}
    for _ in range(2):
        command = torchrun(2, str(script), *args)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if result.returncode == 0:
            break
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    return result
