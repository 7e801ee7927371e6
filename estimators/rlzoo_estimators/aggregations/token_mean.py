"""Token-mean aggregation (DAPO): every response token weighs the same.

    loss = sum_{i,t} m_{i,t} L_{i,t} / sum_{i,t} m_{i,t}

An all-padding batch gives 0.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import LossAggregation
from rlzoo_estimators._util import masked


@rlzoo.register("aggregation", "token-mean")
class TokenMean(LossAggregation):
    """Mean over all response tokens of the batch (DAPO).

    ``loss = sum_{i,t} m L / sum_{i,t} m``. Longer responses weigh more, in proportion to their length. No parameters.
    """

    formula = "sum m L / sum m"
    reference = "DAPO (Yu et al. 2025, arXiv:2503.14476)"
    verl_name = "loss_agg_mode=token-mean"
    trl_name = "loss_type=dapo|bnpo"

    def aggregate(self, per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        total = masked(per_token_loss, mask).sum()
        return total / (mask > 0).sum().clamp(min=1).to(total.dtype)
