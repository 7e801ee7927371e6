"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"): a KL penalty on the few tokens
with the largest advantage-logp covariance, the tokens whose updates collapse the policy's entropy.

    L_t = -A_t * rho_t                                              (no clip)
    c_t = (A_t - mean A) * (logp_t - mean logp)                     (means over the valid tokens of the batch)
    L_t += kl_coef * |logp_t - old_t|   for the top k = max(1, floor(N * select_fraction)) valid tokens by c_t

``N`` is the number of valid tokens of the batch the loss is computed on; ``c_t`` carries no gradient. As verl's
``compute_policy_loss_kl_cov`` (``kl_cov_ratio``, ``ppo_kl_coef``). Nothing counts as clipped; the share of
penalised tokens is reported as ``clip/cov_fraction``.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params, PolicyBatch
from rlzoo_estimators._util import token_covariance


def select_count(mask: torch.Tensor, fraction: float) -> int:
    """``max(1, floor(N * fraction))`` with ``N`` the valid tokens of the batch (0 when there are none)."""
    n = int((mask > 0).sum().item())
    return max(1, int(n * fraction)) if n else 0


@rlzoo.register("clipper", "kl-cov")
class KLCovClipper(Clipper):
    """KL-Cov: -A*rho, plus kl_coef*|logp - old| on the top covariance tokens (entropy-preserving)."""

    formula = (
        "L = -A*rho + kl_coef*|logp - old| on the top max(1, N*select_fraction) tokens by (A-mean A)(logp-mean logp)"
    )
    reference = "Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617)"
    verl_name = "policy_loss.loss_mode=kl_cov"

    class Params(Params):
        select_fraction: float = Field(
            0.0002, gt=0.0, le=1.0, description="share of valid tokens penalised (verl: kl_cov_ratio)"
        )
        kl_coef: float = Field(1.0, ge=0.0, description="coefficient of |logp - old| (verl: ppo_kl_coef)")

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        mask = batch.mask
        keep = mask > 0
        loss = -batch.advantages * batch.ratio
        selected = torch.zeros_like(keep)
        k = select_count(mask, self.params.select_fraction)
        if k:
            cov = token_covariance(batch.advantages, batch.logp, mask)
            cov = torch.where(keep, cov, torch.full_like(cov, -torch.inf))
            top = torch.topk(cov.reshape(-1), k).indices
            selected.view(-1)[top] = True
        penalty = self.params.kl_coef * (batch.logp - batch.old_logp).abs()
        loss = torch.where(selected, loss + penalty, loss)
        never = torch.zeros_like(keep)
        share = selected.sum().item() / max(int(keep.sum().item()), 1)
        metrics = {"clip/cov_fraction": share}
        return ClipResult(loss=loss, clipped_low=never, clipped_high=never.clone(), metrics=metrics)
