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
# a length penalty: responses of one group differ in reward even from a barely trained model, so the policy
# gradient the corrections are compared on is not 0
SHAPED = "algorithm.reward_shaping=[{name: length, coef: 0.1}]"
TINY_COLD = [
    "cold_start.steps=2",
    "cold_start.batch_size=8",
    "cold_start.examples=32",
    "train.eval_prompts=4",
    "train.eval_samples_per_prompt=1",
]


def _overrides(root: Path, *overrides: str) -> list[str]:
    return [
        *ENGINES,
        *TINY_COLD,
        SHAPED,
        f"cold_start.output_dir={root / 'cold'}",
        f"output_dir={root / 'run'}",
        *overrides,
    ]


def _sets(root: Path, *overrides: str) -> list[str]:
    return [a for o in _overrides(root, *overrides) for a in ("--set", o)]


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
    out["root"] = root  # the cold start the fixture's runs share
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
        # the gradients: 2 batches x the example's 4 minibatches, every correction beside the on-policy one
        gradients = report["gradients"]
        assert gradients["minibatches"] == 8 and gradients["parameters"] > 100_000
        assert gradients["horizon"] == 600 * 4  # the example's train.steps x minibatches_per_rollout
        assert gradients["reference"]["bias"] == 0.0 and gradients["reference"]["grad_var"] > 0
        for effect in report["corrections"].values():
            assert effect["bias"] < 0.05 and effect["cosine"] > 0.99, effect  # a gap of 1e-7 (fp32) or 1e-3 (bf16)
            assert math.isclose(effect["mse"], effect["bias"] ** 2 + effect["grad_var"] / gradients["horizon"])
        md = (out / "mismatch.md").read_text()
        assert f"| abs_logp_diff | {m['abs_logp_diff']:.4g} |" in md and "Recommended:" in md
        columns = "| correction | kept | reweighted | ess | mean | var | residual | bias | bias_noise | grad_var | cosine | mse |"
        assert columns in md
        assert "Gradients: each correction's policy gradient against the on-policy one" in md
        # the console: the start summary and the numbers, the engines' messages in log.txt
        lines = result.stdout.splitlines()
        assert lines[0].startswith("rlzoo mismatch ") and any(line.startswith("  |d| mean") for line in lines)
        assert any("bias" in line and "cosine" in line and "8 minibatches" in line for line in lines)
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
    expert slot differs under the policy; one and two real updates (with the length penalty's learning signal) move
    the trainer far off the rollout engine."""
    cold = ["cold_start.steps=40", "cold_start.batch_size=16", "train.eval_prompts=16"]
    sets = [
        *ENGINES,
        *cold,
        f"cold_start.output_dir={tmp_path / 'cold'}",
        f"output_dir={tmp_path / 'run'}",
        "algorithm.router={name: replay-rollout}",
        SHAPED,
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
    one, two = rows["staleness (k=1)"], rows["staleness (k=2)"]  # real updates move the trainer off the rollout
    assert two["abs_logp_diff"] > one["abs_logp_diff"] > 100 * report["metrics"]["abs_logp_diff"]
    assert one["grad_norm"] > 0 and two["grad_norm"] > 0
    assert (
        one["k"] == 1 and one["explains"] > 0.99 and math.isclose(one["adds"], one["abs_logp_diff"] - one["baseline"])
    )
    assert any(line.startswith("  staleness  |d| mean k=1 ") for line in result.stdout.splitlines())


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


# -- the corrections' policy gradients against the on-policy one (rlzoo.mismatch.gradients) ------------------------


class ToyLearner:
    """A policy whose log-probs are linear in its parameters: ``logp[b, t] = base[b, t] + x[b, t] . theta`` at
    ``theta = 0``, so each token's gradient is ``x[b, t]`` and every gradient below can be written by hand."""

    def __init__(self, base: torch.Tensor, x: torch.Tensor) -> None:
        self.base, self.x = base, x

    def gradients(self, batch, rows, request):
        theta = torch.zeros(self.x.shape[-1], dtype=torch.float64, requires_grad=True)
        logp = self.base[rows] + self.x[rows] @ theta
        out = []
        for loss_fn in request.loss_fns:
            (grad,) = torch.autograd.grad(loss_fn(logp)[0], theta, retain_graph=True)
            out.append(request.project([grad]))
        return out


def _toy_gradients(train, rollout, advantages, corrections, x, minibatches=2, old_logprobs="train", algorithm=None):
    """Every estimator's minibatch gradients of the toy policy (the identity as projection: exact vectors)."""
    from types import SimpleNamespace

    import rlzoo
    from rlzoo.mismatch.gradients import batch_gradients, estimators, gradient_effects
    from rlzoo.rl.step_record import OldLogprobs

    mask = torch.ones_like(train)
    record = SimpleNamespace(
        step=0,
        batch=SimpleNamespace(response_mask=mask),
        advantages=advantages,
        old=OldLogprobs(train, train, None, rollout, None, torch.ones_like(train)),
    )
    config = SimpleNamespace(
        seed=0, algorithm=SimpleNamespace(minibatches_per_rollout=minibatches, old_logprobs=old_logprobs)
    )
    objective = rlzoo.build_objective(algorithm or {"preset": "grpo", "kl_coef": 0.0})
    c = SimpleNamespace(objective=objective, learner=ToyLearner(train, x))
    inputs = estimators(record, config, corrections)
    vectors = batch_gradients(record, c, config, inputs, lambda grads: grads[0].detach().clone())
    return vectors, gradient_effects(vectors)


def test_identical_log_probs_every_correction_is_the_on_policy_gradient():
    """No mismatch: every registered correction weighs 1 and keeps every token, so its gradient is the on-policy
    one on every minibatch: bias 0, cosine 1, and the on-policy gradient's own variance."""
    import rlzoo
    from rlzoo.mismatch.corrections import build_corrections
    from rlzoo.mismatch.gradients import REFERENCE

    g = torch.Generator().manual_seed(0)
    train = -torch.rand(8, 3, generator=g, dtype=torch.float64) - 0.1
    advantages = torch.randn(8, 1, generator=g, dtype=torch.float64).expand(8, 3).contiguous()
    x = torch.randn(8, 3, 5, generator=g, dtype=torch.float64)
    built, _ = build_corrections(rlzoo.default_registry(), rlzoo.config.base.SPECS["correction"](name="none"))
    vectors, effects = _toy_gradients(train, train.clone(), advantages, built, x, minibatches=4)
    assert set(effects) == {REFERENCE, *built} and len(vectors[REFERENCE]) == 4
    reference = effects[REFERENCE]
    assert reference["bias"] == 0.0 and reference["grad_var"] > 0
    for name, e in effects.items():
        assert e["bias"] == 0.0 and e["bias_noise"] == 0.0, name
        assert math.isclose(e["cosine"], 1.0, rel_tol=1e-12), name
        assert math.isclose(e["grad_var"], reference["grad_var"], rel_tol=1e-12) and e["mse"] == e["grad_var"], name


def test_exact_importance_weights_remove_the_bias_of_ignoring_the_mismatch():
    """One-token responses (a response's exact weight is its token's ratio) and a per-token GRPO loss at ratio 1:
    the on-policy gradient is ``-mean_i rho_i A_i x_i``, ``none``'s ``-mean_i A_i x_i`` (bias
    ``||sum (1 - rho_i) A_i x_i|| / ||sum rho_i A_i x_i||``); token TIS without a cap weighs each response by
    ``rho_i`` (bias 0), TIS capped at 2 by ``min(rho_i, 2)`` (the bias of the one capped response)."""
    import rlzoo

    registry = rlzoo.default_registry()
    train = torch.log(torch.tensor([[0.5], [0.2], [0.6], [0.3]], dtype=torch.float64))
    rollout = torch.log(torch.tensor([[0.4], [0.4], [0.2], [0.3]], dtype=torch.float64))  # rho = 1.25, .5, 3, 1
    advantages = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]], dtype=torch.float64)
    x = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]], [[2.0, -1.0]]], dtype=torch.float64)
    corrections = {
        "none": registry.create("correction", "none"),
        "tis": registry.create("correction", "tis", {"threshold": 1e6}),
        "tis-2": registry.create("correction", "tis", {"threshold": 2.0}),
    }
    _, effects = _toy_gradients(train, rollout, advantages, corrections, x)
    rho = torch.exp(train - rollout)[:, 0]
    ax = advantages[:, 0, None] * x[:, 0]  # [4, 2]: A_i x_i
    on_policy = -(rho[:, None] * ax).mean(0)
    for name, w in (("none", torch.ones(4)), ("tis", rho), ("tis-2", rho.clamp(max=2.0))):
        expected = (-(w.double()[:, None] * ax).mean(0) - on_policy).norm() / on_policy.norm()
        assert math.isclose(effects[name]["bias"], expected.item(), rel_tol=1e-9, abs_tol=1e-12), name
    assert effects["tis"]["bias"] < 1e-12 < effects["tis-2"]["bias"] < effects["none"]["bias"]
    assert effects["tis"]["bias_noise"] < 1e-12 < effects["none"]["bias_noise"]
    assert effects["none"]["cosine"] < effects["tis-2"]["cosine"] < 1.0
    assert math.isclose(effects["tis"]["cosine"], 1.0, rel_tol=1e-12)


