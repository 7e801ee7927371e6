"""``rlzoo mismatch``: the gap between the rollout and the training engine measured on the tiny main job, its gate,
its refusals, and the arithmetic behind its numbers.

Two measurements share one cold start (a module fixture, in-process through :func:`cli_testlib.run_cli`): the
example's tiny Qwen3-MoE with the hf rollout engine and the torch trainer (integration_tests' ``FAST`` engines and
batch), both in float32 (they differ by float rounding only), and the same with the rollout engine in bfloat16
(``model.dtype: bfloat16``, the rollout engine's dtype: the gap a bf16 inference engine brings). The cold start is TINY_RUN's two SFT steps (the 40 of ``FAST`` take
80 s on a loaded 2-core machine; the gap does not need a trained model); the slow test runs ``FAST``'s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_testlib import run_cli

from rlzoo.mismatch.corrections import MIN_ESS, correction_effect, recommend
from rlzoo.mismatch.gate import GATE_METRICS
from rlzoo.mismatch.measures import by_position, by_probability, ess, gap_metrics, position_edges

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "examples" / "gspo_tiny_moe.yaml")
ENGINES = [
    "rollout.engine={name: hf}",
    "trainer.engine={name: torch}",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
]  # integration_tests/conftest.py's FAST engines and batch
TINY_COLD = [
    "cold_start.steps=2",
    "cold_start.batch_size=8",
    "cold_start.examples=32",
    "train.eval_prompts=4",
    "train.eval_samples_per_prompt=1",
]


def _sets(root: Path, *overrides: str) -> list[str]:
    every = [*ENGINES, *TINY_COLD, f"cold_start.output_dir={root / 'cold'}", f"output_dir={root / 'run'}", *overrides]
    return [a for o in every for a in ("--set", o)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mismatch")
    out = {}
    for name, extra in (
        ("fp32", ["--fail-above", "abs_logp_diff=1e-3"]),
        ("bf16", ["--set", "model.dtype=bfloat16", "--fail-above", "abs_logp_diff=1e-5", "--fail-above", "k3_kl=1e9"]),
    ):
        result = run_cli(["mismatch", CONFIG, *_sets(root), "--out", str(root / name), *extra], cwd=root)
        report = (
            json.loads((root / name / "mismatch.json").read_text())
            if (root / name / "mismatch.json").is_file()
            else None
        )
        out[name] = (result, report, root / name)
    return out


def test_identical_engines_in_fp32_agree_to_rounding(runs):
    result, report, out = runs["fp32"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in out.iterdir()} >= {"mismatch.md", "mismatch.json", "mismatch.png", "log.txt"}
    m = report["metrics"]
    assert m["abs_logp_diff"] < 1e-5 and m["abs_logp_diff_max"] < 1e-4, m
    assert m["share_above_0.1"] == 0.0 and abs(m["ess_token"] - 1.0) < 1e-6
    assert m["router_disagreement"] == 0.0  # the same weights route the same tokens alike
    assert report["engines"] == {
        "rollout": "hf",
        "rollout_dtype": "float32",
        "trainer": "torch",
        "trainer_dtype": "float32",
    }
    assert report["recommendation"]["name"] == "none"


def test_a_bf16_rollout_side_widens_the_gap_and_the_gate_fails(runs):
    (_, fp32, _), (result, bf16, out) = runs["fp32"], runs["bf16"]
    assert bf16["engines"]["rollout_dtype"] == "bfloat16"
    gap = bf16["metrics"]["abs_logp_diff"]
    assert gap > 1e-4 and gap > 100 * fp32["metrics"]["abs_logp_diff"], (gap, fp32["metrics"])
    # the gate: exit 1, one line naming the metric, its value and the bound; the k3 bound (1e9) holds
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: mismatch above its bound: abs_logp_diff = {gap:.6g} > 1e-05"], result.stderr[-2000:]
    assert (out / "mismatch.md").is_file()  # the report is written before the gate decides


def test_the_report_numbers_are_consistent(runs):
    for name in ("fp32", "bf16"):
        result, report, out = runs[name]
        m = report["metrics"]
        assert m["abs_logp_diff_max"] >= m["abs_logp_diff_p99"] >= m["abs_logp_diff_p50"] >= 0 and m["k3_kl"] >= 0
        assert m["tokens"] > 0 and 0 < m["responses"] <= 2 * 4 * 4  # 2 batches of 4 prompts x 4
        for breakdown in ("by_position", "by_probability"):
            rows = report[breakdown]
            assert sum(r["tokens"] for r in rows) == m["tokens"]
            assert math.isclose(sum(r["share"] for r in rows), 1.0)
        import rlzoo

        assert set(report["corrections"]) == set(rlzoo.default_registry().names("correction"))
        for effect in report["corrections"].values():
            assert 0 <= effect["kept"] <= 1 and 0 <= effect["ess"] <= 1 + 1e-9
        assert report["corrections"]["none"]["ess"] == 1.0 and report["corrections"]["none"]["kept"] == 1.0
        md = (out / "mismatch.md").read_text()
        assert f"| abs_logp_diff | {m['abs_logp_diff']:.4g} |" in md and "Recommended:" in md
        # the console: the start summary and the numbers, the engines' messages in log.txt
        lines = result.stdout.splitlines()
        assert lines[0].startswith("rlzoo mismatch ") and any(line.startswith("  |d| mean") for line in lines)
        assert len(lines) < 25 and (out / "log.txt").stat().st_size > 0  # the engines' messages went there


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--fail-above", "no_such_metric=1"], "unknown metric 'no_such_metric'; accepted: abs_logp_diff"),
        (["--fail-above", "abs_logp_diff=abc"], "'abc' is not a finite number"),
        (["--fail-above", "abs_logp_diff=nan"], "'nan' is not a finite number"),
        (["--fail-above", "abs_logp_diff"], "write METRIC=VALUE"),
        (["--steps", "0"], "--steps: '0' is not a positive whole number"),
    ],
)
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, says):
    result = run_cli(["mismatch", CONFIG, *_sets(tmp_path), "--out", str(tmp_path / "out"), *args], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and says in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cold").exists()


def test_every_gate_metric_is_one_the_report_measures():
    t = torch.tensor([[-1.0, -2.0]])
    assert set(GATE_METRICS) - set(gap_metrics(t, t, torch.ones_like(t))) == {
        "router_disagreement",
        "abs_logp_diff_no_replay",
    }


def test_gap_metrics_by_hand():
    train = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, -0.5, -0.5]])
    rollout = torch.tensor([[-1.2, -1.0, float("nan")], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # padding holds anything, NaN included
    m = gap_metrics(train, rollout, mask)
    d = (train.double() - rollout.double())[mask > 0]  # 0.2, -1, 0, 0, 0 (in float32)
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-6)  # noqa: E731
    assert close(m["abs_logp_diff"], 1.2 / 5) and close(m["abs_logp_diff_max"], 1.0)
    assert close(m["k1_kl"], 0.8 / 5)
    assert math.isclose(m["k3_kl"], (torch.exp(d) - 1 - d).mean().item())
    assert math.isclose(m["chi2_token"], (torch.exp(2 * d).mean() - 1).item())
    assert close(m["chi2_seq"], ((math.exp(2 * -0.8) + 1) / 2) - 1)
    assert math.isclose(m["share_above_0.1"], 2 / 5) and math.isclose(m["share_above_0.5"], 1 / 5)
    assert m["share_above_1"] == 0.0 and m["tokens"] == 5 and m["responses"] == 2
    assert close(m["log_ppl_abs_diff"], (0.4 + 0) / 2)
    assert math.isclose(m["ess_token"], ess(torch.exp(d)))
    assert [r["tokens"] for r in by_position(train, rollout, mask)] == [2, 2, 1]
    assert sum(r["tokens"] for r in by_probability(train, rollout, mask)) == 5


def test_ess_and_position_bins():
    assert ess(torch.ones(7)) == 1.0 and ess(torch.zeros(3)) == 0.0
    assert math.isclose(ess(torch.tensor([1.0, 0.0, 0.0, 0.0])), 0.25)  # one sample carries everything
    assert math.isclose(ess(torch.tensor([2.0, 1.0])), 9 / 10)
    assert position_edges(6) == [0, 1, 2, 3, 4, 5, 6] and position_edges(64)[::4] == [0, 32, 64]


def test_correction_effects_and_the_rule():
    import rlzoo

    registry = rlzoo.default_registry()
    train = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.0, -1.0, -1.0, -4.0]])  # one token 3 nats apart: r = e^3
    mask, adv = torch.ones_like(train), torch.ones_like(train)
    none = correction_effect(registry.create("correction", "none"), train, rollout, mask, adv)
    assert none == {"kept": 1.0, "reweighted": 0.0, "ess": 1.0, "mean": 1.0, "var": 0.0, "residual": 0.75}
    tis = correction_effect(registry.create("correction", "tis", {"threshold": 2.0}), train, rollout, mask, adv)
    assert tis["reweighted"] == 0.25 and math.isclose(tis["mean"], 1.25)
    assert math.isclose(tis["residual"], (3 - math.log(2)) / 4) and math.isclose(tis["ess"], 25 / 28)
    icepop = correction_effect(registry.create("correction", "icepop"), train, rollout, mask, adv)
    assert icepop["kept"] == 0.75 and icepop["residual"] == 0.0 and math.isclose(icepop["ess"], 0.75)
    effects = {"none": none, "tis": tis, "icepop": icepop}
    assert recommend(effects, 0.75)["name"] == "none"  # tis (ESS 0.89) and icepop (0.75) are below MIN_ESS
    assert MIN_ESS == 0.9
    assert recommend({**effects, "tis": {**tis, "ess": 0.95}}, 0.75)["name"] == "tis"
    assert recommend(effects, 1e-6)["reason"].startswith("mean |log r| = 1e-06 < 0.001")


@pytest.mark.slow
def test_causes_on_the_main_job_with_routing_replay(tmp_path):
    """``--causes`` on the tiny main job with integration_tests' FAST cold start (40 SFT steps) and R3: the rollout
    side's bf16 makes (nearly) the whole gap; each row says what it changed; R3 replays the rollout's experts, so no
    expert slot differs under the policy."""
    cold = ["cold_start.steps=40", "cold_start.batch_size=16", "train.eval_prompts=16"]
    sets = [
        *ENGINES,
        *cold,
        f"cold_start.output_dir={tmp_path / 'cold'}",
        f"output_dir={tmp_path / 'run'}",
        "algorithm.router={name: replay-rollout}",
    ]
    result = run_cli(
        ["mismatch", CONFIG, *(a for o in sets for a in ("--set", o)), "--causes", "--out", str(tmp_path / "out")],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "mismatch.json").read_text())
    rows = {row["cause"]: row for row in report["causes"]}
    assert {"precision (rollout)", "precision (trainer)", "batch composition", "routing"} <= set(rows)
    assert rows["routing"]["changed"] == "router replay-rollout off (routed afresh)"
    rollout = rows["precision (rollout)"]
    assert rollout["changed"] == "model.dtype float32 -> bfloat16" and rollout["explains"] > 0.99
    assert rollout["abs_logp_diff"] > 100 * report["metrics"]["abs_logp_diff"]
    assert rows["batch composition"]["alone_vs_batched"] < 1e-4
    moe = report["moe"]
    assert moe["router_policy"] == "replay-rollout" and moe["replays_old_pass"]
    assert set(moe["disagreement_per_layer_with_policy"].values()) == {0.0}
    assert "## Causes (one thing changed at a time)" in (tmp_path / "out" / "mismatch.md").read_text()


def test_a_correction_that_cannot_be_built_with_defaults_is_reported_not_fatal():
    from rlzoo.config.base import SPECS
    from rlzoo.errors import RlzooError
    from rlzoo.mismatch.corrections import build_corrections

    class Registry:
        def names(self, kind):
            return ["needs-params", "tis"]

        def create(self, kind, name, params=None):
            if name == "needs-params":
                raise RlzooError("correction 'needs-params': field required: cap")
            return (name, params)

    built, skipped = build_corrections(Registry(), SPECS["correction"](name="tis", threshold=3.0))
    assert built == {"tis": ("tis", {"threshold": 3.0})}  # the config's own correction with its parameters
    assert skipped == {"needs-params": "correction 'needs-params': field required: cap"}
