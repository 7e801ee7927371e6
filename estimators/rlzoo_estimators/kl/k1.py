"""k1 KL estimator (Schulman 2020): the plain log-ratio.

    k1 = log(p/q) = logp - ref_logp

Unbiased for KL(p || q) at samples from p, but high-variance and can be negative.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import KLEstimator


@rlzoo.register("kl", "k1")
class K1(KLEstimator):
    """k1 = logp - ref_logp (unbiased, high variance, can be negative).

    No parameters.
    """

    formula = "k1 = logp - ref"
    reference = "Schulman 2020, Approximating KL divergence"
    verl_name = "kl_loss_type=k1"

    def estimate(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        return logp - ref_logp
