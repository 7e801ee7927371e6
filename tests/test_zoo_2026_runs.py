"""Short end-to-end runs of the 2026 zoo through the real CLI (tests/test_cli.py's tiny run, the hf rollout engine,
one shared cold start): DPPO (the ``dppo-tv`` preset: its trust region, TIS truncation and the rollout engine's
log-probs as the old ones), GDPO with the ``weighted`` verifier's reward parts, ReMax with its greedy baselines, the
optimal token baseline with the training engine's sum_v pi(v)^2, and GDPO with a verifier that returns no parts and
does not declare it, which stops at the first step with one line. In this process (tests/cli_testlib.py's
``run_cli``): a new process per run would only add its imports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from cli_testlib import CliResult, run_cli
from test_cli import REPO, TINY_RUN

WEIGHTED = (
    "verifier={name: weighted, verifiers: [{name: exact, label: correct}, "
    "{name: regex, pattern: '[0-9]+', label: format, weight: 0.5}]}"
)
RUNS = {
    "dppo": ["algorithm.preset=dppo-tv"],
    "gdpo": ["algorithm.preset=gdpo", WEIGHTED],
    "remax": ["algorithm.preset=remax"],
    "otb": ["algorithm.advantage.name=optimal-token-baseline", "algorithm.router=null"],
    "gdpo-without-parts": ["algorithm.preset=gdpo"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[CliResult, Path]]:
    root = tmp_path_factory.mktemp("zoo2026")
    out = {}
    for name, extra in RUNS.items():  # one after the other: the first builds the cold start, the others reuse it
        run_dir = root / name
        overrides = [
            *TINY_RUN,
            "rollout.engine={name: hf}",
            f"cold_start.output_dir={root / 'cold'}",
            f"output_dir={run_dir}",
            *extra,
        ]
        argv = ["train", str(REPO / "examples" / "gspo_tiny_moe.yaml"), *[a for o in overrides for a in ("--set", o)]]
        out[name] = (run_cli(argv, root), run_dir)
    return out


def first_step(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(row for row in rows if row["step"] == 0 and "loss/policy" in row)


def finished(runs, name: str) -> dict:
    proc, run_dir = runs[name]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return first_step(run_dir)


def test_dppo_runs_end_to_end(runs):
    metrics = finished(runs, "dppo")
    assert 0.0 <= metrics["clip/truncated_fraction"] <= 1.0 and math.isfinite(metrics["loss/policy"])
    algorithm = yaml.safe_load((runs["dppo"][1] / "config.yaml").read_text())["algorithm"]
    assert algorithm["clipper"]["name"] == "dppo-tv" and algorithm["old_logprobs"] == "rollout"


def test_gdpo_runs_end_to_end_on_the_weighted_verifiers_parts(runs):
    metrics = finished(runs, "gdpo")
    assert {"reward/parts/correct_mean", "reward/parts/format_mean"} <= set(metrics)
    assert 0.0 <= metrics["reward/parts/format_mean"] <= 1.0 and math.isfinite(metrics["advantage/abs_mean"])


def test_remax_runs_end_to_end_with_a_greedy_baseline(runs):
    metrics = finished(runs, "remax")
    assert "reward/baseline_mean" in metrics and metrics["time/baseline"] > 0
    assert "kl/in_reward" in metrics  # the preset's KL in the reward, on the token rewards remax reads


def test_the_optimal_token_baseline_runs_end_to_end_on_the_engines_sum_pi_squared(runs):
    metrics = finished(runs, "otb")
    assert math.isfinite(metrics["advantage/abs_mean"]) and math.isfinite(metrics["loss/policy"])


def test_a_run_without_parts_has_no_part_metrics(runs):
    assert not any(key.startswith("reward/parts/") or key == "reward/baseline_mean" for key in finished(runs, "dppo"))


def test_gdpo_without_parts_stops_at_the_first_step_with_one_line(runs):
    proc, _ = runs["gdpo-without-parts"]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: verifier: its verdicts carry no reward parts (Verdict.parts), but advantage 'gdpo' (algorithm.advantage) "
        "normalises each part on its own: use a verifier that returns named parts (weighted: one part per verifier it "
        "combines), or an advantage that reads the reward alone (group, ...)"
    ], proc.stderr[-3000:]
