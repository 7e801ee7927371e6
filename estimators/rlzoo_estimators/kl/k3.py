"""k3 KL estimator (Schulman 2020; GRPO's KL term).

    k3 = q/p - 1 - log(q/p) = exp(ref_logp - logp) - 1 - (ref_logp - logp)

Unbiased for KL(p || q) at samples from p, low-variance and never negative.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import KLEstimator


@rlzoo.register("kl", "k3")
class K3(KLEstimator):
    """k3 = exp(ref - logp) - 1 - (ref - logp) (unbiased, low variance, non-negative; GRPO).

    No parameters.
    """

    formula = "k3 = exp(ref - logp) - 1 - (ref - logp)"
    reference = "Schulman 2020; GRPO (Shao et al. 2024)"
    verl_name = "kl_loss_type=low_var_kl"
    trl_name = "beta"

    def estimate(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        log_q_over_p = ref_logp - logp
        return torch.expm1(log_q_over_p) - log_q_over_p
