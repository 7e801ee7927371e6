"""GMPO (Geometric-Mean Policy Optimization, Zhao et al. 2025): clip token log-ratios, then take their geometric mean.

Per token a sign-aware clip in log space (``l_t`` is the ratio estimator's log-ratio, ``log rho_t``):

    l~_t = sgn(A_t) * min(sgn(A_t) * l_t, sgn(A_t) * clamp(l_t, -eps_low, eps_high))

per response the geometric mean of the clipped token ratios and the masked mean advantage,

    s_i = exp( sum_t m_t l~_t / |y_i| ),      Abar_i = sum_t m_t A_t / |y_i|,      L_i = -Abar_i * s_i

and ``L_i`` is returned at every token of ``y_i``, so a seq-mean aggregation gives verl's mean over rows
(``compute_policy_loss_geo_mean``; verl averages over every row, rlzoo's seq-mean aggregations over the non-empty
ones). The clip needs the advantage's sign *before* the sequence mean, hence ``clip_batch``. A token counts as
clipped when the clip removed its gradient: high when ``A > 0`` and ``l_t > eps_high``, low when ``A < 0`` and
``l_t < -eps_low`` (verl's clip fraction also counts tokens outside the range on the side the min ignores).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import Clipper, ClipResult, Params, PolicyBatch
from rlzoo_estimators._util import masked


@rlzoo.register("clipper", "gmpo")
class GMPOClipper(Clipper):
    """GMPO: -mean_t(A) * exp(mean_t of sign-aware clipped log-ratios), one loss per response."""

    formula = "L_i = -Abar_i * exp(mean_t sgn(A) min(sgn(A) l_t, sgn(A) clamp(l_t, -eps_low, eps_high)))"
    reference = "GMPO (Zhao et al. 2025, arXiv:2507.20673)"
    verl_name = "policy_loss.loss_mode=geo_mean"

    class Params(Params):
        eps_low: float = Field(0.4, ge=0.0, description="token log-ratios below -eps_low are clipped (A < 0)")
        eps_high: float = Field(0.4, ge=0.0, description="token log-ratios above eps_high are clipped (A > 0)")

    def clip_batch(self, batch: PolicyBatch) -> ClipResult:
        p = self.params
        log_ratio, adv, mask = batch.log_ratio, batch.advantages, batch.mask
        sign = torch.sign(adv)
        clamped = log_ratio.clamp(-p.eps_low, p.eps_high)
        clipped_log = sign * torch.minimum(sign * log_ratio, sign * clamped)
        lengths = (mask > 0).sum(dim=-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
        seq_ratio = torch.exp(masked(clipped_log, mask).sum(dim=-1, keepdim=True) / lengths)
        seq_adv = masked(adv, mask).sum(dim=-1, keepdim=True) / lengths
        loss = masked((-seq_adv * seq_ratio).expand_as(log_ratio), mask)
        lr = log_ratio.detach()
        low, high = (adv < 0) & (lr < -p.eps_low), (adv > 0) & (lr > p.eps_high)
        return ClipResult(loss=loss, clipped_low=low, clipped_high=high)
