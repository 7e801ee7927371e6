"""A clipper that caps the importance weight but never removes a token's gradient (CISPO-style)."""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params


@rlzoo.register("clipper", "capped-is")
class CappedISClipper(Clipper):
    """Capped importance weight, gradient kept on every token: loss = -sg(clip(rho)/rho) * rho * A.

    ``w = clip(rho, 1 - eps_low, 1 + eps_high)``; the loss value is ``-w A`` and its gradient is
    ``-w A * d log(rho)``, so a token outside the range is down-weighted, never dropped. No token loses its
    gradient, so both clip flags are always false.
    """

    class Params(Params):
        eps_low: float = Field(0.2, ge=0.0, le=1.0, description="weights below 1 - eps_low are raised to it")
        eps_high: float = Field(0.2, ge=0.0, description="weights above 1 + eps_high are capped at it")

        @model_validator(mode="after")
        def _a_range(self) -> CappedISClipper.Params:
            # what pydantic's field bounds cannot say is checked here: the config names the field
            if self.eps_low == 0.0 and self.eps_high == 0.0:
                raise ValueError("eps_low and eps_high are both 0: every weight would be 1; use the 'none' clipper")
            return self

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        p = self.params
        capped = ratio.clamp(1.0 - p.eps_low, 1.0 + p.eps_high)
        scale = (capped / ratio).detach()
        never = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipResult(loss=-(scale * ratio * advantages), clipped_low=never, clipped_high=never)
