"""Token-level importance ratio (PPO / GRPO / DAPO).

    log w_{i,t} = logp_{i,t} - old_{i,t}

Each token carries its own ratio. Padding positions get log-ratio 0 (ratio 1).
"""

from __future__ import annotations

import torch

from rlzoo.interfaces import RatioEstimator
from rlzoo_estimators._util import masked


class TokenRatio(RatioEstimator):
    """Per-token ratio exp(logp - old) (PPO, GRPO, DAPO).

    ``log w_{i,t} = logp_{i,t} - old_{i,t}``. No parameters.
    """

    name = "token"
    level = "token"

    def log_ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked(logp - old_logp, mask)
