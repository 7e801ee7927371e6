"""Regularisers: extra loss terms on the policy itself, added to the composed objective's loss.

``loss(logp, entropy, mask, aggregation)`` returns a scalar added to the loss, all tensors ``[batch, tokens]``
with ``mask`` 1 on response tokens; ``aggregation`` is the configured loss aggregation, so a per-token term is
reduced the same way as the policy loss. ``entropy`` is the per-token entropy of the full next-token distribution
(with gradient) when the regulariser declares ``needs_entropy``, else ``None``; the training engine computes it
only then.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from rlzoo.interfaces.aggregation import LossAggregation
from rlzoo.interfaces.base import Component


class Regulariser(Component):
    """``loss(logp, entropy, mask, aggregation) -> scalar`` added to the loss (with its metrics)."""

    kind = "regulariser"
    metric_namespace = "regulariser"
    #: the term needs the per-token entropy H_t (the engine then computes it in the update pass)
    needs_entropy: ClassVar[bool] = False

    def loss(
        self, logp: torch.Tensor, entropy: torch.Tensor | None, mask: torch.Tensor, aggregation: LossAggregation
    ) -> torch.Tensor:
        raise NotImplementedError
