"""Sequence ratio with per-token gradients (GSPO-token, Zheng et al. 2025 §4.3).

    log s_{i,t} = sg[log s_i] + logp_{i,t} - sg[logp_{i,t}]

``sg`` is stop-gradient. The value equals the sequence ratio ``log s_i`` at every token, while the gradient
of token t's loss flows only through its own log-prob ``logp_{i,t}``. With an advantage that is uniform over
a response this is identical to GSPO in loss value, clip decisions and gradient.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import RatioEstimator
from rlzoo_estimators._util import masked
from rlzoo_estimators.ratios.sequence import sequence_log_ratio


@rlzoo.register("ratio", "sequence-token")
class SequenceTokenRatio(RatioEstimator):
    """Sequence ratio value with per-token gradients (GSPO-token).

    ``log s_{i,t} = sg[log s_i] + logp_{i,t} - sg[logp_{i,t}]``, for advantages that vary inside a response.
    No parameters.
    """

    formula = "log s_it = sg(log s_i) + logp_t - sg(logp_t)"
    reference = "GSPO-token (Zheng et al. 2025, §4.3)"
    verl_name = "policy_loss.loss_mode=gspo"
    level = "sequence"

    def log_ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seq = sequence_log_ratio(logp.detach(), old_logp, mask)
        return masked(seq + (logp - logp.detach()), mask)
