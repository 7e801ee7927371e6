"""A linear length penalty: every response token costs ``coef`` reward.

    shaping(|y|) = -coef * |y|

Responses are at most ``rollout.max_new_tokens`` long; a longer one is an error (the rollout broke its budget).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, RewardShaper


@rlzoo.register("reward_shaper", "length")
class LengthPenalty(RewardShaper):
    """Linear length penalty: -coef per response token."""

    formula = "-coef * |y|"
    reference = "a plain length penalty (e.g. Kimi k1.5 uses a reward-aware variant)"

    class Params(Params):
        coef: float = Field(0.001, ge=0.0, description="reward per response token subtracted")

    def shape(self, rewards: torch.Tensor, lengths: torch.Tensor, budget: int) -> torch.Tensor:
        self.check_within(lengths, budget, "the budget (rollout.max_new_tokens)")
        return -self.params.coef * lengths.to(rewards.dtype)
