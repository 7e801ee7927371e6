"""The reference KL as a per-token reward penalty (verl's ``use_kl_in_reward``; Ziegler et al. 2019).

    KL_t        = kl.estimate(old_logp, ref_logp) on response tokens (0 elsewhere)    (estimator: algorithm.kl)
    r_t        <- r_t - beta * KL_t,        beta = controller.coef                     (before advantages)
    current_kl  = mean over responses of the per-response mean KL_t
    controller.update(current_kl, n_steps = number of responses)

as verl's ``apply_kl_penalty``; metrics ``kl/coef`` (the beta the batch was penalised with) and ``kl/in_reward``
(``current_kl``). The KL-in-loss term (``algorithm.kl_coef``) is independent of this one; both may be on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlzoo.interfaces import KLController, KLEstimator
from rlzoo.interfaces.base import collecting


@dataclass
class KLInReward:
    controller: KLController
    estimator: KLEstimator

    def penalise(
        self, token_rewards: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``token_rewards - beta * KL`` and the metrics; the controller is updated with the batch's KL."""
        if ref_logp is None:
            raise ValueError("the KL in the reward needs the reference policy's log-probs (ref_logp)")
        keep = mask > 0
        with torch.no_grad():
            kl = self.estimator.estimate(old_logp.double(), ref_logp.double())
            kl = torch.where(keep, kl, torch.zeros_like(kl))
        beta = self.controller.coef
        penalised = token_rewards - (beta * kl).to(token_rewards.dtype)
        per_response = kl.sum(-1) / keep.sum(-1).clamp(min=1)
        current_kl = per_response.mean().item() if len(per_response) else 0.0
        with collecting() as reports:  # the controller's, of this update
            self.controller.update(current_kl, n_steps=len(per_response))
        return penalised, {"kl/coef": beta, "kl/in_reward": current_kl, **reports}
