"""REINFORCE++-baseline advantage (Hu 2025): group-mean baseline, then whitened over every valid token of the batch.

    A_{i,t} = whiten(r_i - mean_{j in g(i)} r_j)      broadcast to the tokens of y_i

whitened as in ``reinforce++`` (mean and unbiased variance over all valid tokens of the batch), so long
responses weigh more. As verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``, except for a group of
one response, whose centred reward is 0 here (verl takes a baseline of 0 there, leaving ``r``).
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import AdvantageSource, RewardBatch
from rlzoo_estimators._util import float_dtype, group_normalise, whiten


@rlzoo.register("advantage", "reinforce++-baseline")
class ReinforcePlusPlusBaselineAdvantage(AdvantageSource):
    """REINFORCE++-baseline: r minus the group mean, broadcast, whitened over the batch's valid tokens."""

    formula = "A = whiten(r - mean_group r) over all valid tokens of the batch"
    reference = "REINFORCE++ (Hu 2025, arXiv:2501.03262)"
    needs_groups = True
    verl_name = "adv_estimator=reinforce_plus_plus_baseline"

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        centred = group_normalise(batch.rewards, batch.group_index, std_normalize=False, unbiased_std=True, eps=0.0)
        per_token = centred.unsqueeze(-1).expand(batch.mask.shape)
        return whiten(per_token, batch.mask).to(float_dtype(batch.rewards, batch.mask))
