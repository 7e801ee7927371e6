"""PPO clipped surrogate (symmetric as in GRPO, or clip-higher as in DAPO when eps_high > eps_low).

    loss_{i,t} = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)

The clip removes a token's gradient when A < 0 and rho < 1 - eps_low (``clipped_low``) or when A > 0 and
rho > 1 + eps_high (``clipped_high``).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params


class PPOParams(Params):
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="lower clip range: ratios below 1 - eps_low are clipped")
    eps_high: float = Field(0.2, ge=0.0, description="upper clip range: ratios above 1 + eps_high are clipped")


def ppo_objective(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`` (the objective, to maximise)."""
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.minimum(ratio * advantages, clipped_ratio * advantages)


def ppo_clip_flags(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    r = ratio.detach()
    low = (advantages < 0) & (r < 1.0 - eps_low)
    high = (advantages > 0) & (r > 1.0 + eps_high)
    return low, high


@rlzoo.register("clipper", "ppo")
class PPOClipper(Clipper):
    """PPO clip: -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A); clip-higher when eps_high > eps_low.

    ``loss = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``.
    """

    formula = "L = -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)"
    reference = "PPO (Schulman et al. 2017); clip-higher: DAPO (Yu et al. 2025)"
    verl_name = "policy_loss.loss_mode=vanilla"
    trl_name = "loss_type=grpo|bnpo|dapo"
    Params = PPOParams

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        p = self.params
        loss = -ppo_objective(ratio, advantages, p.eps_low, p.eps_high)
        low, high = ppo_clip_flags(ratio, advantages, p.eps_low, p.eps_high)
        return ClipResult(loss=loss, clipped_low=low, clipped_high=high)
