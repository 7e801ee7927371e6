"""SAPO (Soft Adaptive Policy Optimization, Qwen team 2025, arXiv:2511.20347): a sigmoid gate, not a hard clip.

    L_t = -(4 / tau_t) * sigmoid(tau_t * (rho_t - 1)) * A_t,     tau_t = tau_pos if A_t > 0 else tau_neg

At rho = 1 the gate is 1 with slope 1, like the plain surrogate; far from 1 it saturates, so the gradient fades
smoothly instead of dropping to zero. As verl (``compute_policy_loss_sapo``) and TRL (``loss_type="sapo"``);
verl always aggregates it seq-mean-token-mean, which the ``sapo`` preset selects. Nothing counts as clipped.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params


@rlzoo.register("clipper", "sapo")
class SAPOClipper(Clipper):
    """SAPO soft gate: -(4/tau) * sigmoid(tau*(rho-1)) * A, tau = tau_pos (A > 0) or tau_neg."""

    formula = "L = -(4/tau) * sigmoid(tau*(rho-1)) * A, tau = tau_pos if A > 0 else tau_neg"
    reference = "SAPO (Qwen team 2025, arXiv:2511.20347)"
    verl_name = "policy_loss.loss_mode=sapo"
    trl_name = "loss_type=sapo"

    class Params(Params):
        tau_pos: float = Field(1.0, gt=0.0, description="gate temperature for tokens with A > 0")
        tau_neg: float = Field(1.05, gt=0.0, description="gate temperature for tokens with A <= 0")

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        tau = torch.where(
            advantages > 0,
            torch.full_like(ratio, self.params.tau_pos),
            torch.full_like(ratio, self.params.tau_neg),
        )
        gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        never = torch.zeros(ratio.shape, dtype=torch.bool, device=ratio.device)
        return ClipResult(loss=-gate * advantages, clipped_low=never, clipped_high=never.clone())
