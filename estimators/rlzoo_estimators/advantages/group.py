"""Group-normalised outcome advantage (GRPO; Dr.GRPO with ``std_normalize: false``).

    A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps)      (std_normalize = true)
    A_i =  r_i - mean_{j in g(i)} r_j                                      (std_normalize = false)

g(i) is the group of responses sampled from the same prompt. The std is the unbiased (N-1) one by default
(verl) or the biased (N) one (TRL). A group of one response gets A = 0 (a run with
``rollout.group_size: 1`` is refused: ``needs_groups``). A_i is broadcast to every token of y_i.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import AdvantageSource, Params, RewardBatch
from rlzoo_estimators._util import float_dtype, group_normalise, masked


@rlzoo.register("advantage", "group")
class GroupAdvantage(AdvantageSource):
    """Group-normalised outcome reward (GRPO; Dr.GRPO without std).

    ``A_i = (r_i - mean_g r) / (std_g r + eps)`` over the responses of the same prompt, broadcast over tokens.
    """

    formula = "A_i = (r_i - mean_group r) / (std_group r + eps)"
    reference = "GRPO (Shao et al. 2024, arXiv:2402.03300); Dr.GRPO"
    needs_groups = True
    verl_name = "adv_estimator=grpo"
    trl_name = "scale_rewards"

    class Params(Params):
        std_normalize: bool = Field(True, description="divide by the group std (false gives Dr.GRPO)")
        unbiased_std: bool = Field(True, description="unbiased (N-1) std as in verl; false: biased (N) as in TRL")
        eps: float = Field(1e-6, ge=0.0, description="added to the std before dividing")

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        p = self.params
        adv = group_normalise(
            batch.rewards, batch.group_index, std_normalize=p.std_normalize, unbiased_std=p.unbiased_std, eps=p.eps
        )
        dtype = float_dtype(batch.rewards, batch.mask)
        per_token = adv.to(dtype).unsqueeze(-1).expand(batch.mask.shape)
        return masked(per_token, batch.mask)
