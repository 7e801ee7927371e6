"""Token-level importance ratio (PPO / GRPO / DAPO).

    log w_{i,t} = logp_{i,t} - old_{i,t}

Each token carries its own ratio. Padding positions get log-ratio 0 (ratio 1).
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import RatioEstimator
from rlzoo_estimators._util import masked


@rlzoo.register("ratio", "token")
class TokenRatio(RatioEstimator):
    """Per-token ratio exp(logp - old) (PPO, GRPO, DAPO).

    ``log w_{i,t} = logp_{i,t} - old_{i,t}``. No parameters.
    """

    formula = "log w = logp - old"
    reference = "PPO (Schulman et al. 2017); GRPO (Shao et al. 2024)"
    verl_name = "policy_loss.loss_mode=vanilla"
    trl_name = "importance_sampling_level=token"
    level = "token"

    def log_ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked(logp - old_logp, mask)
