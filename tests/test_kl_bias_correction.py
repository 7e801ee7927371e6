"""``algorithm.kl_bias_correction`` (TRL's ``use_bias_correction_kl``, DeepSeek-V3.2): the per-token k3 KL to the
reference is multiplied by the policy ratio w = pi_theta / pi_old, w's gradient included, at the ratio estimator's
level (token, or one w per response with ``sequence``).

Checked against an independent float64 re-derivation of what TRL 1.16.0's ``GRPOTrainer._compute_loss`` does with
the option (read from its source: the per-token KL times ``coef_1``, the exponentiated token or sequence log-ratio,
before the loss is averaged), for its ``grpo`` loss (PPO clip, per-response token mean, then the mean over
responses), in value and gradient; and without the option, the term is the plain KL.
"""

from __future__ import annotations

import pytest
import torch

import rlzoo
from rlzoo.errors import ConfigError

BETA, EPS = 0.1, 0.2


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = (5, 7)
    mask = (torch.rand(shape, generator=g) > 0.25).double()
    mask[:, 0] = 1.0
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 2
    logp = (old + 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)).requires_grad_()
    ref = old + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
    advantages = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).expand(shape).contiguous()
    return logp, old, ref, advantages, mask


def rederived(logp, old, ref, advantages, mask, level: str, corrected: bool) -> torch.Tensor:
    """TRL's grpo loss with beta * k3, written out: token or sequence log-ratio, PPO clip, per-response mean."""
    log_ratio = logp - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).expand_as(logp)
    w = torch.exp(log_ratio)
    surrogate = -torch.minimum(w * advantages, torch.clamp(w, 1 - EPS, 1 + EPS) * advantages)
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    per_token = surrogate + BETA * (k3 * w if corrected else k3)
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


def objective(level: str, corrected: bool):
    return rlzoo.build_objective(
        {
            "ratio": {"name": level},
            "clipper": {"name": "ppo", "eps_low": EPS, "eps_high": EPS},
            "aggregation": {"name": "seq-mean-token-mean"},
            "kl": {"name": "k3"},
            "kl_coef": BETA,
            "kl_bias_correction": corrected,
        }
    )


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("corrected", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_and_gradient_match_the_rederivation(level, corrected, seed):
    logp, old, ref, advantages, mask = batch(seed)
    loss, _ = objective(level, corrected)(logp, old, advantages, mask, ref_logp=ref)
    (grad,) = torch.autograd.grad(loss, logp)
    expected = rederived(logp, old, ref, advantages, mask, level, corrected)
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert abs(loss.item() - expected.item()) < 1e-12
    assert torch.allclose(grad, expected_grad, atol=1e-12, rtol=0)


def test_the_correction_changes_the_gradient_even_where_the_ratio_is_one():
    logp, old, ref, advantages, mask = batch(3)
    on_policy = old.clone().requires_grad_()  # w = 1: same value, but w's gradient adds k3 * grad(logp)
    grads = []
    for corrected in (True, False):
        loss, _ = objective("token", corrected)(on_policy, old, advantages, mask, ref_logp=ref)
        grads.append(torch.autograd.grad(loss, on_policy)[0])
    assert not torch.allclose(grads[0], grads[1])


def test_the_correction_without_a_kl_term_is_refused_by_field():
    with pytest.raises(ConfigError) as err:
        rlzoo.build_objective({"kl_bias_correction": True})
    ((field, message),) = err.value.problems
    assert field == "algorithm.kl_bias_correction" and "kl_coef > 0" in message
