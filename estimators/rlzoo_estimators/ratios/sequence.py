"""Sequence-level importance ratio (GSPO, Zheng et al. 2025).

    log s_i = sum_t m_{i,t} (logp_{i,t} - old_{i,t}) / max(|y_i|, 1),   |y_i| = sum_t m_{i,t}

the length-normalised log of the geometric mean of the token ratios, broadcast over the tokens of y_i.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import RatioEstimator
from rlzoo_estimators._util import masked


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[batch, 1]`` length-normalised sequence log-ratio ``log s_i`` (0 for an empty response)."""
    lengths = (mask > 0).sum(dim=-1, keepdim=True).clamp(min=1).to(logp.dtype)
    return masked(logp - old_logp, mask).sum(dim=-1, keepdim=True) / lengths


@rlzoo.register("ratio", "sequence")
class SequenceRatio(RatioEstimator):
    """Length-normalised sequence ratio, one per response (GSPO).

    ``log s_i = sum_t m_{i,t} (logp_{i,t} - old_{i,t}) / |y_i|``, the same value at every token of ``y_i``;
    the gradient of every token's loss flows through all tokens of the response. No parameters.
    """

    formula = "log s_i = sum_t m (logp - old) / |y_i|, one value per response"
    reference = "GSPO (Zheng et al. 2025, arXiv:2507.18071)"
    trl_name = "importance_sampling_level=sequence"
    level = "sequence"

    def log_ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked(sequence_log_ratio(logp, old_logp, mask).expand_as(logp), mask)
