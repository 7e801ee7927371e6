"""Unclipped value loss: the plain squared error of the critic's values against the returns.

    L_t = 0.5 * (v - R)^2

``v`` the critic's current values, ``R`` the returns (the advantage source's targets); the old values are not used
and nothing is clipped. verl's ``compute_value_loss`` with an unbounded ``cliprange_value``. 0 at masked positions,
where neither the loss nor its gradient sees the values.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import ValueLoss, ValueLossResult
from rlzoo_estimators._util import masked


@rlzoo.register("value_loss", "unclipped")
class UnclippedValueLoss(ValueLoss):
    """Unclipped value loss: 0.5 (v - R)^2 (plain regression onto the returns).

    No parameters.
    """

    formula = "L = 0.5 (v - R)^2"
    reference = "Actor-critic value regression (Mnih et al. 2016, A3C); verl compute_value_loss without clipping"

    def loss(
        self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
    ) -> ValueLossResult:
        diff = masked(values, mask) - masked(returns, mask)
        per_token = 0.5 * diff**2
        return ValueLossResult(per_token=masked(per_token, mask), clipped=torch.zeros_like(mask, dtype=torch.bool))
