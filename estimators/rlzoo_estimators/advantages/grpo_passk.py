"""Pass@k advantage (verl's ``grpo_passk``): only each group's best response is credited, by its margin over the
second best -- the max-reward-of-the-group objective with a leave-one-out baseline ``max_{j != i} r_j``, the
``k = n`` case of Pass@k Policy Optimization (Walder & Karkhanis 2025), which is 0 for all but the best response.

    i* = argmax_{i in g} r_i,     A_{i*} = (r_(1) - r_(2)) / (std_g r + eps),     A_i = 0 for every other i in g

``r_(1) >= r_(2)`` the group's two largest rewards, ``std`` unbiased (N-1); without ``std_normalize`` the margin is
not divided. A tie for the best gives 0 to everyone; a group of one response gets 0 (verl raises), and a run with
``rollout.group_size < 2`` is refused before it starts (``needs_groups``). Broadcast to every token of ``y_{i*}``.
As verl's ``compute_grpo_passk_outcome_advantage``.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import AdvantageSource, Params, RewardBatch
from rlzoo_estimators._util import float_dtype, masked


@rlzoo.register("advantage", "grpo-passk")
class PassKAdvantage(AdvantageSource):
    """Pass@k: the group's best response gets its margin over the second best (/ group std); the others get 0."""

    formula = "A_{argmax r} = (r_(1) - r_(2)) / (std_group r + eps), 0 for the rest of the group"
    reference = "PKPO (Walder & Karkhanis 2025, arXiv:2505.15201), k = n; verl's docstring cites arXiv:2503.19595"
    needs_groups = True
    verl_name = "adv_estimator=grpo_passk"

    class Params(Params):
        std_normalize: bool = Field(
            True, description="divide the margin by the group's std (verl: norm_adv_by_std_in_grpo)"
        )
        eps: float = Field(1e-6, ge=0.0, description="added to the std before dividing")

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        r = batch.rewards.to(torch.float64).reshape(-1)
        adv = torch.zeros_like(r)
        for group in torch.unique(batch.group_index.reshape(-1)):
            rows = torch.nonzero(batch.group_index.reshape(-1) == group).flatten()
            if len(rows) < 2:
                continue
            top = torch.topk(r[rows], 2)
            margin = top.values[0] - top.values[1]
            if self.params.std_normalize:
                margin = margin / (r[rows].std() + self.params.eps)
            adv[rows[top.indices[0]]] = margin
        dtype = float_dtype(batch.rewards, batch.mask)
        return masked(adv.to(dtype).unsqueeze(-1).expand(batch.mask.shape), batch.mask)
