"""IcePop (Ling Team, Ring-1T 2025; verl's two-sided ``rollout_is_threshold="low_high"``): keep the
importance weight of tokens whose train-inference ratio is moderate, drop the rest.

    token level:     w_t = exp(old_train_t - old_rollout_t)
    sequence level:  w_i = exp( sum_t m_t (old_train_t - old_rollout_t) )      broadcast over the response
    w <- w if low <= w <= high else 0

The log-weight is clamped to +-20 before exp (verl's safety bound). The weights carry no gradient; they multiply
the per-token policy loss, so a dropped token contributes nothing (its weight is 0, but it stays in the loss's
denominators, as in verl). As verl's ``compute_rollout_correction_weights`` with a ``"low_high"`` threshold, and
``tis`` with ``action: mask, low: low, threshold: high``. Reports ``oob_fraction``, the share of response tokens
dropped (verl's ``rollout_is_oob_ratio``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

import rlzoo
from rlzoo.interfaces import MismatchCorrection, Params
from rlzoo_estimators._util import MAX_LOG_WEIGHT, masked, token_fraction


@rlzoo.register("correction", "icepop")
class IcePop(MismatchCorrection):
    """IcePop: weight pi_train/pi_rollout where it lies in [low, high], 0 outside (the token is dropped)."""

    formula = "w = exp(old_train - old_rollout) if low <= w <= high else 0"
    reference = "IcePop (Ling Team 2025, Ring-1T report)"
    verl_name = "rollout_is_threshold='low_high'"

    class Params(Params):
        low: float = Field(0.5, gt=0.0, description="weights below low are zeroed")
        high: float = Field(5.0, gt=0.0, description="weights above high are zeroed")
        level: Literal["token", "sequence"] = Field("token", description="one weight per token or per response")

        @model_validator(mode="after")
        def _ordered(self) -> IcePop.Params:
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
            return self

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        log_w = masked(old_train - old_rollout, mask)
        if self.params.level == "sequence":
            log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
        w = torch.exp(log_w.clamp(-MAX_LOG_WEIGHT, MAX_LOG_WEIGHT)).detach()
        kept = (w >= self.params.low) & (w <= self.params.high)
        self.report("oob_fraction", token_fraction(~kept, mask))
        return masked(torch.where(kept, w, torch.zeros_like(w)), mask)
