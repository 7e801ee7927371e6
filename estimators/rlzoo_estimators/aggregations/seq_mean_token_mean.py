"""Seq-mean-token-mean aggregation (GRPO, GSPO): mean over responses of each response's token mean.

    loss = mean_{i : |y_i| > 0} ( sum_t m_{i,t} L_{i,t} / |y_i| ),   |y_i| = sum_t m_{i,t}

Every response weighs the same regardless of its length. Responses without any token (all padding) are left
out of the mean; an all-padding batch gives 0.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import LossAggregation
from rlzoo_estimators._util import masked


@rlzoo.register("aggregation", "seq-mean-token-mean")
class SeqMeanTokenMean(LossAggregation):
    """Mean over responses of each response's token mean (GRPO, GSPO).

    ``loss = mean_i (sum_t m_{i,t} L_{i,t} / |y_i|)``.
    Responses with no tokens are left out of the mean. No parameters.
    """

    formula = "mean over non-empty rows of sum_t m L / |y_i|"
    reference = "GRPO (Shao et al. 2024)"
    verl_name = "loss_agg_mode=seq-mean-token-mean"
    trl_name = "loss_type=grpo"

    def aggregate(self, per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        sums = masked(per_token_loss, mask).sum(dim=-1)
        lengths = (mask > 0).sum(dim=-1)
        per_seq = sums / lengths.clamp(min=1).to(sums.dtype)
        nonempty = lengths > 0
        return masked(per_seq, nonempty).sum() / nonempty.sum().clamp(min=1).to(sums.dtype)
