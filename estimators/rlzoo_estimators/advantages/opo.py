"""OPO advantage (On-Policy RL with Optimal reward baseline, Hao et al. 2025): a length-weighted group baseline.

    A_i = r_i - sum_{j in g(i)} |y_j| r_j / sum_{j in g(i)} |y_j|

broadcast to every token of y_i. As verl's ``compute_opo_outcome_advantage``, except for a group of one response
(or of empty responses only), which gets 0 here (verl takes a baseline of 0 there).
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import AdvantageSource, RewardBatch
from rlzoo_estimators._util import float_dtype, masked


@rlzoo.register("advantage", "opo")
class OPOAdvantage(AdvantageSource):
    """OPO: r minus the length-weighted mean reward of its group, broadcast over tokens."""

    formula = "A_i = r_i - sum_g |y_j| r_j / sum_g |y_j|"
    reference = "OPO (Hao et al. 2025, arXiv:2505.23585)"
    needs_groups = True
    verl_name = "adv_estimator=opo"

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        r = batch.rewards.to(torch.float64).reshape(-1)
        adv = torch.zeros_like(r)
        if r.numel():
            lengths = (batch.mask > 0).sum(dim=-1).to(torch.float64).reshape(-1)
            _, inverse = torch.unique(batch.group_index.reshape(-1).cpu(), return_inverse=True)
            inverse = inverse.to(r.device)
            counts = torch.bincount(inverse).to(torch.float64)
            weighted = torch.zeros_like(counts).index_add_(0, inverse, lengths * r)
            total = torch.zeros_like(counts).index_add_(0, inverse, lengths)
            baseline = weighted / total.clamp(min=1.0)
            valid = (counts[inverse] > 1) & (total[inverse] > 0)
            adv = torch.where(valid, r - baseline[inverse], adv)
        dtype = float_dtype(batch.rewards, batch.mask)
        return masked(adv.to(dtype).unsqueeze(-1).expand(batch.mask.shape), batch.mask)
