"""VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693): a smooth, asymmetric Gamma-shaped
weight on the *sequence* importance weight replaces the clip.

Per response, the sequence weight (a product of token ratios, not a length-normalised one) in log space,

    log w_i = clamp(sum_t m_t l_t, log 1e-8, 20),          l_t the ratio estimator's log-ratio

and per token, with ``(k, lambda) = (k_pos, lambda_pos)`` where ``A_t >= 0``, else ``(k_neg, lambda_neg)``:

    phi_t = exp(lambda + k log w_i - lambda w_i)            (= e^lambda w^k e^(-lambda w); phi(1) = 1, peak at w = k/lambda)
    L_t   = -sg(phi_t) * A_t * log rho_t                    (TRL: -phi * A * logp_t)

so responses far from on-policy in either direction fade smoothly. Implemented in ratio form,
``L_t = -sg(phi_t / rho_t) * rho_t * A_t``, whose gradient ``-phi_t A_t grad log rho_t`` is TRL's
(``GRPOTrainer.get_gamma_weights`` and ``loss_type="vespo"``) with the token ratio; the loss value differs by a
gradient-free term. TRL folds its vLLM importance-sampling ratio into ``w``; in rlzoo a train-inference correction
(``algorithm.correction``) multiplies the loss instead. TRL aggregates it as ``dapo`` (``token-mean``, the
``vespo`` preset). Nothing counts as clipped.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params, PolicyBatch
from rlzoo_estimators._util import masked

#: the sequence log-weight's lower bound, log(1e-8) (TRL's, so that w > 0)
MIN_LOG_WEIGHT = math.log(1e-8)
#: its upper bound (exp stays finite)
MAX_LOG_WEIGHT = 20.0


def gamma_weights(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    k: tuple[float, float],
    lam: tuple[float, float],
) -> torch.Tensor:
    """``[B, T]`` ``phi_t = exp(lambda + k log w - lambda w)``, ``w`` the response's clamped sequence weight; ``k`` and
    ``lam`` are ``(for A >= 0, for A < 0)``. No gradient."""
    seq = masked(log_ratio.detach(), mask).sum(dim=-1, keepdim=True).clamp(MIN_LOG_WEIGHT, MAX_LOG_WEIGHT)  # [B, 1]
    nonneg = advantages >= 0
    k_t = torch.where(nonneg, torch.full_like(advantages, k[0]), torch.full_like(advantages, k[1]))
    lam_t = torch.where(nonneg, torch.full_like(advantages, lam[0]), torch.full_like(advantages, lam[1]))
    return torch.exp(lam_t + k_t * seq - lam_t * torch.exp(seq))


@rlzoo.register("clipper", "vespo")
class VESPOClipper(Clipper):
    """VESPO: -sg(phi(w)) * A * log rho, phi a Gamma-shaped weight of the sequence importance weight w."""

    formula = (
        "L = -sg(phi) * A * log(rho), phi = exp(lambda + k log w - lambda w), w = exp(sum_t m_t log rho_t); "
        "(k, lambda) by the sign of A"
    )
    reference = "VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693)"
    trl_name = "loss_type=vespo"

    class Params(Params):
        k_pos: float = Field(2.0, ge=0.0, description="A >= 0: power of w (how fast weights below w = 1 fade)")
        lambda_pos: float = Field(3.0, gt=0.0, description="A >= 0: decay rate (how fast weights above w = 1 fade)")
        k_neg: float = Field(3.0, ge=0.0, description="A < 0: power of w")
        lambda_neg: float = Field(2.0, gt=0.0, description="A < 0: decay rate")

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        p = self.params
        phi = gamma_weights(
            batch.log_ratio, batch.advantages, batch.mask, (p.k_pos, p.k_neg), (p.lambda_pos, p.lambda_neg)
        )
        r = batch.ratio.detach()
        loss = -(phi / r) * batch.ratio * batch.advantages
        never = torch.zeros(loss.shape, dtype=torch.bool, device=loss.device)
        return ClipResult(loss=loss, clipped_low=never, clipped_high=never.clone())
