"""Faults inside a step, end to end (transformers rollouts, torch training): a loss that stays non-finite.

A third party's advantage source that turns NaN from the third step on makes every update of those steps
non-finite: each is skipped and counted (``train/nonfinite_steps``), and after ``train.max_consecutive_failures``
such steps the run stops with one line naming the cause and its last checkpoint, which is intact and resumable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import yaml
from runs_testlib import EXAMPLE, FAST

from rlzoo.config.loading import apply_overrides, read_yaml
from rlzoo.reporting.metrics_log import read_metrics
from rlzoo.runtime.checkpoint.files import latest_checkpoint

# `rlzoo` with one more plugin registered: the group advantage for two calls (steps 0 and 1), NaN afterwards
RLZOO_WITH_PLUGIN = textwrap.dedent(
    """
    import math, sys

    from rlzoo.hookspecs import hookimpl
    from rlzoo.registry import default_registry
    from rlzoo_estimators.advantages.group import GroupAdvantage

    class DivergesAfterTwo(GroupAdvantage):
        name = "diverges-after-two"
        calls = 0

        def compute(self, batch):
            type(self).calls += 1
            advantages = super().compute(batch)
            return advantages if type(self).calls <= 2 else advantages * math.nan

    class Plugin:
        @hookimpl
        def rlzoo_advantage_sources(self):
            return [DivergesAfterTwo]

    default_registry().add_plugin(Plugin(), name="diverges", distribution="test-plugin")
    from rlzoo.cli import main

    sys.exit(main(sys.argv[1:]))
    """
)
MINIBATCHES = 2


def test_a_loss_that_stays_non_finite_stops_the_run_after_n_steps(tmp_path, cold_start_root):
    config = tmp_path / "run.yaml"
    data = apply_overrides(
        read_yaml(EXAMPLE),
        [
            *FAST,
            f"cold_start.output_dir={cold_start_root / 'arithmetic'}",
            "algorithm.advantage={name: diverges-after-two}",
            f"algorithm.minibatches_per_rollout={MINIBATCHES}",
            "train.steps=8",
            "train.checkpoint_every=2",
            "train.max_consecutive_failures=3",
        ],
    )
    config.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", RLZOO_WITH_PLUGIN, "train", str(config), "--set", f"output_dir={run_dir}"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)

    assert proc.returncode == 1, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "stopped at step 4 after 3 failed steps in a row" in error[0], error
    assert "train.max_consecutive_failures: 3" in error[0] and "not finite" in error[0], error
    assert str(run_dir / "checkpoints" / "step_000004") in error[0], error

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # steps 2, 3, 4 failed; step 5 never ran
    assert [r["train/nonfinite_steps"] for r in rows] == [0, 0, MINIBATCHES, MINIBATCHES, MINIBATCHES]
    # the checkpoint after step 3 holds the weights of step 1 (the updates of steps 2 and 3 were skipped)
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint == run_dir / "checkpoints" / "step_000004"
    assert json.loads((checkpoint / "state.json").read_text()) == {"completed_steps": 4}
    assert not any(p.name.startswith(".") for p in checkpoint.parent.iterdir())
