"""DPPO-Binary-TV (Divergence Proximal Policy Optimization, arXiv:2602.04879): a trust region on the probability
of the sampled token instead of on the ratio.

With ``p_t = exp(logp_t)`` and ``q_t = exp(old_logp_t)`` the sampled token's probability under the trained and the
behaviour policy, ``|p_t - q_t|`` is the total-variation distance between the two binary distributions
(the token vs. the rest of the vocabulary). A token keeps its gradient while the update has not moved it past the
bound in the direction its advantage pushes:

    valid_t = (p_t - q_t <= eps_high)   if A_t > 0
              (p_t - q_t >= -eps_low)   otherwise
    L_t     = -sg(min(rho_t, c)) * A_t * valid_t * log rho_t      (paper, verl: ... * logp_t)

``min(rho_t, c)`` is a truncated importance weight (TIS) replacing dual clip (the paper's §5.4 recommends a large
``c``). Implemented in ratio form, ``L_t = -sg(min(rho_t, c) / rho_t) * rho_t * A_t * valid_t``, whose gradient
``-min(rho_t, c) A_t valid_t grad log rho_t`` is verl's (``compute_policy_loss_dppo_tv``) with the token ratio;
the loss value differs from verl's by a gradient-free term. ``rho`` is the ratio estimator's, so any ratio composes;
the trust region always reads the token probabilities. A token counts as clipped when the region removed its
gradient: high when ``A > 0``, low when ``A < 0`` (verl's ``pg_clipfrac`` also counts masked ``A = 0`` tokens,
which have no gradient). The share of valid tokens whose weight was truncated is ``clip/truncated_fraction``
(verl's ``pg_clipfrac_lower``).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params, PolicyBatch


def truncated_masked_loss(batch: PolicyBatch, valid: torch.Tensor, c: float) -> ClipResult:
    """``-sg(min(rho, c) / rho) * rho * A * valid`` with the clip flags of the tokens ``valid`` drops (DPPO's loss
    around either trust region)."""
    rho, adv, keep = batch.ratio, batch.advantages, batch.mask > 0
    r = rho.detach()
    weight = torch.where(valid, r.clamp(max=c) / r, torch.zeros_like(r))
    loss = -weight * rho * adv
    dropped = ~valid & keep
    truncated = (r > c) & valid & keep
    share = truncated.sum().item() / max(int(keep.sum().item()), 1)
    return ClipResult(
        loss=loss,
        clipped_low=dropped & (adv < 0),
        clipped_high=dropped & (adv > 0),
        metrics={"clip/truncated_fraction": share},
    )


@rlzoo.register("clipper", "dppo-tv")
class DPPOTVClipper(Clipper):
    """DPPO-TV: drop a token's gradient once |p - p_old| of the sampled token passes the bound A pushes towards."""

    formula = (
        "L = -sg(min(rho, c)) * A * valid * log(rho), valid = p - p_old <= eps_high (A > 0) "
        "or p - p_old >= -eps_low (A <= 0), p = exp(logp)"
    )
    reference = "DPPO (Divergence Proximal Policy Optimization, arXiv:2602.04879), Binary-TV"
    verl_name = "policy_loss.loss_mode=dppo_tv"

    class Params(Params):
        eps_low: float = Field(
            0.15, ge=0.0, le=1.0, description="A <= 0: a token whose probability fell by more than this is dropped"
        )
        eps_high: float = Field(
            0.15, ge=0.0, le=1.0, description="A > 0: a token whose probability rose by more than this is dropped"
        )
        c: float = Field(20.0, ge=1.0, description="importance weights are truncated at c (verl: clip_ratio_c)")

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        p = self.params
        shift = torch.exp(batch.logp.detach()) - torch.exp(batch.old_logp)  # [B, T]
        valid = torch.where(batch.advantages > 0, shift <= p.eps_high, shift >= -p.eps_low)
        return truncated_masked_loss(batch, valid, p.c)
