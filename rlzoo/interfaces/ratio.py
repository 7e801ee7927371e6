"""Ratio estimators: the importance ratio between the policy being trained and the behaviour policy."""

from __future__ import annotations

import torch

from rlzoo.interfaces.base import Component


class RatioEstimator(Component):
    """Maps per-token log-probs to per-token *log* importance ratios.

    ``log_ratio(logp, old_logp, mask)`` takes ``[batch, tokens]`` tensors (``mask`` is 1 on response tokens,
    0 on padding) and returns a ``[batch, tokens]`` log-ratio. A sequence-level estimator returns its one
    value per response broadcast over that response's tokens, so clippers and aggregations see one shape.
    Values at masked-out positions are ignored downstream. The objective clamps the result and exponentiates.

    ``level`` is ``"token"`` or ``"sequence"`` (informational: used in docs and metrics).
    """

    kind = "ratio"
    metric_namespace = "ratio"
    level: str = "token"

    def log_ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
