"""No train-inference correction: every weight is 1."""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import MismatchCorrection


@rlzoo.register("correction", "none")
class NoCorrection(MismatchCorrection):
    """No correction: w = 1 (trust the rollout engine's samples as the old policy's)."""

    formula = "w = 1"
    reads_train_logprobs = False

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(old_train)