def test_gradient_effects_by_hand():
    from rlzoo.mismatch.gradients import REFERENCE, gradient_effects

    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731 - four uses
    reference = [t(1.0, 0.0), t(3.0, 0.0)]  # mean (2, 0): G = 2; spread 2 -> var 2 / 4
    other = [t(2.0, 1.0), t(2.0, 1.0)]  # mean (2, 1), no spread
    effects = gradient_effects({REFERENCE: reference, "other": other})
    assert effects[REFERENCE] == {"bias": 0.0, "bias_noise": 0.0, "grad_var": 0.5, "cosine": 1.0, "mse": 0.5}
    assert math.isclose(effects["other"]["bias"], 0.5) and effects["other"]["grad_var"] == 0.0
    # the paired differences (1, 1), (-1, 1): their mean (0, 1) is the bias, their spread (+-1, 0) its noise
    assert math.isclose(effects["other"]["bias_noise"], math.sqrt(2 / 2) / 2)
    assert math.isclose(effects["other"]["cosine"], 2 / math.sqrt(5)) and math.isclose(effects["other"]["mse"], 0.25)
    run = gradient_effects({REFERENCE: reference, "other": other}, horizon=10)  # the mean of 10 steps' gradients
    assert run[REFERENCE]["mse"] == 0.05 and math.isclose(run["other"]["mse"], 0.25)
    one = gradient_effects({REFERENCE: reference[:1], "other": other[:1]})  # one minibatch: no variance
    assert math.isnan(one["other"]["grad_var"]) and math.isnan(one["other"]["mse"])
    zero = gradient_effects({REFERENCE: [torch.zeros(2)] * 2})  # no gradient (all advantages 0): nothing to compare
    assert all(math.isnan(v) for v in zero[REFERENCE].values())


