"""Clippers: ppo (symmetric and clip-higher), dual-clip, none."""

from __future__ import annotations

import pytest
import torch
from estimators_testlib import REGISTRY, create, floats, t
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.errors import ConfigError

RATIO = [[0.7, 1.0, 1.3, 0.9], [0.7, 1.0, 1.3, 1.1]]
ADV = [[1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, -1.0, -2.0]]


def run(clipper, ratio, adv):
    ratio = t(ratio).requires_grad_()
    out = clipper.clip(ratio, t(adv))
    (grad,) = torch.autograd.grad(out.loss.sum(), ratio)
    return out, grad


def test_ppo_hand_values():
    out, grad = run(create("clipper", "ppo"), RATIO, ADV)
    # A = +1: -min(0.7, 0.8) = -0.7; -min(1, 1) = -1; -min(1.3, 1.2) = -1.2 (clipped high); A = 0: 0
    # A = -1: -min(-0.7, -0.8) = 0.8 (clipped low); 1; -min(-1.3, -1.2) = 1.3; A = -2, r = 1.1: 2.2
    torch.testing.assert_close(out.loss, t([[-0.7, -1.0, -1.2, 0.0], [0.8, 1.0, 1.3, 2.2]]))
    assert out.clipped_low.tolist() == [[False] * 4, [True, False, False, False]]
    assert out.clipped_high.tolist() == [[False, False, True, False], [False] * 4]
    # the gradient is -A where not clipped, 0 where clipped
    torch.testing.assert_close(grad, t([[-1.0, -1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 2.0]]))


def test_ppo_clip_higher_is_asymmetric():
    clipper = create("clipper", "ppo", eps_low=0.2, eps_high=0.28)
    out, grad = run(clipper, [[1.25, 1.3, 0.75, 0.79]], [[1.0, 1.0, -1.0, -1.0]])
    torch.testing.assert_close(out.loss, t([[-1.25, -1.28, 0.8, 0.8]]))
    assert out.clipped_high.tolist() == [[False, True, False, False]]
    assert out.clipped_low.tolist() == [[False, False, True, True]]
    torch.testing.assert_close(grad, t([[-1.0, 0.0, 0.0, 0.0]]))


def test_ppo_gspo_tiny_range():
    out, _ = run(create("clipper", "ppo", eps_low=3e-4, eps_high=4e-4), [[1.0003, 1.0005, 0.9996]], [[1.0, 1.0, -1.0]])
    assert out.clipped_high.tolist() == [[False, True, False]]
    assert out.clipped_low.tolist() == [[False, False, True]]


def test_dual_clip_hand_values():
    clipper = create("clipper", "dual-clip", c=3.0)
    ratio = [[5.0, 2.0, 0.5, 5.0, 1.0]]
    adv = [[-1.0, -1.0, -1.0, 1.0, -2.0]]
    out, grad = run(clipper, ratio, adv)
    # A < 0, r = 5: ppo loss 5 bounded by c|A| = 3; r = 2: 2; r = 0.5: 0.8 (clipped low); A > 0, r = 5: -1.2
    torch.testing.assert_close(out.loss, t([[3.0, 2.0, 0.8, -1.2, 2.0]]))
    assert out.clipped_high.tolist() == [[True, False, False, True, False]]
    assert out.clipped_low.tolist() == [[False, False, True, False, False]]
    torch.testing.assert_close(grad, t([[0.0, 1.0, 0.0, 0.0, 2.0]]))


def test_dual_clip_equals_ppo_below_c():
    ratio, adv = [[0.5, 0.9, 1.1, 2.9, 2.9]], [[-1.0, 1.0, -1.0, -1.0, 1.0]]
    dual, _ = run(create("clipper", "dual-clip"), ratio, adv)
    ppo, _ = run(create("clipper", "ppo"), ratio, adv)
    torch.testing.assert_close(dual.loss, ppo.loss)
    assert torch.equal(dual.clipped_high, ppo.clipped_high) and torch.equal(dual.clipped_low, ppo.clipped_low)


def test_none_clipper():
    out, grad = run(create("clipper", "none"), RATIO, ADV)
    torch.testing.assert_close(out.loss, -t(RATIO) * t(ADV))
    torch.testing.assert_close(grad, -t(ADV))
    assert not out.clipped_low.any() and not out.clipped_high.any()
    assert out.clipped_low.dtype == torch.bool


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("ppo", {"eps_low": -0.1}, "eps_low"),
        ("ppo", {"eps_high": -0.1}, "eps_high"),
        ("ppo", {"eps_low": 1.5}, "eps_low"),
        ("ppo", {"epsilon": 0.2}, "epsilon"),
        ("dual-clip", {"c": 1.0}, "c"),
        ("dual-clip", {"c": 0.5}, "c"),
        ("none", {"eps_low": 0.2}, "eps_low"),
    ],
)
def test_clipper_params_validation(name, params, field):
    with pytest.raises(ConfigError, match=field):
        REGISTRY.create("clipper", name, params)


def test_clipper_defaults():
    assert create("clipper", "ppo").params.model_dump() == {"eps_low": 0.2, "eps_high": 0.2}
    assert create("clipper", "dual-clip").params.model_dump() == {"eps_low": 0.2, "eps_high": 0.2, "c": 3.0}


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["ppo", "dual-clip"]),
    floats(0.0, 0.5),
    floats(0.0, 0.5),
    st.lists(st.tuples(floats(0.0, 6.0), floats(-3.0, 3.0).filter(lambda a: abs(a) > 1e-3)), min_size=1, max_size=8),
)
def test_clip_flags_mark_exactly_the_tokens_without_gradient(name, eps_low, eps_high, pairs):
    """A token is flagged clipped if and only if the clip removed its gradient (for A != 0)."""
    params = {"eps_low": eps_low, "eps_high": eps_high}
    clipper = create("clipper", name, **params)
    ratio = t([[r for r, _ in pairs]])
    adv = t([[a for _, a in pairs]])
    out, grad = run(clipper, ratio, adv)
    flagged = out.clipped_low | out.clipped_high
    assert not (out.clipped_low & out.clipped_high).any()
    assert torch.equal(flagged, grad == 0)
    ppo_loss = create("clipper", "ppo", **params).clip(ratio, adv).loss
    # PPO's loss is never below the unclipped surrogate's (-rA): the clip only removes improvement
    assert (ppo_loss >= -(ratio * adv) - 1e-12).all()
    if name == "dual-clip":
        # dual clip = PPO, except that for A < 0 the loss is capped at c|A|
        expected = torch.where(adv < 0, torch.minimum(ppo_loss, 3.0 * adv.abs()), ppo_loss)
        torch.testing.assert_close(out.loss.detach(), expected)
