"""k2 KL estimator (Schulman 2020): half the squared log-ratio.

    k2 = 0.5 * (log(p/q))^2 = 0.5 * (logp - ref_logp)^2

Biased but low-variance and never negative; its gradient is that of the reverse KL at samples from p.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import KLEstimator


@rlzoo.register("kl", "k2")
class K2(KLEstimator):
    """k2 = 0.5 * (logp - ref_logp)^2 (biased, low variance, non-negative).

    No parameters.
    """

    formula = "k2 = (logp - ref)^2 / 2"
    reference = "Schulman 2020, Approximating KL divergence"
    verl_name = "kl_loss_type=mse"

    def estimate(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        return 0.5 * (logp - ref_logp).square()
