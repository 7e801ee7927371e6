"""A rejecting rollout correction in real runs: ``rlzoo train`` on tests/test_cli.py's tiny run with the gspo example
(sequence ratio, PPO clip, seq-mean-token-mean) and ``rejection``, with importance weights, as its correction.

The hf rollout engine and the torch trainer differ by float rounding only. A token-level k3 bound of 1e-14 keeps
the tokens they agree on exactly and rejects the others (on the development machine: 23% and 15% of the tokens in
the two steps); a k1 band of [1.5, 2] for pi_rollout / pi_train rejects every token, so the policy loss has nothing
left and the step must still complete."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from cli_testlib import run_cli
from test_cli import TINY_RUN

from rlzoo.reporting.metrics_log import read_metrics

REPO = Path(__file__).resolve().parents[1]
K3 = "[{statistic: k3, level: token, high: 1.0e-14}]"
EVERYTHING = "[{statistic: k1, level: token, low: 1.5, high: 2.0}]"


def run(root: Path, name: str, criteria: str) -> list[dict]:
    correction = f"algorithm.correction={{name: rejection, criteria: {criteria}, importance: {{level: token}}}}"
    overrides = [
        "rollout.engine={name: hf}",
        "trainer.engine={name: torch}",
        *TINY_RUN,
        "train.steps=2",
        "train.eval_every=10",
        f"cold_start.output_dir={root / 'cold'}",
        f"output_dir={root / name}",
        correction,
    ]
    argv = ["train", str(REPO / "examples" / "gspo_tiny_moe.yaml"), *(a for o in overrides for a in ("--set", o))]
    proc = run_cli(argv, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    steps = [row for row in read_metrics(root / name / "metrics.jsonl") if "loss/policy" in row]
    assert len(steps) == 2
    for row in steps:
        assert math.isfinite(row["loss/total"]) and "correction/rejection/is_oob_fraction" in row
    return steps


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rollout-corr")  # the runs share one cold start


def test_a_run_rejects_the_tokens_its_criterion_names(root):
    for row in run(root, "k3", K3):
        rejected = row["correction/rejection/masked_fraction"]
        assert 0.0 <= rejected < 1.0 and rejected == row["correction/rejection/token_k3_masked_fraction"]
        assert row["correction/rejection/token_k3_max"] <= 1e-10  # the engines agree to rounding


def test_a_step_whose_every_token_is_rejected_completes_without_a_policy_loss(root):
    for row in run(root, "all", EVERYTHING):
        assert row["correction/rejection/masked_fraction"] == 1.0
        assert row["correction/rejection/seq_masked_fraction"] == 1.0
        assert row["loss/policy"] == 0.0
