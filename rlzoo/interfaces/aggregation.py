"""Loss aggregations: reduce a ``[batch, tokens]`` per-token loss to a scalar."""

from __future__ import annotations

import torch

from rlzoo.interfaces.base import Component


class LossAggregation(Component):
    """``aggregate(per_token_loss, mask) -> scalar``. Masked-out positions must not contribute."""

    kind = "aggregation"
    metric_namespace = "aggregation"

    def aggregate(self, per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
