"""KL estimators: per-token estimates of KL(policy || reference) from sampled-token log-probs."""

from __future__ import annotations

import torch

from rlzoo.interfaces.base import Component


class KLEstimator(Component):
    """``estimate(logp, ref_logp) -> [batch, tokens]`` per-token KL estimate (p = policy, q = reference).

    Tokens are sampled from the (old) policy, so ``log(p/q) = logp - ref_logp`` at the sampled token.
    """

    kind = "kl"
    metric_namespace = "kl"

    def estimate(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
