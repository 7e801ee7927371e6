"""REINFORCE++ advantage (Hu 2025): discounted outcome return, whitened over every valid token of the batch.

    G_{i,t} = gamma^(number of valid tokens of y_i after t) * r_i      (the outcome reward sits at the last token)
    A = (G - mu) / sqrt(var + 1e-8),   mu = sum m G / N,   var = sum m (G - mu)^2 / (N - 1)

``N`` is the number of valid tokens in the batch, so long responses weigh more in the statistics. As verl's
``compute_reinforce_plus_plus_outcome_advantage``; with fewer than two valid tokens (where verl raises) ``A = 0``.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import AdvantageSource, Params, RewardBatch
from rlzoo_estimators._util import float_dtype, whiten


@rlzoo.register("advantage", "reinforce++")
class ReinforcePlusPlusAdvantage(AdvantageSource):
    """REINFORCE++: discounted outcome return per token, whitened over the batch's valid tokens."""

    formula = "A = whiten(gamma^(later valid tokens) * r) over all valid tokens of the batch"
    reference = "REINFORCE++ (Hu 2025, arXiv:2501.03262)"
    verl_name = "adv_estimator=reinforce_plus_plus"

    class Params(Params):
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per later valid token")

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        keep = (batch.mask > 0).to(torch.float64)
        later = keep.flip(-1).cumsum(-1).flip(-1) - keep  # valid tokens after t
        returns = batch.rewards.to(torch.float64).unsqueeze(-1) * torch.pow(self.params.gamma, later)
        return whiten(returns, batch.mask).to(float_dtype(batch.rewards, batch.mask))
