"""rlzoo's components against verl's own functions, on the float64 data of scripts/record_reference.py.

Loss, gradient w.r.t. the log-probs and clip fraction agree to 1e-6 (absolute) wherever both define the quantity
the same way; each exception is named in the case table with its reason.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from estimators_testlib import REGISTRY, create, t

from rlzoo.interfaces import RewardBatch
from rlzoo.rl.objective import Objective

DATA = json.loads((pathlib.Path(__file__).parent / "reference" / "verl.json").read_text())
TOL = 1e-6
PPO = {"name": "ppo", "eps_low": 0.2, "eps_high": 0.28}

# verl case id -> rlzoo (ratio, clipper spec, aggregation), and how verl's clip fraction reads in rlzoo's metrics
POLICY = {
    "vanilla-token-mean": ("token", PPO, "token-mean"),
    "vanilla-seq-mean-token-mean": ("token", PPO, "seq-mean-token-mean"),
    "vanilla-seq-mean-token-sum": ("token", PPO, "seq-mean-token-sum"),
    "vanilla-seq-mean-token-sum-norm": ("token", PPO, "seq-mean-token-sum-norm"),
    "vanilla-dual-clip": ("token", {**PPO, "name": "dual-clip", "c": 3.0}, "token-mean"),
    "gspo": ("sequence-token", {"name": "ppo", "eps_low": 3e-4, "eps_high": 4e-4}, "seq-mean-token-mean"),
    "cispo": ("token", {"name": "cispo", "eps_low": 1.0, "eps_high": 0.3}, "token-mean"),
    "sapo": ("token", {"name": "sapo", "tau_pos": 1.0, "tau_neg": 1.05}, "seq-mean-token-mean"),
    "gpg": ("gpg", {"name": "none"}, "token-mean"),
    "geo_mean": ("token", {"name": "gmpo", "eps_low": 0.4, "eps_high": 0.4}, "seq-mean-token-mean"),
    "kl_cov": ("token", {"name": "kl-cov", "select_fraction": 0.1, "kl_coef": 1.0}, "token-mean"),
    "clip_cov": (
        "token",
        {**PPO, "name": "clip-cov", "select_fraction": 0.5, "lb": 0.2, "ub": 5.0},
        "token-mean",
    ),
}
# the loss value of a ratio-form implementation differs from verl's by a gradient-free term (design §6)
VALUE_DIFFERS = {"cispo", "gpg"}


def clip_fraction_pairs(case_id: str, out: dict, metrics: dict) -> list[tuple[float, float]]:
    """(rlzoo, verl) pairs of the clip fractions both define the same way."""
    if case_id == "vanilla-dual-clip":  # verl splits PPO-clipped and dual-clip-held tokens; rlzoo counts both
        return [(metrics["clip/fraction"], out["pg_clipfrac"] + out["pg_clipfrac_lower"])]
    if case_id == "clip_cov":  # verl's clip fraction for clip_cov is the share of tokens it detached
        return [(metrics["clip/cov_fraction"], out["pg_clipfrac"])]
    if case_id == "geo_mean":
        # verl counts every token whose log-ratio left [-eps_low, eps_high] (split by the sign of A); rlzoo counts
        # only those whose gradient the clip removed, a subset
        ours, verl_any = metrics["clip/fraction"], out["pg_clipfrac"] + out["pg_clipfrac_lower"]
        return [(min(ours, verl_any), ours)]
    if case_id in {"gpg", "kl_cov"}:  # verl reports none; rlzoo's is 0 (no clip)
        return [(metrics["clip/fraction"], 0.0)]
    return [(metrics["clip/fraction"], out["pg_clipfrac"] + out.get("pg_clipfrac_lower", 0.0))]


def test_every_recorded_case_is_checked():
    assert DATA["source"] == "verl 0.9.1"
    assert {c["id"] for c in DATA["policy_losses"]} == set(POLICY)
    assert {c["id"] for c in DATA["advantages"]} == set(ADVANTAGE)
    assert {c["id"] for c in DATA["kl"]} == set(KL)
    assert {c["id"] for c in DATA["corrections"]} == set(CORRECTION)
    assert {c["id"] for c in DATA["gae"]} == set(GAE)
    assert {c["id"] for c in DATA["value_losses"]} == set(VALUE_LOSS)
    assert {c["id"] for c in DATA["kl_controllers"]} == set(KL_CONTROLLER)


@pytest.mark.parametrize("case", DATA["policy_losses"], ids=lambda c: c["id"])
def test_policy_loss_matches_verl(case):
    ratio, clipper, aggregation = POLICY[case["id"]]
    clipper = dict(clipper)
    objective = Objective(
        ratio=create("ratio", ratio),
        clipper=REGISTRY.create("clipper", clipper.pop("name"), clipper),
        aggregation=create("aggregation", aggregation),
        kl=create("kl", "k3"),
    )
    x = case["inputs"]
    logp = t(x["logp"]).requires_grad_()
    loss, metrics = objective(logp, t(x["old_logp"]), t(x["advantages"]), t(x["mask"]))
    loss.backward()
    out = case["outputs"]
    torch.testing.assert_close(logp.grad, t(out["grad"]), rtol=0, atol=TOL)
    if case["id"] not in VALUE_DIFFERS:
        assert loss.item() == pytest.approx(out["loss"], abs=TOL)
    for ours, theirs in clip_fraction_pairs(case["id"], out, metrics):
        assert ours == pytest.approx(theirs, abs=TOL)


def test_gspo_sequence_ratio_matches_verl_too():
    # with one advantage per response, the sequence ratio (GSPO) and the sequence-token ratio agree
    case = next(c for c in DATA["policy_losses"] if c["id"] == "gspo")
    objective = Objective(
        ratio=create("ratio", "sequence"),
        clipper=create("clipper", "ppo", eps_low=3e-4, eps_high=4e-4),
        aggregation=create("aggregation", "seq-mean-token-mean"),
        kl=create("kl", "k3"),
    )
    x = case["inputs"]
    logp = t(x["logp"]).requires_grad_()
    loss, metrics = objective(logp, t(x["old_logp"]), t(x["advantages"]), t(x["mask"]))
    loss.backward()
    assert loss.item() == pytest.approx(case["outputs"]["loss"], abs=TOL)
    torch.testing.assert_close(logp.grad, t(case["outputs"]["grad"]), rtol=0, atol=TOL)
    assert metrics["clip/fraction"] == pytest.approx(case["outputs"]["pg_clipfrac"], abs=TOL)


ADVANTAGE = {
    "grpo-0": ("group", {"std_normalize": True}),
    "grpo-1": ("group", {"std_normalize": False}),
    "rloo-2": ("rloo", {}),
    "reinforce_plus_plus-3": ("reinforce++", {"gamma": 1.0}),
    "reinforce_plus_plus-4": ("reinforce++", {"gamma": 0.9}),
    "reinforce_plus_plus_baseline-5": ("reinforce++-baseline", {}),
    "opo-6": ("opo", {}),
    "gpg-7": ("gpg", {}),
}


@pytest.mark.parametrize("case", DATA["advantages"], ids=lambda c: c["id"])
def test_advantage_matches_verl(case):
    name, params = ADVANTAGE[case["id"]]
    x = case["inputs"]
    batch = RewardBatch(t(x["rewards"]), torch.tensor(x["group_index"]), t(x["mask"]))
    adv = create("advantage", name, **params).compute(batch)
    torch.testing.assert_close(adv, t(case["outputs"]["advantages"]), rtol=0, atol=TOL)


KL = {"kl-k1": "k1", "kl-k2": "k2", "kl-low_var_kl": "k3"}


@pytest.mark.parametrize("case", DATA["kl"], ids=lambda c: c["id"])
def test_kl_matches_verl(case):
    # verl clamps k3 to [-10, 10]; the recorded inputs stay inside, where both are the same formula
    x = case["inputs"]
    kl = create("kl", KL[case["id"]]).estimate(t(x["logp"]), t(x["ref_logp"]))
    torch.testing.assert_close(kl, t(case["outputs"]["kl"]), rtol=0, atol=TOL)


CORRECTION = {
    "rollout_is-token-2.0": ("tis", {"level": "token", "threshold": 2.0}),
    "rollout_is-token-0.5_5.0": ("icepop", {"level": "token", "low": 0.5, "high": 5.0}),
    "rollout_is-sequence-2.0": ("tis", {"level": "sequence", "threshold": 2.0}),
    "rollout_is-sequence-0.5_5.0": ("icepop", {"level": "sequence", "low": 0.5, "high": 5.0}),
}


@pytest.mark.parametrize("case", DATA["corrections"], ids=lambda c: c["id"])
def test_correction_matches_verl(case):
    name, params = CORRECTION[case["id"]]
    x = case["inputs"]
    weights = create("correction", name, **params).weights(t(x["old_train"]), t(x["old_rollout"]), t(x["mask"]))
    expected = t(case["outputs"]["weights"])
    torch.testing.assert_close(weights, expected, rtol=TOL, atol=TOL)
    valid = t(x["mask"]) > 0
    changed = (expected[valid] == 0) if name == "icepop" else (expected[valid] == params["threshold"])
    assert changed.any() and not changed.all(), "the case must keep some weights and drop or cap others"


GAE = {
    "gae-1.0-1.0": {"gamma": 1.0, "lam": 1.0},
    "gae-0.99-0.95": {"gamma": 0.99, "lam": 0.95},
    "gae-0.9-0.0": {"gamma": 0.9, "lam": 0.0},
    "gae-0.8-0.5": {"gamma": 0.8, "lam": 0.5},
}


@pytest.mark.parametrize("whiten", [True, False], ids=["whiten", "raw"])
@pytest.mark.parametrize("case", DATA["gae"], ids=lambda c: c["id"])
def test_gae_matches_verl(case, whiten):
    # compared on valid tokens only: in a hole verl leaves the next valid token's advantage (and whitens the
    # padding too), where rlzoo's advantages and returns are 0
    x = case["inputs"]
    mask, values = t(x["mask"]), t(x["values"])
    batch = RewardBatch(
        torch.zeros(len(mask)), torch.arange(len(mask)), mask, token_rewards=t(x["token_rewards"]), values=values
    )
    adv, returns = create("advantage", "gae", whiten=whiten, **GAE[case["id"]]).advantages_and_returns(batch)
    valid = mask > 0
    verl_returns = t(case["outputs"]["returns"])
    # verl's advantages are always whitened; its raw GAE advantage is its return minus the value
    expected = t(case["outputs"]["advantages"]) if whiten else verl_returns - values
    torch.testing.assert_close(adv[valid], expected[valid], rtol=0, atol=TOL)
    torch.testing.assert_close(returns[valid], verl_returns[valid], rtol=0, atol=TOL)
    assert (adv[~valid] == 0).all() and (returns[~valid] == 0).all()
    # the data has holes inside responses, where a recursion that did not skip them would differ
    inner_hole = [row.nonzero().flatten() for row in valid]
    assert any(len(i) and not valid[r, i[0] : i[-1] + 1].all() for r, i in enumerate(inner_hole))


VALUE_LOSS = {
    "value_loss-0.2-token-mean": ("clipped", {"clip_range": 0.2}, "token-mean"),
    "value_loss-0.5-token-mean": ("clipped", {"clip_range": 0.5}, "token-mean"),
    "value_loss-1000000000.0-token-mean": ("unclipped", {}, "token-mean"),
    "value_loss-0.2-seq-mean-token-mean": ("clipped", {"clip_range": 0.2}, "seq-mean-token-mean"),
}


@pytest.mark.parametrize("case", DATA["value_losses"], ids=lambda c: c["id"])
def test_value_loss_matches_verl(case):
    # verl's vf_loss is the aggregation of rlzoo's per-token loss, its vf_clipfrac the masked mean of `clipped`
    name, params, aggregation = VALUE_LOSS[case["id"]]
    x = case["inputs"]
    mask = t(x["mask"])
    vpreds = t(x["vpreds"]).requires_grad_()
    result = create("value_loss", name, **params).loss(vpreds, t(x["values"]), t(x["returns"]), mask)
    loss = create("aggregation", aggregation).aggregate(result.per_token, mask)
    loss.backward()
    out = case["outputs"]
    assert loss.item() == pytest.approx(out["vf_loss"], abs=TOL)
    torch.testing.assert_close(vpreds.grad, t(out["grad"]), rtol=0, atol=TOL)
    clipfrac = (result.clipped & (mask > 0)).sum().item() / (mask > 0).sum().item()
    assert clipfrac == pytest.approx(out["vf_clipfrac"], abs=TOL)


KL_CONTROLLER = {
    "kl_ctrl-fixed-0": ("fixed", {"coef": 0.001}),
    "kl_ctrl-adaptive-1": ("adaptive", {"coef": 0.001, "target": 0.1, "horizon": 10000}),
    "kl_ctrl-adaptive-2": ("adaptive", {"coef": 0.05, "target": 0.2, "horizon": 500}),
}


@pytest.mark.parametrize("case", DATA["kl_controllers"], ids=lambda c: c["id"])
def test_kl_controller_matches_verl(case):
    name, params = KL_CONTROLLER[case["id"]]
    controller = create("kl_controller", name, **params)
    coefs = []
    for current_kl, n_steps in case["inputs"]["updates"]:
        controller.update(current_kl, n_steps)
        coefs.append(controller.coef)
    assert coefs == pytest.approx(case["outputs"]["coefs"], rel=TOL, abs=1e-12)
