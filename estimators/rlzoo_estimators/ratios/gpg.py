"""The GPG "ratio" (Group Policy Gradient, Chu et al. 2025): no importance ratio, the plain policy gradient.

    log w_{i,t} = logp_{i,t} - sg[logp_{i,t}]          (value 0, so w = 1; gradient grad logp_{i,t})

Composed with clipper ``none`` the per-token loss is ``-w A`` with value ``-A`` and gradient ``-A grad logp``:
the REINFORCE gradient of verl's ``compute_policy_loss_gpg`` (``-A * logp``), whose value differs by the
gradient-free ``-A (logp - 1)``. With more than one minibatch per rollout batch the later minibatches are
off-policy and nothing corrects for it, as in GPG.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import RatioEstimator
from rlzoo_estimators._util import masked


@rlzoo.register("ratio", "gpg")
class GPGRatio(RatioEstimator):
    """No ratio (GPG / REINFORCE): value 1, gradient grad logp; use with clipper none.

    ``log w_{i,t} = logp_{i,t} - sg[logp_{i,t}]``. No parameters.
    """

    level = "token"
    formula = "log w = logp - sg(logp)  (w = 1, grad w = grad logp)"
    reference = "GPG (Chu et al. 2025, arXiv:2504.02546)"
    verl_name = "policy_loss.loss_mode=gpg"

    def log_ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked(logp - logp.detach(), mask)
