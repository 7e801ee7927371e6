"""Off-policy sequence masking (OPSM; DeepSeek-AI 2025, DeepSeek-V3.2 eq. 9; TRL's ``off_policy_mask_threshold``):
responses with a negative advantage whose sampling policy has drifted far from the trained one leave the loss.

    d_i    = sum_t m_t (old_rollout_t - old_train_t) / max(sum_t m_t, 1)    (k1 estimate of KL(pi_rollout || pi_train))
    keep_t = 1[A_t >= 0  or  d_i <= delta]

``delta`` is ``threshold``. Learning from one's own bad samples is what goes wrong off-policy (a negative
advantage pushes down tokens the trained policy may barely produce); positive-advantage responses are always
kept. With ``importance`` (``tis`` parameters) the kept tokens also carry importance weights, as TRL's default
``vllm_importance_sampling_mode`` does beside it; else the weights are 1.

Two differences from TRL's ``GRPOTrainer.get_off_policy_mask``, both of placement, none of the mask's formula:
- TRL measures ``d_i`` against the policy being trained at each minibatch (``per_token_logps``); rlzoo against
  the training engine's log-probs at the start of the step (``old_train``, under the weights that sampled the batch),
  once for all minibatches. The two agree on a step's first minibatch (``minibatches_per_rollout: 1``: always);
  later minibatches see in TRL also the drift of the step's own updates, which rlzoo leaves to the ratio's clip.
- TRL multiplies the per-token loss by the mask, so a dropped response still counts in the loss's denominators;
  in rlzoo it leaves them as every rejection does (:meth:`~rlzoo.interfaces.MismatchCorrection.keep`). The
  gradient's direction is the same; its scale differs by the share of what is kept.

Reports ``masked_fraction`` (share of response tokens dropped) and ``seq_masked_fraction`` (share of responses).
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import MismatchCorrection, Params
from rlzoo_estimators._util import masked, response_fraction, token_fraction
from rlzoo_estimators.corrections.tis import TruncatedIS, weights_of


@rlzoo.register("correction", "opsm")
class OffPolicySequenceMask(MismatchCorrection):
    """Off-policy sequence masking: drop negative-advantage responses whose mean k1 mismatch exceeds delta."""

    formula = "keep_t = 1[A_t >= 0 or mean_t(old_rollout - old_train) <= delta]; w = 1 or tis"
    reference = "DeepSeek-V3.2 (DeepSeek-AI 2025), off-policy sequence masking"
    trl_name = "off_policy_mask_threshold"

    class Params(Params):
        threshold: float = Field(
            0.5, gt=0.0, description="delta, the largest mean k1 mismatch a negative-advantage response keeps"
        )
        importance: TruncatedIS.Params | None = Field(
            None, description="tis parameters for importance weights on the response tokens; null: weights 1"
        )

    def weights(self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return weights_of(self, self.params.importance, old_train, old_rollout, mask)

    def keep(
        self, old_train: torch.Tensor, old_rollout: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        tokens = (mask > 0).sum(dim=-1, keepdim=True).clamp(min=1)
        drift = masked(old_rollout - old_train, mask).sum(dim=-1, keepdim=True) / tokens
        keep = (masked(advantages, mask) >= 0) | (drift <= self.params.threshold)
        self.report("masked_fraction", token_fraction(~keep, mask))
        self.report("seq_masked_fraction", response_fraction(~keep, mask))
        return keep.to(mask.dtype)
