"""Truncated importance sampling for the train-inference mismatch (TIS; Yao et al. 2025, verl / TRL / NeMo-RL).

    token level:     w_t = exp(old_train_t - old_rollout_t)
    sequence level:  w_i = exp( sum_t m_t (old_train_t - old_rollout_t) )      broadcast over the response
    truncate:        w <- min(w, C)
    mask:            w <- w if w <= C else 0        (drop the token / the whole response)

``C`` is ``threshold``. The weights carry no gradient; they multiply the per-token policy loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from rlzoo.interfaces import MismatchCorrection, Params
from rlzoo_estimators._util import MAX_LOG_WEIGHT, masked


class TruncatedIS(MismatchCorrection):
    """Truncated importance sampling min(pi_train/pi_rollout, C), per token or per sequence; truncate or mask."""

    name = "tis"
    formula = "w = min(pi_train/pi_rollout, C) (truncate) or w * 1[w <= C] (mask), per token or sequence"
    reference = "TIS (Yao et al. 2025, Your efficient RL framework secretly brings you off-policy RL training)"
    verl_name = "rollout_is=token|sequence, rollout_is_threshold=C"
    trl_name = "vllm_importance_sampling_mode"

    class Params(Params):
        level: Literal["token", "sequence"] = Field("token", description="one weight per token or per response")
        action: Literal["truncate", "mask"] = Field("truncate", description="cap weights at C, or zero them above C")
        threshold: float = Field(2.0, gt=0.0, description="C, the cap (truncate) or cut-off (mask)")

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        log_w = masked(old_train - old_rollout, mask)
        if self.params.level == "sequence":
            log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
        w = torch.exp(log_w.clamp(max=MAX_LOG_WEIGHT)).detach()
        c = self.params.threshold
        w = w.clamp(max=c) if self.params.action == "truncate" else torch.where(w <= c, w, torch.zeros_like(w))
        return masked(w, mask)
