"""DRO (Direct Reward Optimisation, Richemond et al. 2024) as verl's policy loss: the policy gradient with a
quadratic penalty on the log-ratio instead of a clip (DRO's mean-squared regularised objective, with the advantage in
place of its learned value baseline).

    L_t = -(A_t * log rho_t - (beta / 2) * (log rho_t)^2)          (verl: -(A_t logp_t - ...))

``log rho`` is the ratio estimator's log-ratio (after the objective's clamp). Its gradient
``-(A_t - beta log rho_t) grad log rho_t`` is verl's (``compute_policy_loss_dro``, ``policy_loss.dro_beta``) with
the token ratio; the loss value differs from verl's by ``-A_t * old_logp_t``, a gradient-free term. The penalty pulls
every token back towards the behaviour policy, also where ``A = 0`` (padding is masked by the aggregation). Nothing
counts as clipped.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params, PolicyBatch


@rlzoo.register("clipper", "dro")
class DROClipper(Clipper):
    """DRO: -(A * log rho - beta/2 * (log rho)^2), a quadratic trust region on the log-ratio, no clip."""

    formula = "L = -(A * log(rho) - beta/2 * log(rho)^2)"
    reference = "DRO (Richemond et al. 2024, Offline Regularised RL for LLM Alignment, arXiv:2405.19107)"
    verl_name = "policy_loss.loss_mode=dro"

    class Params(Params):
        beta: float = Field(
            0.05, gt=0.0, description="weight of the quadratic log-ratio penalty (verl: policy_loss.dro_beta, required)"
        )

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        log_rho = batch.log_ratio
        loss = -(batch.advantages * log_rho - 0.5 * self.params.beta * log_rho.square())
        never = torch.zeros(loss.shape, dtype=torch.bool, device=loss.device)
        return ClipResult(loss=loss, clipped_low=never, clipped_high=never.clone())
