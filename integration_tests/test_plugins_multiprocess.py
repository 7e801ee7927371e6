"""A script's component in every rank: ``torchrun --nproc_per_node 2 -m rlzoo.cli train CONFIG --plugin my_loss.py``.

Each rank runs the same command line, so each loads the file and builds the clipper from it (the run's objective is
built on every rank); the clipper leaves a file per rank when it is built, and reports its calls, which the run logs
as ``clip/my-clip/calls``. The config is test_multiprocess.py's (DeepSpeed ZeRO-2, gloo on CPU), two steps.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_multiprocess import ZERO2, finish, launch, write_launch_config

from rlzoo.reporting.metrics_log import read_metrics

MY_LOSS = '''\
"""A clipper from a script that says which ranks built it."""
import os
from pathlib import Path

import torch

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Sum


@rlzoo.register("clipper", "my-clip")
class MyClip(Clipper):
    """Symmetric clip: loss = -min(rho A, clip(rho, 0.9, 1.1) A)."""

    def __init__(self, params=None):
        super().__init__(params)
        Path(__file__).with_name(f"built-by-rank{os.environ.get('RANK', '-')}").touch()

    def clip(self, ratio, advantages):
        self.report("calls", Sum(1.0))
        loss = -torch.minimum(ratio * advantages, ratio.clamp(0.9, 1.1) * advantages)
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=loss, clipped_low=never, clipped_high=never)
'''


def test_every_rank_loads_the_script_and_trains_with_its_clipper(tmp_path, cold_start_root):
    script = tmp_path / "my_loss.py"
    script.write_text(MY_LOSS)
    config = write_launch_config(tmp_path, cold_start_root, 2, "rollout.per_rank=false")
    run_dir = tmp_path / "run"
    sets = [ZERO2, "algorithm.clipper={name: my-clip}", f"output_dir={run_dir}"]
    finish(launch(2, config, *[a for s in sets for a in ("--set", s)], "--plugin", str(script)))
    assert sorted(p.name for p in tmp_path.glob("built-by-rank*")) == ["built-by-rank0", "built-by-rank1"]
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [0, 1] and all(r["clip/my-clip/calls"] > 0 for r in rows), rows
    assert json.loads((run_dir / "plugins.json").read_text()) == {str(script): _digest(script)}


def _digest(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
