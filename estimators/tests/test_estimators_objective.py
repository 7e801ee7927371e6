"""The estimators composed through ``rlzoo.build_objective``: GSPO vs GSPO-token, presets, config validation."""

from __future__ import annotations

import math

import pytest
import torch
from estimators_testlib import REGISTRY, batch_shapes, create, floats, right_padded_mask, t, tensor_of
from hypothesis import given, settings
from hypothesis import strategies as st

import rlzoo
from rlzoo.config.presets import PRESETS
from rlzoo.errors import ConfigError
from rlzoo.interfaces import RewardBatch

CLIP_METRICS = ["clip/fraction", "clip/low_fraction", "clip/high_fraction"]
REQUIRED_METRICS = [*CLIP_METRICS, "ratio/mean", "ratio/min", "ratio/max", "kl/old_approx"]


def build(algorithm):
    return rlzoo.build_objective(algorithm, registry=REGISTRY)


def loss_and_grad(objective, logp, old, adv, mask, **kwargs):
    logp = logp.detach().clone().requires_grad_()
    loss, metrics = objective(logp, old, adv, mask, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), metrics, grad


@st.composite
def objective_inputs(draw, uniform_advantage: bool, delta_scale: float):
    """Random right-padded batch: old log-probs, a perturbed policy and advantages (uniform per row or not)."""
    lengths, width = draw(batch_shapes(max_batch=4, max_tokens=6, min_length=1))
    shape = (len(lengths), width)
    mask = right_padded_mask(lengths, width)
    old = tensor_of(draw, shape, floats(-6.0, -0.01))
    logp = old + tensor_of(draw, shape, floats(-delta_scale, delta_scale))
    if uniform_advantage:
        per_row = tensor_of(draw, (shape[0], 1), floats(-2.0, 2.0))
        adv = per_row.expand(shape) * mask
    else:
        adv = tensor_of(draw, shape, floats(-2.0, 2.0)) * mask
    return logp, old, adv, mask


# eps 3e-4 / 4e-4 (the presets) with log-ratio perturbations of 1e-3 mixes clipped and unclipped responses;
# the 0.2 override with perturbations of 0.5 does the same at PPO's usual range
GSPO_VARIANTS = [
    ({}, 1e-3),
    ({"clipper": {"eps_low": 0.2, "eps_high": 0.2}}, 0.5),
    ({"clipper": {"name": "dual-clip", "eps_low": 0.2, "eps_high": 0.28, "c": 1.5}}, 1.0),
    ({"aggregation": {"name": "token-mean"}}, 1e-3),
    ({"aggregation": {"name": "seq-mean-token-sum-norm"}}, 1e-3),
]


@pytest.mark.parametrize("override, scale", GSPO_VARIANTS)
def test_gspo_token_equals_gspo_with_uniform_advantages(override, scale):
    gspo = build({"preset": "gspo", **override})
    gspo_token = build({"preset": "gspo-token", **override})
    assert gspo.ratio.name == "sequence" and gspo_token.ratio.name == "sequence-token"
    seen = {"unclipped_grad": 0, "clipped": 0}

    @settings(max_examples=40, deadline=None, database=None)
    @given(objective_inputs(uniform_advantage=True, delta_scale=scale))
    def check(inputs):
        logp, old, adv, mask = inputs
        loss_s, metrics_s, grad_s = loss_and_grad(gspo, logp, old, adv, mask)
        loss_t, metrics_t, grad_t = loss_and_grad(gspo_token, logp, old, adv, mask)
        torch.testing.assert_close(loss_t, loss_s, rtol=1e-12, atol=1e-12)
        for key in [*CLIP_METRICS, "ratio/mean", "ratio/min", "ratio/max"]:
            assert metrics_t[key] == metrics_s[key], key
        torch.testing.assert_close(grad_t, grad_s, rtol=1e-9, atol=1e-12)
        seen["unclipped_grad"] += int(torch.count_nonzero(grad_s) > 0)
        seen["clipped"] += int(metrics_s["clip/fraction"] > 0)

    check()
    # the property was exercised on both sides of the clip, not only on all-zero gradients
    assert seen["unclipped_grad"] > 0 and seen["clipped"] > 0, seen


