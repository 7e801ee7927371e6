"""Seq-mean-token-sum aggregation: mean over responses of each response's token-loss sum.

    loss = mean_{i : |y_i| > 0} sum_t m_{i,t} L_{i,t}

Longer responses weigh more, in proportion to their length, and the scale grows with the response length.
Responses without any token are left out of the mean (as verl's ``agg_loss``); an all-padding batch gives 0.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import LossAggregation
from rlzoo_estimators._util import masked


@rlzoo.register("aggregation", "seq-mean-token-sum")
class SeqMeanTokenSum(LossAggregation):
    """Mean over responses of each response's token-loss sum.

    ``loss = mean_i sum_t m_{i,t} L_{i,t}`` over the non-empty responses. No parameters.
    """

    formula = "mean over non-empty rows of sum_t m L"
    reference = "verl agg_loss"
    verl_name = "loss_agg_mode=seq-mean-token-sum"

    def aggregate(self, per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        sums = masked(per_token_loss, mask).sum(dim=-1)
        nonempty = (mask > 0).sum(dim=-1) > 0
        return masked(sums, nonempty).sum() / nonempty.sum().clamp(min=1).to(sums.dtype)