def test_count_sketch_is_a_fixed_linear_map_that_keeps_inner_products():
    from rlzoo.mismatch.gradients import CountSketch

    g = torch.Generator().manual_seed(3)
    a = [torch.randn(300, 200, generator=g), None, torch.randn(5000, generator=g)]
    b = [torch.randn(300, 200, generator=g), None, torch.randn(5000, generator=g)]
    sketch = CountSketch(seed=7, dim=2**14)
    sa, sb = sketch(a), sketch(b)
    assert sketch.parameters == 65_000 and sa.shape == (2**14,)
    assert torch.allclose(sketch([x + y if x is not None else None for x, y in zip(a, b)]), sa + sb, atol=1e-4)
    assert torch.equal(CountSketch(seed=7, dim=2**14)(a), sa) and not torch.equal(CountSketch(seed=8, dim=2**14)(a), sa)
    flat = lambda v: torch.cat([t.reshape(-1) for t in v if t is not None])  # noqa: E731 - two uses
    for u, v in ((a, a), (a, b), (b, b)):
        exact = (flat(u) @ flat(v)).item()
        assert abs((sketch(u) @ sketch(v)).item() - exact) < 0.05 * flat(u).norm() * flat(v).norm()


def test_the_rule_with_gradients_picks_the_lowest_error_and_none_among_equals():
    from rlzoo.mismatch.corrections import MSE_TIE, recommend

    def effect(mse, bias=0.0, ess=1.0):
        return {
            "kept": 1.0,
            "ess": ess,
            "residual": 0.1,
            "bias": bias,
            "grad_var": mse - bias**2,
            "cosine": 1.0,
            "mse": mse,
        }

    effects = {"none": effect(1.2, bias=0.3), "tis": effect(1.0, bias=0.01), "icepop": effect(1.005, bias=0.02)}
    assert MSE_TIE == 0.01
    pick = recommend(effects, 0.05)
    assert pick["name"] == "tis" and "lowest gradient MSE" in pick["rule"]  # icepop within 1%, tis the smaller bias
    assert pick["reason"].startswith("gradient MSE 1 (bias 0.01, variance 1, cosine 1.0000) at ESS 1.000")
    assert recommend({**effects, "none": effect(1.009)}, 0.05)["name"] == "none"  # within 1%: no correction pays
    assert recommend({**effects, "tis": effect(0.5, ess=0.5)}, 0.05)["name"] == "icepop"  # below the ESS floor
    no_grads = {n: {k: v for k, v in e.items() if k != "mse"} for n, e in effects.items()}
    assert "smallest residual" in recommend(no_grads, 0.05)["rule"]


