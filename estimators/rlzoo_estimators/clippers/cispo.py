"""CISPO (MiniMax-M1, 2025): clip the importance-sampling weight, never the gradient.

    L_t = -sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) * A_t * log rho_t        (paper, verl: ... * logp_t)

implemented in ratio form, ``L_t = -sg(clip(rho_t) / rho_t) * rho_t * A_t``, whose gradient
``-clip(rho_t) * A_t * grad log rho_t`` is the paper's and verl's (``compute_policy_loss_cispo``); the loss value
differs from verl's by a gradient-free term. The truncated weight is at least ``1 - eps_low`` (> 0 unless
``eps_low = 1``, where it is still ``rho > 0``), so no token with ``A != 0`` loses its gradient. A token counts as
clipped when its weight was truncated (verl's meaning): low when ``rho < 1 - eps_low``, high when
``rho > 1 + eps_high``, whatever the sign of A.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params


@rlzoo.register("clipper", "cispo")
class CISPOClipper(Clipper):
    """CISPO: -sg(clip(rho, 1-eps_low, 1+eps_high)) * A * log rho; truncates the weight, keeps every gradient."""

    formula = "L = -sg(clip(rho, 1-eps_low, 1+eps_high)) * A * log(rho)"
    reference = "MiniMax-M1 (MiniMax 2025, arXiv:2506.13585)"
    verl_name = "policy_loss.loss_mode=cispo"
    trl_name = "loss_type=cispo"

    class Params(Params):
        eps_low: float = Field(1.0, ge=0.0, le=1.0, description="weights below 1 - eps_low are raised to it")
        eps_high: float = Field(4.0, ge=0.0, description="weights above 1 + eps_high are truncated to it")

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        p = self.params
        r = ratio.detach()
        truncated = r.clamp(1.0 - p.eps_low, 1.0 + p.eps_high)
        loss = -(truncated / r) * ratio * advantages
        return ClipResult(loss=loss, clipped_low=r < 1.0 - p.eps_low, clipped_high=r > 1.0 + p.eps_high)
