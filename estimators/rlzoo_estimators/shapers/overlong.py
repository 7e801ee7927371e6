"""Overlong reward shaping (DAPO; Yu et al. 2025, arXiv:2503.14476, §3.4, "soft overlong punishment").

    shaping(|y|) = min(0, -penalty * (|y| - (L_max - L_cache)) / L_cache)

0 up to ``L_max - L_cache`` tokens, then falling linearly to ``-penalty`` at ``L_max``. ``L_cache`` is
``buffer`` (null: a fifth of ``L_max``, DAPO's 4096 of 20480); ``L_max`` is ``max_length``, null meaning the
rollout's ``max_new_tokens``. A response longer than ``L_max`` is outside the formula's domain: an error.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, RewardShaper


@rlzoo.register("reward_shaper", "overlong")
class OverlongShaping(RewardShaper):
    """Soft overlong punishment: a penalty rising linearly from 0 to -penalty over the last buffer tokens (DAPO)."""

    formula = "min(0, -penalty * (|y| - (L_max - L_cache)) / L_cache)"
    reference = "DAPO (Yu et al. 2025, arXiv:2503.14476), overlong reward shaping"
    verl_name = "reward_model.overlong_buffer (enable, len, penalty_factor)"
    trl_name = "trl.rewards.get_soft_overlong_punishment"

    class Params(Params):
        buffer: int | None = Field(None, ge=1, description="L_cache, tokens; null: max(1, L_max // 5)")
        penalty: float = Field(1.0, ge=0.0, description="the penalty at L_max")
        max_length: int | None = Field(None, ge=1, description="L_max, tokens; null: rollout.max_new_tokens")

    def limits(self, budget: int) -> tuple[int, int]:
        """``(L_max, L_cache)`` for responses of up to ``budget`` tokens."""
        l_max = self.params.max_length if self.params.max_length is not None else budget
        return l_max, self.params.buffer if self.params.buffer is not None else max(1, l_max // 5)

    def budget_problems(self, budget: int) -> list[str]:
        l_max, l_cache = self.limits(budget)
        problems = []
        if l_max < budget:
            problems.append(
                f"overlong: max_length {l_max} is below rollout.max_new_tokens {budget}, so longer responses fall "
                "outside the penalty; use max_length >= max_new_tokens or null"
            )
        if l_cache > l_max:
            problems.append(f"overlong: buffer {l_cache} exceeds L_max {l_max}; use a buffer of 1..{l_max}")
        return problems

    def shape(self, rewards: torch.Tensor, lengths: torch.Tensor, budget: int) -> torch.Tensor:
        l_max, l_cache = self.limits(budget)
        self.check_within(lengths, l_max, f"L_max (max_length {self.params.max_length}, max_new_tokens {budget})")
        excess = lengths.to(rewards.dtype) - (l_max - l_cache)
        return torch.clamp(-self.params.penalty * excess / l_cache, max=0.0)
