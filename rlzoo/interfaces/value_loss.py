"""Value losses: how the critic regresses its values onto the advantage source's returns.

``loss(values, old_values, returns, mask)`` returns the per-token loss (``[batch, tokens]``, with gradient through
``values``) and where the clipped term was the one used; the core aggregates the per-token loss with the critic's
aggregation (``algorithm.critic.aggregation``) and logs ``critic/vf_loss`` and ``critic/vf_clipfrac``.
``old_values`` are the critic's values when the rollout batch was collected (before this step's critic updates).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlzoo.interfaces.base import Component


@dataclass
class ValueLossResult:
    """``per_token``: ``[batch, tokens]`` loss (0.5 x squared error for the PPO losses); ``clipped``: bool
    ``[batch, tokens]``, True where the clipped term was larger and so used (all False for unclipped losses)."""

    per_token: torch.Tensor
    clipped: torch.Tensor


class ValueLoss(Component):
    """``loss(values, old_values, returns, mask) -> ValueLossResult``."""

    kind = "value_loss"
    metric_namespace = "critic"

    def loss(
        self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
    ) -> ValueLossResult:
        raise NotImplementedError
