"""PPO's clipped value loss: the critic's new value may move at most ``clip_range`` from its old value for free.

    v_clip = clip(v, v_old - c, v_old + c)
    L_t    = 0.5 * max((v - R)^2, (v_clip - R)^2)
    clipped_t = (v_clip - R)^2 > (v - R)^2

``v`` the critic's current values, ``v_old`` its values when the batch was collected, ``R`` the returns (the
advantage source's targets), ``c = clip_range``. As verl's ``compute_value_loss`` (``critic.cliprange_value``): its
``vf_loss`` is the aggregation of ``L`` and its ``vf_clipfrac`` the masked mean of ``clipped``. 0 at masked
positions, where neither the loss nor its gradient sees the values.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, ValueLoss, ValueLossResult
from rlzoo_estimators._util import masked


@rlzoo.register("value_loss", "clipped")
class ClippedValueLoss(ValueLoss):
    """Clipped value loss: 0.5 max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2), as PPO's critic.

    ``clipped`` marks the tokens where the clipped term was the larger one.
    """

    formula = "L = 0.5 max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)"
    reference = "PPO value clipping (Schulman et al. 2017, OpenAI baselines ppo2); verl compute_value_loss"
    verl_name = "critic.cliprange_value"

    class Params(Params):
        clip_range: float = Field(
            0.5, ge=0.0, description="how far the value may move from the old value before the clipped term applies"
        )

    def loss(
        self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
    ) -> ValueLossResult:
        c = self.params.clip_range
        v, old, target = masked(values, mask), masked(old_values, mask), masked(returns, mask)
        v_clip = torch.clamp(v, min=old - c, max=old + c)
        unclipped = (v - target) ** 2
        clipped = (v_clip - target) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        return ValueLossResult(per_token=masked(per_token, mask), clipped=(clipped > unclipped) & (mask > 0))
