"""A rollout-correction mode or threshold out of range, through the real CLI (``rlzoo config check``, in-process
through ``rlzoo.cli.main``; ``train`` runs the same checks: tests/test_bad_configs.py): exit 1, one problem line
naming the field and what is allowed, no traceback.

The cases and their checks are tests/test_bad_configs.py's (``Case``, ``prepare``, ``assert_one_clear_error``)."""

from __future__ import annotations

import pytest
from cli_testlib import run_cli
from test_bad_configs import Case, assert_one_clear_error, prepare


def correction(**spec) -> dict:
    return {"algorithm": {"correction": spec}}


GEO = {"statistic": "k1", "level": "seq_mean", "high": 1.001}
CASES = [
    Case("tis-level", correction(name="tis", level="tokens"), ("algorithm.correction.level", "'token' or 'sequence'")),
    Case("tis-threshold", correction(name="tis", threshold=0), ("algorithm.correction.threshold", "greater than 0")),
    Case(
        "tis-low-above-cap",
        correction(name="tis", threshold=2.0, low=3.0),
        ("algorithm.correction.low", "must not exceed threshold (2.0)"),
    ),
    Case(
        "rejection-statistic",
        correction(name="rejection", criteria=[{**GEO, "statistic": "kl"}]),
        ("algorithm.correction.criteria.0.statistic", "'k1', 'k2' or 'k3'"),
    ),
    Case(
        "rejection-max-of-k1",
        correction(name="rejection", criteria=[{**GEO, "level": "seq_max"}]),
        ("algorithm.correction.criteria.0.level", "use k2 or k3"),
    ),
    Case(
        "rejection-k1-bounds",
        correction(name="rejection", criteria=[{**GEO, "low": 1.5}]),
        ("algorithm.correction.criteria.0.low", "must not exceed high (1.001)"),
    ),
    Case(
        "rejection-k3-threshold",
        correction(name="rejection", criteria=[{"statistic": "k3", "level": "token", "high": -0.1}]),
        ("algorithm.correction.criteria.0.high", "greater than 0"),
    ),
    Case(
        "rejection-none",
        correction(name="rejection", criteria=[]),
        ("algorithm.correction.criteria", "at least one criterion"),
    ),
    Case(
        "opsm-threshold", correction(name="opsm", threshold=-0.5), ("algorithm.correction.threshold", "greater than 0")
    ),
    Case(
        "opsm-importance",
        correction(name="opsm", importance={"action": "clip"}),
        ("algorithm.correction.importance.action", "'truncate' or 'mask'"),
    ),
    Case(
        "rejection-rollout-only",
        {"algorithm": {"correction": {"name": "rejection"}, "old_logprobs": "rollout-only"}},
        ("algorithm.correction.name", "rollout-only", "'none'"),
    ),
    Case("correction-name", correction(name="rejections"), ("algorithm.correction.name", "did you mean 'rejection'")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_bad_correction_is_one_line_naming_the_field(tmp_path, case: Case):
    proc = run_cli(["config", "check", *prepare(case, tmp_path)], tmp_path)
    assert_one_clear_error(case, "check", tmp_path, proc.returncode, proc.stdout, proc.stderr)
    problems = proc.stderr.strip().splitlines()[1:]
    assert len(problems) == 1, proc.stderr
