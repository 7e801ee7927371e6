"""``rlzoo ablate --backend ray --plugin my_loss.py``: each run is a Ray task running ``rlzoo train`` on the run's
``config.yaml``, which records the script's absolute path, so the task loads the script as a local job does
(tests/test_fault_table_plugins.py runs the sweep ppo vs my-clip on local processes). One tiny run of one step (and
its cold start), on a local Ray instance; skipped without ``ray`` (the ``test`` extra installs it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from rlzoo.reporting.metrics_log import read_metrics

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rlzoo[ray]')")

MY_LOSS = '''\
"""A clipper tried from a script."""
import torch

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Sum


@rlzoo.register("clipper", "my-clip")
class MyClip(Clipper):
    """Symmetric clip: loss = -min(rho A, clip(rho, 0.9, 1.1) A)."""

    def clip(self, ratio, advantages):
        self.report("calls", Sum(1.0))
        loss = -torch.minimum(ratio * advantages, ratio.clamp(0.9, 1.1) * advantages)
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=loss, clipped_low=never, clipped_high=never)
'''
TINY = {
    "rollout": {"engine": {"name": "hf"}, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
    "trainer": {"engine": {"name": "torch"}},
    "cold_start": {"steps": 2, "batch_size": 8, "examples": 32},
    "train": {"steps": 1, "eval_every": 1, "eval_prompts": 4, "checkpoint_every": 1},
}


@pytest.mark.slow  # ~30 s of Ray start-up; the local backend's script path is in the default suite
def test_ray_tasks_load_the_script_from_each_runs_config(tmp_path):
    (tmp_path / "my_loss.py").write_text(MY_LOSS)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(TINY))
    command = [
        sys.executable,
        "-m",
        "rlzoo.cli",
        "ablate",
        "run.yaml",
        "--backend",
        "ray",
        "--plugin",
        "my_loss.py",
        "--vary",
        "algorithm.clipper.name=my-clip",
        "--seeds",
        "1",
        "--out",
        "sweep",
    ]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "sweep" / "name-my-clip" / "seed0"
    assert "(ray task)" in (run / "process.log").read_text()
    assert yaml.safe_load((run / "config.yaml").read_text())["plugins"] == [str(tmp_path / "my_loss.py")]
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["final"] == 1.0 and any(row.get("clip/my-clip/calls", 0) > 0 for row in rows), rows
