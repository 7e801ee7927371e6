"""Seq-mean-token-sum-norm aggregation (Dr.GRPO): token sums divided by a constant.

    loss = sum_{i,t} m_{i,t} L_{i,t} / (B * T_max)

B is the number of responses in the batch and T_max a fixed constant (``max_tokens``; by default the padded
width of the batch, ``mask.shape[1]``), so no response's gradient is scaled by its own length.
"""

from __future__ import annotations

import torch
from pydantic import Field

from rlzoo.interfaces import LossAggregation, Params
from rlzoo_estimators._util import masked


class SeqMeanTokenSumNorm(LossAggregation):
    """Token-loss sum over a constant B*T_max (Dr.GRPO).

    ``loss = sum_{i,t} m L / (B * T_max)``; ``T_max`` is ``max_tokens`` (set it to the
    generation budget for a normaliser that is constant across batches) or, if unset, the batch's padded width.
    """

    name = "seq-mean-token-sum-norm"

    class Params(Params):
        max_tokens: int | None = Field(
            None, ge=1, description="the constant T_max; null uses the batch's padded width mask.shape[1]"
        )

    def aggregate(self, per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch_size = mask.shape[0]
        t_max = self.params.max_tokens if self.params.max_tokens is not None else mask.shape[1]
        total = masked(per_token_loss, mask).sum()
        return total / max(batch_size * t_max, 1)
