"""Tensor helpers shared by the RL step's modules: means over a response mask."""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``mask > 0`` (0 when nothing is kept), whatever the padded positions hold."""
    keep = mask > 0
    # where(), not a product: a non-finite value at a padded position must not turn the mean into NaN
    return torch.where(keep, values, torch.zeros_like(values)).sum() / keep.sum().clamp(min=1)
