"""DPPO-Binary-KL (Divergence Proximal Policy Optimization, arXiv:2602.04879): the trust region of ``dppo-tv`` with
the KL divergence of the binary distributions (the sampled token vs. the rest of the vocabulary) instead of TV.

With ``p_t = exp(logp_t)``, ``q_t = exp(old_logp_t)``:

    D_t     = q_t log(q_t / p_t) + (1 - q_t) log((1 - q_t) / (1 - p_t))          (KL(q || p), binary)
    valid_t = D_t <= eps_high  or  p_t <= q_t     if A_t > 0
              D_t <= eps_low   or  p_t >= q_t     otherwise
    L_t     = -sg(min(rho_t, c)) * A_t * valid_t * log rho_t

so a token is dropped only once it moved past the bound *in the direction its advantage pushes*. As verl
(``compute_policy_loss_dppo_kl``), 1e-8 is added to both ``1 - q`` and ``1 - p`` inside the second logarithm, which
keeps ``D`` finite for a token of probability 1. Ratio form, clip flags and ``clip/truncated_fraction`` as
``dppo-tv`` (the loss value differs from verl's by a gradient-free term; the gradient is verl's with the token
ratio).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params, PolicyBatch
from rlzoo_estimators.clippers.dppo_tv import truncated_masked_loss

#: keeps log((1 - q) / (1 - p)) finite when a probability is 1 (verl's constant)
ONE_MINUS_EPS = 1e-8


def binary_kl(old_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``KL(Bernoulli(q) || Bernoulli(p))`` per token, ``q = exp(old_logp)``, ``p = exp(logp)``."""
    q, p = torch.exp(old_logp), torch.exp(logp)
    return q * (old_logp - logp) + (1.0 - q) * torch.log((1.0 - q + ONE_MINUS_EPS) / (1.0 - p + ONE_MINUS_EPS))


@rlzoo.register("clipper", "dppo-kl")
class DPPOKLClipper(Clipper):
    """DPPO-KL: drop a token's gradient once the binary KL of the sampled token passes the bound A pushes towards."""

    formula = (
        "L = -sg(min(rho, c)) * A * valid * log(rho), valid = D <= eps_high or p <= p_old (A > 0), "
        "D <= eps_low or p >= p_old (A <= 0), D = KL(Bern(p_old) || Bern(p))"
    )
    reference = "DPPO (Divergence Proximal Policy Optimization, arXiv:2602.04879), Binary-KL"
    verl_name = "policy_loss.loss_mode=dppo_kl"

    class Params(Params):
        eps_low: float = Field(0.05, ge=0.0, description="A <= 0: binary KL bound for a token whose probability fell")
        eps_high: float = Field(0.05, ge=0.0, description="A > 0: binary KL bound for a token whose probability rose")
        c: float = Field(20.0, ge=1.0, description="importance weights are truncated at c (verl: clip_ratio_c)")

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        p = self.params
        logp = batch.logp.detach()
        divergence = binary_kl(batch.old_logp, logp)  # [B, T]
        prob, old_prob = torch.exp(logp), torch.exp(batch.old_logp)
        rose, fell = prob >= old_prob, prob <= old_prob
        valid = torch.where(batch.advantages > 0, (divergence <= p.eps_high) | fell, (divergence <= p.eps_low) | rose)
        return truncated_masked_loss(batch, valid, p.c)