@settings(max_examples=60, deadline=None)
@given(objective_inputs(uniform_advantage=False, delta_scale=0.0))
def test_gspo_token_gradient_follows_token_advantages(inputs):
    """At logp = old (ratio 1, nothing clipped) with seq-mean-token-mean over B responses:

    GSPO:        d loss / d logp_{i,t} = -mean_t(A_{i,.}) / (|y_i| B)   (every token shares the sequence's gradient)
    GSPO-token:  d loss / d logp_{i,t} = -A_{i,t} / (|y_i| B)           (each token follows its own advantage)
    """
    logp, old, adv, mask = inputs
    lengths = mask.sum(-1, keepdim=True)
    batch = mask.shape[0]
    _, m_s, grad_s = loss_and_grad(build({"preset": "gspo"}), logp, old, adv, mask)
    _, m_t, grad_t = loss_and_grad(build({"preset": "gspo-token"}), logp, old, adv, mask)
    assert m_s["clip/fraction"] == 0.0 and m_t["clip/fraction"] == 0.0
    row_mean = adv.sum(-1, keepdim=True) / lengths
    torch.testing.assert_close(grad_s, -(row_mean / (lengths * batch)) * mask)
    torch.testing.assert_close(grad_t, -(adv / (lengths * batch)) * mask)
    spread = ((adv - row_mean).abs() * mask).max().item()
    if spread > 1e-3:  # the gradients differ wherever the advantage varies inside a response
        assert not torch.allclose(grad_t, grad_s)
    elif spread == 0.0:
        assert torch.allclose(grad_t, grad_s)


def test_gspo_token_differs_from_gspo_hand_example():
    logp = t([[-1.0, -2.0, -0.5]])
    adv = t([[1.0, -1.0, 0.5]])
    mask = t([[1, 1, 1]])
    _, _, grad_s = loss_and_grad(build({"preset": "gspo"}), logp, logp, adv, mask)
    _, _, grad_t = loss_and_grad(build({"preset": "gspo-token"}), logp, logp, adv, mask)
    torch.testing.assert_close(grad_s, t([[-(0.5 / 3) / 3] * 3]))
    torch.testing.assert_close(grad_t, t([[-1 / 3, 1 / 3, -0.5 / 3]]))


def test_process_advantages_into_gspo_token():
    """End to end: per-step rewards -> process advantages -> GSPO-token gives a per-token gradient."""
    mask = t([[1, 1, 1, 1], [1, 1, 1, 0]])
    batch = RewardBatch(
        rewards=t([1.0, 0.0]),
        group_index=torch.tensor([0, 0]),
        mask=mask,
        step_rewards=[[1.0, 0.0], [0.0]],
        step_ends=[[2, 4], [3]],
    )
    adv = create("advantage", "process", std_normalize=False).compute(batch)
    # step rewards 1, 0, 0: mean 1/3 -> normalised 2/3, -1/3, -1/3
    torch.testing.assert_close(adv, t([[1 / 3, 1 / 3, -1 / 3, -1 / 3], [-1 / 3, -1 / 3, -1 / 3, 0.0]]))
    logp = t([[-1.0, -1.5, -0.2, -3.0], [-0.7, -0.1, -2.0, 0.0]])
    _, _, grad = loss_and_grad(build({"preset": "gspo-token"}), logp, logp, adv, mask)
    torch.testing.assert_close(grad, -adv / (mask.sum(-1, keepdim=True) * 2))


@st.composite
def any_inputs(draw):
    lengths, width = draw(batch_shapes(max_batch=4, max_tokens=6, min_length=0))
    shape = (len(lengths), width)
    old = tensor_of(draw, shape, floats(-6.0, -0.01))
    logp = old + tensor_of(draw, shape, floats(-0.5, 0.5))
    ref = old + tensor_of(draw, shape, floats(-0.5, 0.5))
    mask = right_padded_mask(lengths, width)
    adv = tensor_of(draw, shape, floats(-2.0, 2.0)) * mask
    return logp, old, adv, mask, ref


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_and_reports_metrics(preset):
    objective = build({"preset": preset})

    @settings(max_examples=15, deadline=None, database=None)
    @given(any_inputs())
    def check(inputs):
        logp, old, adv, mask, ref = inputs
        loss_ref, metrics_ref, _ = loss_and_grad(objective, logp, old, adv, mask, ref_logp=ref)
        if objective.kl_coef > 0:
            with pytest.raises(ValueError, match="ref_logp"):  # a KL term never silently disappears
                loss_and_grad(objective, logp, old, adv, mask)
            loss, metrics, grad = loss_ref, metrics_ref, None
        else:
            loss, metrics, grad = loss_and_grad(objective, logp, old, adv, mask)
            assert "kl/ref" not in metrics
        assert math.isfinite(loss.item()) and (grad is None or torch.isfinite(grad).all())
        assert set(REQUIRED_METRICS) <= set(metrics)
        assert all(math.isfinite(v) for v in metrics.values())
        assert 0.0 <= metrics["clip/fraction"] <= 1.0
        assert metrics["clip/fraction"] == pytest.approx(metrics["clip/low_fraction"] + metrics["clip/high_fraction"])
        assert metrics["ratio/min"] <= metrics["ratio/mean"] + 1e-12 <= metrics["ratio/max"] + 2e-12
        assert math.isfinite(loss_ref.item()) and math.isfinite(metrics_ref["kl/ref"])
        if objective.kl.name != "k1":  # k2 and k3 are non-negative; k1 (ppo's, in the reward) is not per sample
            assert metrics_ref["kl/ref"] >= 0.0
        if objective.kl_coef == 0:
            assert loss_ref.item() == loss.item()

    check()


