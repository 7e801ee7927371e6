"""Leave-one-out outcome advantage (RLOO, Ahmadian et al. 2024).

    A_i = r_i - mean_{j in g(i), j != i} r_j = (n / (n - 1)) (r_i - mean_{j in g(i)} r_j)

over the n responses of the same prompt; a group of one gets A = 0. Broadcast to every token of y_i.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import AdvantageSource, RewardBatch
from rlzoo_estimators._util import float_dtype, masked


@rlzoo.register("advantage", "rloo")
class RLOOAdvantage(AdvantageSource):
    """Leave-one-out baseline (RLOO): r_i minus the mean reward of the rest of its group.

    ``A_i = r_i - mean_{j != i} r_j`` within the group; a group of one gets 0. No parameters.
    """

    formula = "A_i = r_i - mean_{j != i in group} r_j"
    reference = "RLOO (Ahmadian et al. 2024, arXiv:2402.14740)"
    needs_groups = True
    verl_name = "adv_estimator=rloo"
    trl_name = "RLOOTrainer"

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        r = batch.rewards.to(torch.float64)
        if r.numel() == 0:
            adv = r
        else:
            _, inverse = torch.unique(batch.group_index, return_inverse=True)
            counts = torch.bincount(inverse).to(torch.float64)
            sums = torch.zeros_like(counts).index_add_(0, inverse, r)
            n = counts[inverse]
            others_mean = (sums[inverse] - r) / (n - 1.0).clamp(min=1.0)
            adv = torch.where(n > 1, r - others_mean, torch.zeros_like(r))
        dtype = float_dtype(batch.rewards, batch.mask)
        return masked(adv.to(dtype).unsqueeze(-1).expand(batch.mask.shape), batch.mask)
