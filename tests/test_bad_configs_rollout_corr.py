"""A rollout-correction mode or threshold out of range, through the real CLI (``python -m rlzoo.cli config check``, and
``train`` for one): exit 1, one problem line naming the field and what is allowed, no traceback, nothing built.

The cases and their checks are tests/test_bad_configs.py's (``Case``, ``run_case``, ``assert_one_clear_error``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from test_bad_configs import Case, assert_one_clear_error, run_case


def correction(**spec) -> dict:
    return {"algorithm": {"correction": spec}}


GEO = {"statistic": "k1", "level": "seq_mean", "high": 1.001}
CASES = [
    Case("tis-level", correction(name="tis", level="tokens"), ("algorithm.correction.level", "'token' or 'sequence'")),
    Case("tis-threshold", correction(name="tis", threshold=0), ("algorithm.correction.threshold", "greater than 0")),
    Case("tis-low-above-cap", correction(name="tis", threshold=2.0, low=3.0),
         ("algorithm.correction.low", "must not exceed threshold (2.0)")),
    Case("rejection-statistic", correction(name="rejection", criteria=[{**GEO, "statistic": "kl"}]),
         ("algorithm.correction.criteria.0.statistic", "'k1', 'k2' or 'k3'")),
    Case("rejection-max-of-k1", correction(name="rejection", criteria=[{**GEO, "level": "seq_max"}]),
         ("algorithm.correction.criteria.0.level", "use k2 or k3")),
    Case("rejection-k1-bounds", correction(name="rejection", criteria=[{**GEO, "low": 1.5}]),
         ("algorithm.correction.criteria.0.low", "must not exceed high (1.001)")),
    Case("rejection-k3-threshold",
         correction(name="rejection", criteria=[{"statistic": "k3", "level": "token", "high": -0.1}]),
         ("algorithm.correction.criteria.0.high", "greater than 0")),
    Case("rejection-none", correction(name="rejection", criteria=[]),
         ("algorithm.correction.criteria", "at least one criterion")),
    Case("opsm-threshold", correction(name="opsm", threshold=-0.5),
         ("algorithm.correction.threshold", "greater than 0")),
    Case("opsm-importance", correction(name="opsm", importance={"action": "clip"}),
         ("algorithm.correction.importance.action", "'truncate' or 'mask'")),
    Case("rejection-rollout-only", {"algorithm": {"correction": {"name": "rejection"}, "old_logprobs": "rollout-only"}},
         ("algorithm.correction.name", "rollout-only", "'none'")),
    Case("correction-name", correction(name="rejections"), ("algorithm.correction.name", "did you mean 'rejection'")),
]
RUNS = [(case, "check") for case in CASES] + [(CASES[1], "train")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    jobs = [(case, command, tmp_path_factory.mktemp(f"{case.id}-{command}")) for case, command in RUNS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # each spends its seconds importing torch
        procs = list(pool.map(lambda job: run_case(*job), jobs))
    return {(case.id, command): (folder, proc) for (case, command, folder), proc in zip(jobs, procs)}


@pytest.mark.parametrize("case, command", RUNS, ids=lambda x: getattr(x, "id", x))
def test_a_bad_correction_is_one_line_naming_the_field(results, case: Case, command: str):
    folder, proc = results[(case.id, command)]
    assert_one_clear_error(case, command, folder, proc.returncode, proc.stdout, proc.stderr)
    problems = proc.stderr.strip().splitlines()[1:]
    assert len(problems) == 1, proc.stderr