def test_preset_kl_term_is_added_with_its_coefficient():
    objective = build({"preset": "grpo"})
    assert objective.kl_coef > 0 and objective.kl.name == "k3"
    logp = t([[-1.0, -2.0], [-0.5, -9.0]])
    mask = t([[1, 1], [1, 0]])
    adv = t([[0.5, 0.5], [-1.0, 0.0]])
    ref = t([[-1.5, -2.0], [-0.2, 0.0]])
    loss, metrics, _ = loss_and_grad(objective, logp, logp, adv, mask, ref_logp=ref)
    k3 = lambda lp, r: math.exp(r - lp) - 1 - (r - lp)  # noqa: E731
    # ratio 1: policy term -A; seq-mean-token-mean over the two responses
    row0 = (-0.5 + objective.kl_coef * k3(-1.0, -1.5) - 0.5 + objective.kl_coef * k3(-2.0, -2.0)) / 2
    row1 = 1.0 + objective.kl_coef * k3(-0.5, -0.2)
    assert loss.item() == pytest.approx((row0 + row1) / 2)
    assert metrics["kl/ref"] == pytest.approx((k3(-1.0, -1.5) + 0.0 + k3(-0.5, -0.2)) / 3)


def test_presets_select_the_documented_components():
    expected = {
        "grpo": ("token", "ppo", "seq-mean-token-mean"),
        "dr-grpo": ("token", "ppo", "seq-mean-token-sum-norm"),
        "dapo": ("token", "ppo", "token-mean"),
        "gspo": ("sequence", "ppo", "seq-mean-token-mean"),
        "gspo-token": ("sequence-token", "ppo", "seq-mean-token-mean"),
        "rloo": ("token", "ppo", "seq-mean-token-mean"),
    }
    for preset, (ratio, clipper, aggregation) in expected.items():
        if preset not in PRESETS:
            continue
        objective = build({"preset": preset})
        chosen = (objective.ratio.name, objective.clipper.name, objective.aggregation.name)
        assert chosen == (ratio, clipper, aggregation)
    assert build({"preset": "dapo"}).clipper.params.eps_high == pytest.approx(0.28)


def test_dual_clip_through_the_objective_counts_held_tokens_as_high():
    objective = build({"preset": "grpo", "clipper": {"name": "dual-clip", "c": 2.0}, "kl_coef": 0.0})
    old = t([[0.0, 0.0, 0.0, 0.0]]) - 1.0
    logp = old + t([[math.log(3.0), math.log(1.5), math.log(0.5), math.log(3.0)]])
    adv = t([[-1.0, -1.0, -1.0, 1.0]])
    loss, metrics, grad = loss_and_grad(objective, logp, old, adv, t([[1, 1, 1, 1]]))
    # losses: c|A| = 2 (held), 1.5, 0.8 (clipped low), -1.2 (clipped high) -> mean 3.1 / 4
    assert loss.item() == pytest.approx((2.0 + 1.5 + 0.8 - 1.2) / 4)
    assert metrics["clip/high_fraction"] == pytest.approx(0.5)
    assert metrics["clip/low_fraction"] == pytest.approx(0.25)
    assert metrics["clip/fraction"] == pytest.approx(0.75)
    assert grad[0, 1].item() == pytest.approx(1.5 / 4) and grad[0, [0, 2, 3]].abs().sum() == 0


@pytest.mark.parametrize(
    "algorithm, location",
    [
        ({"preset": "gspo", "clipper": {"eps_low": -1.0}}, "algorithm.clipper.eps_low"),
        ({"preset": "grpo", "clipper": {"name": "dual-clip", "c": 0.9}}, "algorithm.clipper.c"),
        ({"preset": "dr-grpo", "aggregation": {"max_tokens": 0}}, "algorithm.aggregation.max_tokens"),
        ({"preset": "grpo", "ratio": {"name": "sequence", "level": "token"}}, "algorithm.ratio.level"),
    ],
)
def test_invalid_component_params_are_config_errors(algorithm, location):
    with pytest.raises(ConfigError) as info:
        build(algorithm)
    assert location in str(info.value)


def test_unknown_component_name_lists_the_valid_ones():
    from rlzoo.errors import UnknownComponentError

    with pytest.raises(UnknownComponentError, match="sequence-token"):
        build({"preset": "gspo", "ratio": {"name": "sequence_token"}})
