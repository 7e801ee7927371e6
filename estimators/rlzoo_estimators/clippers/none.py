"""No clipping: the plain importance-weighted policy-gradient surrogate.

    loss_{i,t} = -rho_{i,t} A_{i,t}

Nothing is ever counted as clipped.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult


@rlzoo.register("clipper", "none")
class NoClipper(Clipper):
    """No clipping: loss = -rho*A (plain importance-weighted policy gradient).

    Both clip flags are always false. No parameters.
    """

    formula = "L = -rho A"
    reference = "importance-weighted policy gradient"

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        never = torch.zeros(ratio.shape, dtype=torch.bool, device=ratio.device)
        return ClipResult(loss=-(ratio * advantages), clipped_low=never, clipped_high=never.clone())