def test_staleness_scores_the_batches_after_real_updates_and_saves_nothing(runs, monkeypatch):
    """``Asked.stale``: after the measured batches, k = 1, 2 real updates of the example's GSPO on the next steps'
    batches; the measured rows scored again by the updated trainer are k versions of staleness away from the rollout
    engine, whose weights are never synced; no weight file is written and the cold start is left as it was."""
    import hashlib

    import rlzoo
    from rlzoo.config.resolution import load_config
    from rlzoo.engines.hf_rollout import HFRolloutEngine
    from rlzoo.mismatch.causes import staleness_rows
    from rlzoo.mismatch.report import build_result, markdown, summary
    from rlzoo.mismatch.session import Asked, measure_config, measurement_config

    root = runs["root"]

    def digest():
        files = sorted(p for p in (root / "cold").rglob("*") if p.is_file())
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}

    before = digest()
    synced = []
    monkeypatch.setattr(HFRolloutEngine, "sync_weights", lambda self, weights: synced.append(1))
    registry = rlzoo.default_registry()
    out = root / "stale"
    config = measurement_config(load_config(CONFIG, _overrides(root), registry), out)
    measured = measure_config(config, registry, 2, asked=Asked(stale=(1, 2)))
    assert set(measured.stale) == {1, 2} and all(t.shape == measured.train.shape for t in measured.stale.values())
    g0 = gap_metrics(measured.train, measured.rollout, measured.mask)["abs_logp_diff"]
    g1, g2 = (gap_metrics(measured.stale[k], measured.rollout, measured.mask)["abs_logp_diff"] for k in (1, 2))
    assert g2 > g1 > 100 * g0, (g0, g1, g2)
    assert set(measured.stale_grad_norm) == {1, 2} and min(measured.stale_grad_norm.values()) > 0
    assert synced == [] and digest() == before
    assert not [p for p in out.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt")]
    rows = staleness_rows(measured)
    assert [(r["cause"], r["k"]) for r in rows] == [("staleness (k=1)", 1), ("staleness (k=2)", 2)]
    assert math.isclose(rows[0]["abs_logp_diff"], g1) and math.isclose(rows[1]["adds"], g2 - g0)
    engines = {"rollout": "hf", "rollout_dtype": "float32", "trainer": "torch", "trainer_dtype": "float32"}
    result = build_result(measured, {}, {"config": CONFIG, "engines": engines, "causes": rows})
    assert "| staleness (k=2) | the trainer 2 updates ahead" in markdown(result)
    assert f"  staleness  |d| mean k=1 {g1:.3g} (adds {g1 - g0:+.3g}), k=2 {g2:.3g}" in summary(result)[-2]
