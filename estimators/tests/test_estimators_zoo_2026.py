"""The 2026 zoo: dppo-tv, dppo-kl, dro, vespo; remax, grpo-passk, gdpo, (tir-)optimal-token-baseline -- hand values,
properties, composition with every ratio and aggregation, padding, and parameter ranges. (Against verl and TRL:
test_estimators_reference_2026.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import REGISTRY, create, floats, t
from hypothesis import given, settings
from test_estimators_zoo_clippers import batches, loss_and_grad, objective

from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import PolicyBatch, RewardBatch

NEW_CLIPPERS = ["dppo-tv", "dppo-kl", "dro", "vespo"]


# --- DPPO ----------------------------------------------------------------------------------------------------


def test_dppo_tv_hand_values():
    # p_old = 0.5 everywhere; p = 0.8 (rose 0.3), 0.55 (rose 0.05), 0.2 (fell 0.3)
    old = [[math.log(0.5)] * 3]
    logp = [[math.log(0.8), math.log(0.55), math.log(0.2)]]
    obj = objective(create("clipper", "dppo-tv", eps_low=0.15, eps_high=0.15, c=1.5), aggregation="seq-mean-token-sum")
    _, metrics, grad = loss_and_grad(obj, logp, old, [[1.0, 1.0, 1.0]], [[1, 1, 1]])
    # A > 0: the token that rose past 0.15 is dropped, the one that rose 0.05 keeps -min(1.1, 1.5); the fallen one too
    assert grad[0].tolist() == pytest.approx([0.0, -1.1, -0.4])
    assert metrics["clip/high_fraction"] == pytest.approx(1 / 3) and metrics["clip/low_fraction"] == 0.0
    _, metrics, grad = loss_and_grad(obj, logp, old, [[-1.0, -1.0, -1.0]], [[1, 1, 1]])
    # A < 0: only the token that fell past 0.15 is dropped; the truncated weight of the first is c = 1.5
    assert grad[0].tolist() == pytest.approx([1.5, 1.1, 0.0])
    assert metrics["clip/low_fraction"] == pytest.approx(1 / 3)
    assert metrics["clip/truncated_fraction"] == pytest.approx(1 / 3)


def test_dppo_kl_hand_values():
    q, p = 0.5, 0.8
    kl = q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
    old, logp = [[math.log(q)] * 2], [[math.log(p), math.log(0.3)]]
    for bound, kept in [(kl * 1.01, True), (kl * 0.99, False)]:
        obj = objective(create("clipper", "dppo-kl", eps_low=0.0, eps_high=bound), aggregation="seq-mean-token-sum")
        _, _, grad = loss_and_grad(obj, logp, old, [[1.0, 1.0]], [[1, 1]])
        # the token that fell is never dropped when A > 0 (it moved against the push), whatever the bound
        assert (grad[0, 0] != 0) == kept and grad[0, 1] == pytest.approx(-0.6)


@settings(max_examples=40, deadline=None)
@given(batches(uniform_advantage=False, delta=2.0, min_length=0))
def test_dppo_without_a_region_is_the_plain_policy_gradient(inputs):
    logp, old, adv, mask = inputs
    inputs = (logp.clamp(max=-1e-3), old, adv, mask)  # log-probabilities: at most 0
    plain = loss_and_grad(objective(create("clipper", "none")), *inputs)
    for name, bounds in [
        ("dppo-tv", {"eps_low": 1.0, "eps_high": 1.0}),
        ("dppo-kl", {"eps_low": 1e9, "eps_high": 1e9}),
    ]:
        obj = objective(create("clipper", name, c=1e9, **bounds))
        loss, metrics, grad = loss_and_grad(obj, *inputs)
        torch.testing.assert_close(grad, plain[2], rtol=1e-9, atol=1e-12)
        assert loss == pytest.approx(plain[0], abs=1e-9) and metrics["clip/fraction"] == 0.0


@settings(max_examples=40, deadline=None)
@given(batches(uniform_advantage=False, delta=2.0), floats(0.0, 0.5), floats(0.0, 0.5), floats(1.0, 3.0))
def test_dppo_flags_mark_exactly_the_tokens_without_gradient(inputs, eps_low, eps_high, c):
    logp, old, adv, mask = inputs
    logp = logp.clamp(max=-1e-3)  # log-probabilities: at most 0
    for name in ["dppo-tv", "dppo-kl"]:
        clipper = create("clipper", name, eps_low=eps_low, eps_high=eps_high, c=c)
        x = t(logp).requires_grad_()
        log_ratio = x - t(old)
        result = clipper.clip_batch(
            PolicyBatch(torch.exp(log_ratio), log_ratio, t(adv), t(mask), x, t(old), torch.Generator())
        )
        (grad,) = torch.autograd.grad(result.loss.sum(), x)
        active = (t(mask) > 0) & (t(adv) != 0)
        flagged = result.clipped_low | result.clipped_high
        assert torch.equal(flagged & active, (grad == 0) & active)
        assert not (result.clipped_low & result.clipped_high).any()


# --- DRO -----------------------------------------------------------------------------------------------------


def test_dro_hand_values_and_on_policy_gradient():
    obj = objective(create("clipper", "dro", beta=0.5), aggregation="seq-mean-token-sum")
    loss, _, grad = loss_and_grad(obj, [[-1.0, -2.0]], [[-1.5, -2.0]], [[2.0, -1.0]], [[1, 1]])
    # token 0: log rho 0.5 -> L = -(2 * 0.5 - 0.25 * 0.25), dL = -(2 - 0.5 * 0.5); token 1: on-policy, dL = 1
    assert loss == pytest.approx(-(1.0 - 0.0625))
    assert grad[0].tolist() == pytest.approx([-1.75, 1.0])


# --- VESPO ---------------------------------------------------------------------------------------------------


def test_vespo_hand_values():
    # one response of two tokens, sequence log-weight 0.3 + 0.2 = 0.5 (a sum, not a mean); A > 0: k 2, lambda 3
    obj = objective(create("clipper", "vespo"), aggregation="seq-mean-token-sum")
    logp, old = [[-1.0, -1.0]], [[-1.3, -1.2]]
    loss, _, grad = loss_and_grad(obj, logp, old, [[1.0, 1.0]], [[1, 1]])
    phi = math.exp(3.0 + 2.0 * 0.5 - 3.0 * math.exp(0.5))
    assert grad[0].tolist() == pytest.approx([-phi, -phi])
    assert loss == pytest.approx(-2 * phi)
    # on-policy the weight is 1: the plain policy gradient
    _, _, grad = loss_and_grad(obj, logp, logp, [[-2.0, -2.0]], [[1, 1]])
    assert grad[0].tolist() == pytest.approx([2.0, 2.0])


# --- every new clipper composes ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW_CLIPPERS)
@pytest.mark.parametrize("ratio", ["token", "sequence", "sequence-token", "gpg"])
@pytest.mark.parametrize(
    "aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_every_ratio_and_aggregation_compose(name, ratio, aggregation):
    g = torch.Generator().manual_seed(3)
    old = -(torch.rand(4, 5, generator=g, dtype=torch.float64) * 3 + 0.1)
    logp = old + torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 5).clone()
    mask = t([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    logp = torch.where(mask > 0, logp, torch.full_like(logp, math.nan))  # padding holds anything
    loss, metrics, grad = loss_and_grad(objective(create("clipper", name), ratio, aggregation), logp, old, adv, mask)
    assert math.isfinite(loss) and torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()
    assert grad.abs().sum() > 0 and all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", NEW_CLIPPERS)
def test_an_all_padding_batch_is_finite(name):
    loss, metrics, grad = loss_and_grad(objective(create("clipper", name)), [[-1.0]], [[-1.0]], [[0.0]], [[0]])
    assert loss == 0.0 and all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    "kind, name, params, field",
    [
        ("clipper", "dppo-tv", {"eps_low": 1.5}, "eps_low"),
        ("clipper", "dppo-tv", {"c": 0.5}, "c"),
        ("clipper", "dppo-kl", {"eps_high": -0.1}, "eps_high"),
        ("clipper", "dro", {"beta": 0.0}, "beta"),
        ("clipper", "vespo", {"lambda_neg": 0.0}, "lambda_neg"),
        ("clipper", "vespo", {"k_pos": -1.0}, "k_pos"),
        ("advantage", "grpo-passk", {"eps": -1.0}, "eps"),
        ("advantage", "gdpo", {"eps": -1.0}, "eps"),
        ("advantage", "gdpo", {"parts": []}, "parts"),
        ("advantage", "gdpo", {"parts": ["a"], "weights": {"b": 2.0}}, "weights: names 'b', which is not in parts"),
        ("advantage", "gdpo", {"weights": {"a": math.inf}}, "weights.a"),
        ("advantage", "optimal-token-baseline", {"eps": -1.0}, "eps"),
    ],
)
def test_params_validation(kind, name, params, field):
    with pytest.raises(ConfigError, match=field):
        REGISTRY.create(kind, name, params)


def test_defaults_are_the_contract():
    assert create("clipper", "dppo-tv").params.model_dump() == {"eps_low": 0.15, "eps_high": 0.15, "c": 20.0}
    assert create("clipper", "dppo-kl").params.model_dump() == {"eps_low": 0.05, "eps_high": 0.05, "c": 20.0}
    assert create("clipper", "dro").params.model_dump() == {"beta": 0.05}
    assert create("clipper", "vespo").params.model_dump() == {
        "k_pos": 2.0,
        "lambda_pos": 3.0,
        "k_neg": 3.0,
        "lambda_neg": 2.0,
    }
    assert create("advantage", "gdpo").params.model_dump() == {
        "parts": None,
        "weights": None,
        "std_normalize": True,
        "eps": 1e-6,
    }
    assert create("advantage", "optimal-token-baseline").params.model_dump() == {
        "zero_tail": True,
        "eps": 1e-8,
        "rollout_is": False,
    }


# --- advantages ----------------------------------------------------------------------------------------------


def batch(rewards, groups, lengths, width=3, **fields) -> RewardBatch:
    mask = t([[1.0 if c < n else 0.0 for c in range(width)] for n in lengths])
    return RewardBatch(t(rewards), torch.tensor(groups), mask, **fields)


def test_remax_hand_values_and_what_it_needs():
    b = batch([1.0, 0.0], [0, 0], [2, 3])
    tokens = t([[0.0, 1.0, 0.0], [0.5, 0.0, -0.5]])
    adv = create("advantage", "remax").compute(
        RewardBatch(b.rewards, b.group_index, b.mask, token_rewards=tokens, reward_baselines=t([0.25, 0.25]))
    )
    torch.testing.assert_close(adv, t([[0.75, 0.75, 0.0], [-0.25, -0.75, -0.75]]))
    with pytest.raises(ValueError, match="RewardBatch.reward_baselines"):
        create("advantage", "remax").compute(RewardBatch(b.rewards, b.group_index, b.mask, token_rewards=tokens))


def test_passk_credits_only_the_best_by_its_margin():
    b = batch([0.2, 0.9, 0.5, 0.1, 3.0], [0, 0, 0, 0, 1], [2, 2, 2, 2, 1])
    adv = create("advantage", "grpo-passk", std_normalize=False).compute(b)
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.4, 0.0, 0.0, 0.0])  # group 1 has one response: 0
    std = t([0.2, 0.9, 0.5, 0.1]).std().item()
    assert create("advantage", "grpo-passk").compute(b)[1, 0].item() == pytest.approx(0.4 / (std + 1e-6))


def parts_batch(parts, groups=(0, 0, 0, 0, 1, 1, 1, 1)):
    n = len(groups)
    return RewardBatch(
        torch.zeros(n), torch.tensor(groups), torch.ones(n, 2), reward_parts={k: t(v) for k, v in parts.items()}
    )


def test_gdpo_normalises_each_part_so_a_wide_one_does_not_drown_a_narrow_one():
    narrow = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    wide = [100.0, -50.0, 30.0, 0.0, 10.0, -10.0, 40.0, 0.0]
    gdpo = create("advantage", "gdpo")
    together = gdpo.compute(parts_batch({"narrow": narrow, "wide": wide}))
    scaled = gdpo.compute(parts_batch({"narrow": narrow, "wide": [w * 1000 for w in wide]}))
    torch.testing.assert_close(together, scaled)  # each part's scale is divided out
    summed = create("advantage", "group").compute(
        RewardBatch(t([n + w for n, w in zip(narrow, wide)]), torch.tensor([0] * 4 + [1] * 4), torch.ones(8, 2))
    )
    together, summed = together.double(), summed.double()
    assert not torch.allclose(together, summed)
    # one part and no weights: GRPO's advantage whitened over the batch
    alone = gdpo.compute(parts_batch({"narrow": narrow}))
    grpo = create("advantage", "group").compute(
        RewardBatch(t(narrow), torch.tensor([0] * 4 + [1] * 4), torch.ones(8, 2))
    )
    torch.testing.assert_close(alone.double(), (grpo - grpo.mean()) / grpo.std())
    weighted = create("advantage", "gdpo", parts=["narrow"], weights={"narrow": 3.0}).compute(
        parts_batch({"narrow": narrow, "wide": wide})
    )
    torch.testing.assert_close(
        weighted.double(), alone.double()
    )  # whitening divides a single weight out; wide is not used


def test_gdpo_without_parts_is_a_clear_error_naming_the_verifier():
    with pytest.raises(RlzooError, match=r"^verifier: its verdicts carry no reward parts \(Verdict.parts\)"):
        create("advantage", "gdpo").compute(batch([1.0, 0.0], [0, 0], [1, 1]))
    with pytest.raises(RlzooError, match="algorithm.advantage.parts: 'format' is not among the verdicts' reward parts"):
        create("advantage", "gdpo", parts=["format"]).compute(parts_batch({"correct": [1.0] * 8}))
    # without parts, a weight naming a part the verdicts lack would weigh nothing: a misspelt name, refused
    with pytest.raises(
        RlzooError, match=r"algorithm.advantage.weights: 'corect' is not among the verdicts' reward parts \(correct\)"
    ):
        create("advantage", "gdpo", weights={"corect": 2.0}).compute(parts_batch({"correct": [1.0] * 8}))


def otb_batch(lengths, groups, width=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = t([[1.0 if c < n else 0.0 for c in range(width)] for n in lengths])
    tokens = torch.zeros_like(mask)
    for row, n in enumerate(lengths):
        if n:
            tokens[row, n - 1] = float(torch.rand(1, generator=g))
    old = -(torch.rand(mask.shape, generator=g, dtype=torch.float64) + 0.1)
    spi = torch.exp(old) ** 2 + 0.1
    return RewardBatch(
        torch.zeros(len(lengths)),
        torch.tensor(groups),
        mask,
        token_rewards=tokens,
        old_logprobs=old,
        token_stats={"sum_pi_squared": spi},
    )


def test_otb_group_of_one_keeps_its_return_and_the_zero_tail():
    b = otb_batch([2, 4, 3, 1], [0, 0, 0, 1])
    adv = create("advantage", "optimal-token-baseline").compute(b)
    assert adv[3, 0] == b.token_rewards[3, 0]  # alone in its group: no baseline
    # the unique longest response (4 tokens) has no baseline past the second-longest's 3 tokens
    assert adv[1, 3] == b.token_rewards[1, 3]
    no_tail = create("advantage", "optimal-token-baseline", zero_tail=False).compute(b)
    assert no_tail[1, 3].abs() < 1e-6  # alone at that position, its own return is the baseline


def test_tir_otb_equals_otb_without_holes():
    b = otb_batch([2, 4, 3, 1, 3, 3], [0, 0, 0, 1, 1, 1], seed=5)
    torch.testing.assert_close(
        create("advantage", "tir-optimal-token-baseline").compute(b),
        create("advantage", "optimal-token-baseline").compute(b),
    )


def test_otb_needs_sum_pi_squared():
    b = otb_batch([2, 2], [0, 0])
    with pytest.raises(ValueError, match=r"RewardBatch.token_stats\['sum_pi_squared'\]"):
        create("advantage", "optimal-token-baseline").compute(
            RewardBatch(b.rewards, b.group_index, b.mask, token_rewards=b.token_rewards, old_logprobs=b.old_logprobs)
        )


def test_capabilities_are_declared():
    cls = {name: REGISTRY.get("advantage", name).cls for name in REGISTRY.names("advantage")}
    assert [n for n, c in cls.items() if c.needs_reward_parts] == ["gdpo"]
    assert [n for n, c in cls.items() if c.needs_greedy_baseline] == ["remax"]
    assert sorted(n for n, c in cls.items() if "sum_pi_squared" in c.needs_token_stats) == [
        "optimal-token-baseline",
        "tir-optimal-token-baseline",
    ]
    assert cls["remax"].reads_token_rewards  # kl_in_reward works with it, as in verl's recipe


def test_a_nested_task_source_passes_on_what_the_loop_must_supply():
    remax = create("advantage", "reverse-kl", task={"name": "remax"})
    gdpo = create("advantage", "reverse-kl", task={"name": "gdpo"})
    assert remax.needs_greedy_baseline and not remax.needs_reward_parts
    assert gdpo.needs_reward_parts and not gdpo.needs_greedy_baseline
    assert not create("advantage", "reverse-kl").needs_greedy_baseline
