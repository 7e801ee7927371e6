"""The 2026 zoo against its references' own functions, on the float64 data of scripts/record_reference.py
(``record_2026``: verl 0.9.1's ``dppo_tv``, ``dppo_kl``, ``dro``, ``remax``, ``grpo_passk``, ``gdpo``,
``optimal_token_baseline`` and ``tir_optimal_token_baseline``; TRL 1.16.0's VESPO weights).

Checked to 1e-6 (absolute): gradients w.r.t. the log-probs, advantages, the masks (the tokens a trust region drops
are those verl gives no gradient), clip fractions and VESPO's weights. Loss values: rlzoo computes DPPO, DRO and
VESPO in ratio form, whose value differs from the reference's by a term without gradient; each test checks the value
against that term worked out from the reference's own outputs (verl's gradient for DPPO's mask, TRL's weights for
VESPO, the inputs for DRO). Every function here is in an installable version, so nothing is re-derived from a paper;
the VESPO loss around TRL's ``get_gamma_weights`` is TRL's formula (``-phi * A * logp`` over the valid tokens), since
TRL computes it inline in ``GRPOTrainer._compute_loss``, which needs a model.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from estimators_testlib import REGISTRY, create, t

from rlzoo.interfaces import PolicyBatch, RewardBatch
from rlzoo.rl.objective import Objective
from rlzoo_estimators.clippers.vespo import gamma_weights

DATA = json.loads((pathlib.Path(__file__).parent / "reference" / "verl_2026.json").read_text())
TOL = 1e-6

# verl case id -> rlzoo (clipper spec, aggregation); the token ratio throughout, as verl's
POLICY = {
    "dppo_tv-token-mean": ({"name": "dppo-tv", "eps_low": 0.15, "eps_high": 0.15, "c": 1.5}, "token-mean"),
    "dppo_tv-asym-seq-mean-token-sum-norm": (
        {"name": "dppo-tv", "eps_low": 0.05, "eps_high": 0.2, "c": 20.0},
        "seq-mean-token-sum-norm",
    ),
    "dppo_kl-token-mean": ({"name": "dppo-kl", "eps_low": 0.05, "eps_high": 0.05, "c": 1.5}, "token-mean"),
    "dppo_kl-asym-seq-mean-token-mean": (
        {"name": "dppo-kl", "eps_low": 0.02, "eps_high": 0.08, "c": 20.0},
        "seq-mean-token-mean",
    ),
    "dro-token-mean": ({"name": "dro", "beta": 0.1}, "token-mean"),
    "dro-seq-mean-token-sum": ({"name": "dro", "beta": 0.5}, "seq-mean-token-sum"),
}
VESPO = {"vespo-0": {}, "vespo-1": {"k_pos": 1.0, "lambda_pos": 1.5, "k_neg": 4.0, "lambda_neg": 3.0}}
ADVANTAGE = {
    "remax": ("remax", {}),
    "grpo_passk-0": ("grpo-passk", {"std_normalize": True}),
    "grpo_passk-1": ("grpo-passk", {"std_normalize": False}),
    "grpo_passk-2": ("grpo-passk", {"std_normalize": True}),
    "gdpo-0": ("gdpo", {"std_normalize": True}),
    "gdpo-1": ("gdpo", {"std_normalize": False}),
    **{
        f"{verl}-{data}-{tail}": (name, {"zero_tail": tail})
        for verl, name in [
            ("optimal_token_baseline", "optimal-token-baseline"),
            ("tir_optimal_token_baseline", "tir-optimal-token-baseline"),
        ]
        for data in ["aligned", "holes"]
        for tail in [True, False]
    },
}


def test_every_recorded_case_is_checked():
    assert DATA["source"] == "verl 0.9.1, trl 1.16.0"
    assert {c["id"] for c in DATA["policy_losses"]} == set(POLICY)
    assert {c["id"] for c in DATA["vespo"]} == set(VESPO)
    assert {c["id"] for c in DATA["advantages"]} == set(ADVANTAGE)


def objective(clipper: dict, aggregation: str, ratio: str = "token") -> Objective:
    clipper = dict(clipper)
    return Objective(
        ratio=create("ratio", ratio),
        clipper=REGISTRY.create("clipper", clipper.pop("name"), clipper),
        aggregation=create("aggregation", aggregation),
        kl=create("kl", "k3"),
    )


def inputs(case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x = case["inputs"]
    return t(x["logp"]), t(x["old_logp"]), t(x["advantages"]), t(x["mask"])


@pytest.mark.parametrize("case", DATA["policy_losses"], ids=lambda c: c["id"])
def test_policy_loss_matches_verl(case):
    spec, aggregation = POLICY[case["id"]]
    logp, old, adv, mask = inputs(case)
    x = logp.clone().requires_grad_()
    loss, metrics = objective(spec, aggregation)(x, old, adv, mask)
    loss.backward()
    out = case["outputs"]
    verl_grad = t(out["grad"])
    torch.testing.assert_close(x.grad, verl_grad, rtol=0, atol=TOL)
    agg = create("aggregation", aggregation)
    keep = mask > 0
    if spec["name"] == "dro":  # ours: -(A log rho - ...) = verl's -(A logp - ...) + A * old_logp
        shift = agg.aggregate(torch.where(keep, adv * old, torch.zeros_like(old)), mask)
        assert loss.item() == pytest.approx(out["loss"] + shift.item(), abs=TOL)
        assert metrics["clip/fraction"] == 0.0
        return
    # DPPO: the tokens verl keeps are exactly those it gives a gradient (every valid token has A != 0 here)
    assert (adv[keep] != 0).all()
    verl_keeps = (verl_grad != 0) & keep
    result = REGISTRY.create("clipper", spec["name"], {k: v for k, v in spec.items() if k != "name"}).clip_batch(
        PolicyBatch(torch.exp(logp - old), logp - old, adv, mask, logp, old, torch.Generator())
    )
    dropped = (result.clipped_low | result.clipped_high) & keep
    assert torch.equal(dropped, keep & ~verl_keeps)
    assert torch.equal(result.clipped_high & keep, dropped & (adv > 0))
    assert metrics["clip/fraction"] == pytest.approx(out["pg_clipfrac"], abs=TOL)
    assert metrics["clip/truncated_fraction"] == pytest.approx(out["pg_clipfrac_lower"], abs=TOL)
    # the value: -A * min(rho, c) on the tokens verl keeps, aggregated
    weight = torch.exp(logp - old).clamp(max=spec["c"])
    expected = agg.aggregate(torch.where(verl_keeps, -adv * weight, torch.zeros_like(adv)), mask)
    assert loss.item() == pytest.approx(expected.item(), abs=TOL)


def test_dppo_cases_exercise_both_sides_and_the_truncation():
    by_id = {c["id"]: c for c in DATA["policy_losses"]}
    for case_id in POLICY:
        if case_id.startswith("dppo"):
            assert 0 < by_id[case_id]["outputs"]["pg_clipfrac"] < 1, case_id
    for case_id in ("dppo_tv-token-mean", "dppo_kl-token-mean"):  # c = 1.5
        assert by_id[case_id]["outputs"]["pg_clipfrac_lower"] > 0, case_id


@pytest.mark.parametrize("case", DATA["vespo"], ids=lambda c: c["id"])
def test_vespo_matches_trl(case):
    params = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0, **VESPO[case["id"]]}
    logp, old, adv, mask = inputs(case)
    phi = gamma_weights(
        logp - old, adv, mask, (params["k_pos"], params["k_neg"]), (params["lambda_pos"], params["lambda_neg"])
    )
    trl_phi = t(case["outputs"]["phi"]).unsqueeze(-1).expand_as(phi)
    keep = mask > 0
    torch.testing.assert_close(phi[keep], trl_phi[keep], rtol=0, atol=TOL)
    assert (trl_phi[keep] - 1.0).abs().max() > 0.1  # off-policy enough that the weights matter

    x = logp.clone().requires_grad_()
    loss, metrics = objective({"name": "vespo", **params}, "token-mean")(x, old, adv, mask)
    loss.backward()
    torch.testing.assert_close(x.grad, t(case["outputs"]["grad"]), rtol=0, atol=TOL)
    expected = torch.where(keep, -trl_phi * adv, torch.zeros_like(adv)).sum() / mask.sum()  # ratio form: -phi * A
    assert loss.item() == pytest.approx(expected.item(), abs=TOL)
    assert metrics["clip/fraction"] == 0.0


def reward_batch(case) -> RewardBatch:
    x = case["inputs"]
    mask = t(x["mask"])
    optional = {
        "token_rewards": t(x["token_rewards"]) if "token_rewards" in x else None,
        "reward_baselines": t(x["reward_baselines"]) if "reward_baselines" in x else None,
        "old_logprobs": t(x["old_logprobs"]) if "old_logprobs" in x else None,
        "token_stats": {"sum_pi_squared": t(x["sum_pi_squared"])} if "sum_pi_squared" in x else {},
        "reward_parts": {k: t(v) for k, v in x["parts"].items()} if "parts" in x else None,
    }
    rewards = t(x["rewards"]) if "rewards" in x else torch.zeros(len(mask), dtype=torch.float64)
    return RewardBatch(rewards, torch.tensor(x["group_index"]), mask, **optional)


@pytest.mark.parametrize("case", DATA["advantages"], ids=lambda c: c["id"])
def test_advantage_matches_verl(case):
    name, params = ADVANTAGE[case["id"]]
    if name == "gdpo":
        verl = case["verl"]["params"]
        params = {
            **params,
            "parts": verl["gdpo_reward_keys"],
            "weights": dict(zip(verl["gdpo_reward_keys"], verl["gdpo_reward_weights"], strict=True)),
        }
    batch = reward_batch(case)
    adv = create("advantage", name, **params).compute(batch)
    expected = t(case["outputs"]["advantages"])
    keep = batch.mask > 0
    torch.testing.assert_close(adv[keep], expected[keep], rtol=0, atol=TOL)
    assert (adv[~keep] == 0).all()
    assert adv[keep].abs().max() > 0.1  # a case with all-zero advantages would prove nothing


def test_the_baseline_cases_exercise_the_zero_tail_groups_of_one_and_holes():
    by_id = {c["id"]: c for c in DATA["advantages"]}
    for verl in ["optimal_token_baseline", "tir_optimal_token_baseline"]:
        for data in ["aligned", "holes"]:
            with_tail, without = (t(by_id[f"{verl}-{data}-{tail}"]["outputs"]["advantages"]) for tail in (True, False))
            assert not torch.equal(with_tail, without), (verl, data)
    holes = t(by_id["optimal_token_baseline-holes-True"]["inputs"]["mask"]) > 0
    assert any(
        len(i) and not holes[r, i[0] : i[-1] + 1].all() for r, i in enumerate(r.nonzero().flatten() for r in holes)
    )
    # on responses with holes, counting positions by policy token differs from counting columns
    column, token = (
        t(by_id[f"{v}-holes-True"]["outputs"]["advantages"])
        for v in ["optimal_token_baseline", "tir_optimal_token_baseline"]
    )
    assert not torch.allclose(column, token)
    # a group of one gets no baseline: its advantage is its reward-to-go
    aligned = by_id["optimal_token_baseline-aligned-True"]
    last = len(aligned["inputs"]["group_index"]) - 1
    assert aligned["inputs"]["group_index"].count(aligned["inputs"]["group_index"][last]) == 1
    assert aligned["outputs"]["advantages"][last] == aligned["outputs"]["returns"][last]


def test_passk_ties_credit_nobody():
    case = next(c for c in DATA["advantages"] if c["id"] == "grpo_passk-2")
    rewards = case["inputs"]["rewards"][:4]
    assert sorted(rewards)[-1] == sorted(rewards)[-2]  # group 0: two best responses tie
    assert all(row[0] == 0 for row in case["outputs"]["advantages"][:4])
