"""Dual clip (Ye et al. 2020): PPO clip plus a lower bound on the objective of negative-advantage tokens.

    A >= 0:  objective = min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
    A <  0:  objective = max(min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), c A)
    loss = -objective

For A < 0 the loss is thus bounded by c |A| (c > 1); a token held by that bound (rho > c) has no gradient and
counts as ``clipped_high``.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult
from rlzoo_estimators.clippers.ppo import PPOParams, ppo_clip_flags, ppo_objective


@rlzoo.register("clipper", "dual-clip")
class DualClipper(Clipper):
    """PPO clip plus dual clip: for A < 0 the loss is bounded by c*|A| (c > 1).

    ``A < 0: loss = -max(min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), c A)``; A >= 0 as PPO.
    """

    formula = "A < 0: L = min(PPO loss, c |A|)"
    reference = "Dual-clip PPO (Ye et al. 2020, arXiv:1912.09729)"
    verl_name = "clip_ratio_c"

    class Params(PPOParams):
        c: float = Field(3.0, gt=1.0, description="dual-clip bound: for A < 0 the loss is at most c*|A| (c > 1)")

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        p = self.params
        ppo = ppo_objective(ratio, advantages, p.eps_low, p.eps_high)
        bound = p.c * advantages
        negative = advantages < 0
        objective = torch.where(negative, torch.maximum(ppo, bound), ppo)
        low, high = ppo_clip_flags(ratio, advantages, p.eps_low, p.eps_high)
        held = negative & (ppo.detach() < bound)
        return ClipResult(loss=-objective, clipped_low=low, clipped_high=high | held)
