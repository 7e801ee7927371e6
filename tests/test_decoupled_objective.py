"""AReaL's decoupled PPO objective (Fu et al. 2025, "AReaL", eq. 5; its ``use_decoupled_loss`` with
``behav_imp_weight_cap``) is rlzoo's components, nothing added: ``algorithm.old_logprobs: train`` makes the training
engine's pass the proximal policy, the rollout engine's log-probs are the behaviour policy's, the ``tis`` correction
with ``action: mask`` is the behaviour weight and its cap, ``ppo`` clips against the proximal policy and
``token-mean`` divides by the response tokens. Checked against the formula written out here to 1e-6."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlzoo.registry import default_registry
from rlzoo.rl.objective import build_objective

DECOUPLED = {
    "clipper": {"name": "ppo", "eps_low": 0.2, "eps_high": 0.2},
    "aggregation": {"name": "token-mean"},
    "kl_coef": 0.0,
}
CAP = 5.0


def decoupled_loss(logp, proximal, behaviour, advantages, mask, eps=0.2, cap=CAP):
    """-(1/|mask|) sum_t m_t [w_t <= cap] w_t min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t),
    r_t = pi_theta / pi_prox, w_t = pi_prox / pi_behav."""
    ratio = torch.exp(logp - proximal)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    weight = torch.exp(proximal - behaviour)
    kept = (weight <= cap).to(logp.dtype) * mask
    return -(surrogate * weight * kept).sum() / mask.sum()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), stale=st.floats(0.0, 2.5))
def test_rlzoo_components_give_areals_decoupled_loss(seed, stale):
    generator = torch.Generator().manual_seed(seed)
    shape = (4, 7)
    behaviour = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    proximal = behaviour + stale * torch.randn(shape, generator=generator, dtype=torch.float64)  # versions apart
    logp = (proximal + 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)).requires_grad_()
    advantages = torch.randn(shape, generator=generator, dtype=torch.float64)
    mask = (torch.rand(shape, generator=generator) > 0.2).to(torch.float64)
    mask[:, 0] = 1.0

    registry = default_registry()
    correction = registry.create("correction", "tis", {"level": "token", "action": "mask", "threshold": CAP})
    weights = correction.weights(proximal, behaviour, mask)
    objective = build_objective(DECOUPLED, registry)
    loss, _ = objective(logp, proximal, advantages, mask, weights=weights)

    expected = decoupled_loss(logp, proximal, behaviour, advantages, mask)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    (grad,) = torch.autograd.grad(loss, logp)
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert torch.allclose(grad, expected_grad, atol=1e-6)
