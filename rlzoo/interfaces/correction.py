"""Train-inference mismatch corrections: per-token weights for the rollout engine's sampling distribution.

The rollout engine (vLLM, bf16 kernels...) samples from a slightly different distribution than the training
engine computes. With ``old_train`` the training engine's log-probs of the sampled tokens under the old weights
and ``old_rollout`` the rollout engine's, a correction returns weights ``w`` (no gradient) that multiply the
per-token policy loss, e.g. truncated importance sampling ``w = min(exp(old_train - old_rollout), C)``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from rlzoo.interfaces.base import Component


class MismatchCorrection(Component):
    """``weights(old_train, old_rollout, mask) -> [batch, tokens]`` loss multipliers (1 = no correction)."""

    kind = "correction"
    #: whether :meth:`weights` depends on ``old_train``; a correction that does not allows
    #: ``algorithm.old_logprobs: rollout-only`` (no training-engine pass to compute it from)
    reads_train_logprobs: ClassVar[bool] = True

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
