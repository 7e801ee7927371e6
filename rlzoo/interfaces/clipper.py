"""Clippers: turn ratios and advantages into a per-token surrogate loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlzoo.interfaces.base import Component


@dataclass
class ClipResult:
    """Per-token outputs of a clipper, all ``[batch, tokens]``.

    loss:         the surrogate to *minimise* (the negated objective), per token.
    clipped_low:  bool, the clip removed this token's gradient because the ratio fell below the lower bound.
    clipped_high: bool, the clip removed this token's gradient because the ratio rose above the upper bound
                  (for dual clip this includes tokens held by the ``c*|A|`` bound).
    """

    loss: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor


class Clipper(Component):
    """``clip(ratio, advantages) -> ClipResult``; ``ratio`` and ``advantages`` are ``[batch, tokens]``."""

    kind = "clipper"

    def clip(self, ratio: torch.Tensor, advantages: torch.Tensor) -> ClipResult:
        raise NotImplementedError
