"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"): the PPO clip, plus detaching a
few random tokens of high advantage-logp covariance, the tokens whose updates collapse the policy's entropy.

    L_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)          (PPO)
    c_t = (A_t - mean A) * (logp_t - mean logp)                                  (means over the valid tokens)
    candidates: valid tokens the PPO clip left alone with lb < c_t < ub
    max(1, floor(N * select_fraction)) candidates, drawn at random, get L_t <- 0 * L_t (no value, no gradient)

The draw uses the generator of :class:`~rlzoo.interfaces.PolicyBatch` (seeded from the run's seed and step).
As verl's ``compute_policy_loss_clip_cov`` (``clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub``).
``clip/fraction`` counts the PPO-clipped tokens; the zeroed share is ``clip/cov_fraction`` (verl reports that
one as its ``pg_clipfrac``).
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, PolicyBatch
from rlzoo_estimators._util import token_covariance
from rlzoo_estimators.clippers.kl_cov import select_count
from rlzoo_estimators.clippers.ppo import PPOParams, ppo_clip_flags, ppo_objective


@rlzoo.register("clipper", "clip-cov")
class ClipCovClipper(Clipper):
    """Clip-Cov: PPO clip, and a random few tokens with lb < (A-mean A)(logp-mean logp) < ub get no gradient."""

    formula = (
        "PPO clip; max(1, N*select_fraction) random unclipped tokens with lb < (A-mean A)(logp-mean logp) < ub "
        "get L = 0"
    )
    reference = "Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617)"
    verl_name = "policy_loss.loss_mode=clip_cov"

    class Params(PPOParams):
        select_fraction: float = Field(
            0.0002, gt=0.0, le=1.0, description="share of valid tokens detached (verl: clip_cov_ratio)"
        )
        lb: float = Field(1.0, description="candidates have covariance above lb (verl: clip_cov_lb)")
        ub: float = Field(5.0, description="candidates have covariance below ub (verl: clip_cov_ub)")

        @model_validator(mode="after")
        def _bounds_ordered(self) -> ClipCovClipper.Params:
            if self.lb >= self.ub:
                raise ValueError(f"lb ({self.lb}) must be below ub ({self.ub})")
            return self

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        p = self.params
        ratio, adv, mask = batch.ratio, batch.advantages, batch.mask
        keep = mask > 0
        low, high = ppo_clip_flags(ratio, adv, p.eps_low, p.eps_high)
        cov = token_covariance(adv, batch.logp, mask)
        candidates = torch.nonzero((keep & ~(low | high) & (cov > p.lb) & (cov < p.ub)).reshape(-1)).reshape(-1)
        k = min(select_count(mask, p.select_fraction), candidates.numel())
        zeroed = torch.zeros_like(keep)
        if k:
            order = torch.randperm(candidates.numel(), generator=batch.generator, device=candidates.device)
            zeroed.view(-1)[candidates[order[:k]]] = True
        loss = -ppo_objective(ratio, adv, p.eps_low, p.eps_high)
        loss = torch.where(zeroed, loss * 0.0, loss)
        share = zeroed.sum().item() / max(int(keep.sum().item()), 1)
        return ClipResult(loss=loss, clipped_low=low, clipped_high=high, metrics={"clip/cov_fraction": share})
