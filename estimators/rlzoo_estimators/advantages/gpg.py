"""GPG advantage (Group Policy Gradient, Chu et al. 2025): group-centred reward, rescaled by the share of
responses that carry any reward.

    A_i = alpha * (r_i - mean_{j in g(i)} r_j),     alpha = B / max(1, #{j in batch : r_j != 0})

B is the number of responses in the batch. Broadcast to every token of y_i. As verl's
``compute_gpg_outcome_advantage`` (with ``f_norm = 1``), except for a group of one response, which gets 0 here
(verl takes a baseline of 0 there).
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import AdvantageSource, RewardBatch
from rlzoo_estimators._util import float_dtype, group_normalise, masked


@rlzoo.register("advantage", "gpg")
class GPGAdvantage(AdvantageSource):
    """GPG: alpha * (r - group mean), alpha = batch size / number of responses with a non-zero reward."""

    formula = "A_i = B / max(1, #(r != 0)) * (r_i - mean_group r)"
    reference = "GPG (Chu et al. 2025, arXiv:2504.02546)"
    needs_groups = True
    verl_name = "adv_estimator=gpg"

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        r = batch.rewards.to(torch.float64).reshape(-1)
        alpha = r.numel() / max(1, int(torch.count_nonzero(r).item()))
        centred = group_normalise(r, batch.group_index, std_normalize=False, unbiased_std=True, eps=0.0)
        dtype = float_dtype(batch.rewards, batch.mask)
        return masked((alpha * centred).to(dtype).unsqueeze(-1).expand(batch.mask.shape), batch.mask)
