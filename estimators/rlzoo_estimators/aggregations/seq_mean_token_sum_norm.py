"""Seq-mean-token-sum-norm aggregation (Dr.GRPO): token sums divided by a constant length.

    loss = sum_{i,t} m_{i,t} L_{i,t} / (B' * T_max)

B' is the number of responses with at least one token (as verl's ``agg_loss``: an all-padding row counts for
nothing) and T_max a fixed constant (``max_tokens``; by default the padded width of the batch, ``mask.shape[1]``),
so no response's gradient is scaled by its own length. An all-padding batch gives 0.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import LossAggregation, Params
from rlzoo_estimators._util import masked


@rlzoo.register("aggregation", "seq-mean-token-sum-norm")
class SeqMeanTokenSumNorm(LossAggregation):
    """Token-loss sum over a constant B*T_max (Dr.GRPO).

    ``loss = sum_{i,t} m L / (B * T_max)`` with B the non-empty responses; ``T_max`` is ``max_tokens`` (set it to
    the generation budget for a normaliser that is constant across batches) or, if unset, the batch's padded width.
    """

    formula = "sum m L / (non-empty rows * T_max)"
    reference = "Dr.GRPO (Liu et al. 2025, arXiv:2503.20783)"
    verl_name = "loss_agg_mode=seq-mean-token-sum-norm"
    trl_name = "loss_type=dr_grpo"

    class Params(Params):
        max_tokens: int | None = Field(
            None, ge=1, description="the constant T_max; null uses the batch's padded width mask.shape[1]"
        )

    def aggregate(self, per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = int(((mask > 0).sum(dim=-1) > 0).sum().item())
        t_max = self.params.max_tokens if self.params.max_tokens is not None else mask.shape[1]
        total = masked(per_token_loss, mask).sum()
        return total / max(rows * t_max, 1)
