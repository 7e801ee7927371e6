"""Checkpoints survive being killed half-written and a write that fails (disk full): the previous one stays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from rlzoo.runtime.checkpoint.files import latest_checkpoint
from rlzoo.runtime.checkpoint.store import PAUSE_ENV

# a child process: an engine whose state is one float32 tensor of SIZE elements, a tokenizer that writes one file
CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path

    import torch
    from safetensors.torch import save_file

    from rlzoo.runtime.checkpoint.store import CheckpointError, save_checkpoint

    class Trainer:
        def __init__(self, size):
            self.size = size

        def save(self, directory):
            (directory / "model").mkdir(parents=True, exist_ok=True)
            save_file({"w": torch.ones(self.size)}, str(directory / "model" / "model.safetensors"))

    class Tokenizer:
        def save_pretrained(self, directory):
            Path(directory, "tokenizer.json").write_text("{}")

    run_dir, plan = Path(sys.argv[1]), json.loads(sys.argv[2])  # plan: [[step, size, file size limit or null]]
    for step, size, limit in plan:
        if limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        try:
            save_checkpoint(run_dir, step, Trainer(size), Tokenizer(), keep=3)
        except CheckpointError as err:
            print(err)
            sys.exit(1)
    """
)


def child(run_dir: Path, plan: list, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run_dir), json.dumps(plan)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_intact(run_dir: Path, name: str) -> None:
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / name
    assert json.loads((run_dir / "checkpoints" / name / "state.json").read_text())["completed_steps"] == int(name[5:])
    assert (run_dir / "checkpoints" / name / "model" / "model.safetensors").stat().st_size > 4000


def test_a_failed_write_keeps_the_previous_checkpoint_and_says_why(tmp_path):
    proc = child(tmp_path, [[2, 1000, None], [4, 100_000, 64_000]])  # the second engine state is ~400 kB
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert out.count("\n") == 1 and "Traceback" not in out + err, out + err
    assert "could not write checkpoint" in out and "step_000004" in out and "File too large" in out, out
    assert "the previous checkpoint" in out and "step_000002 is intact" in out, out
    assert_intact(tmp_path, "step_000002")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000002"]  # no leftovers


def test_a_run_killed_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    marker = tmp_path / "half-written"
    proc = child(tmp_path / "run", [[2, 1000, None], [4, 1000, None]], **{PAUSE_ENV: str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists():  # the first checkpoint: let it go on
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    marker.unlink()
    while not marker.exists():  # the second: kill it half written
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    checkpoints = tmp_path / "run" / "checkpoints"
    assert_intact(tmp_path / "run", "step_000002")
    [stale] = [p for p in checkpoints.iterdir() if p.name.startswith(".step_000004.tmp-")]
    assert (stale / "model" / "model.safetensors").is_file() and not (stale / "state.json").exists()

    proc = child(tmp_path / "run", [[4, 1000, None]])  # what a resumed run does next
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert_intact(tmp_path / "run", "step_000004")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000002", "step_000004"]
