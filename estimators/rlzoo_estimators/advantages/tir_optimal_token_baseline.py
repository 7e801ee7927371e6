"""Optimal token baseline over policy tokens (verl's ``tir_optimal_token_baseline``, for multi-turn / tool-integrated
responses): ``optimal-token-baseline`` with positions counted in *policy tokens* rather than columns.

A response with holes (tool outputs, observation tokens: ``m = 0`` inside it) is first compacted: its ``n``-th policy
token is position ``n`` for every response of the group, so the baseline compares like with like

    B_n = sum_{i in g} G_{i,(n)} W_{i,(n)} / (sum_{i in g} W_{i,(n)} + eps),     A_{i,(n)} = G_{i,(n)} - B_n

(``(n)``: the column of the ``n``-th policy token of ``y_i``; ``G``, ``W`` as ``optimal-token-baseline``), then the
advantages are put back in their columns. Empty responses belong to no group; a group of one gets ``B = 0``.
``zero_tail`` as there, in policy-token positions. On responses without holes it equals ``optimal-token-baseline``
(but for empty responses in a group). As verl's ``compute_multi_turn_optimal_token_baseline_advantage``, its
``rollout_is_weights`` the ``rollout_is`` option of ``optimal-token-baseline``. Needs the token statistic
``sum_pi_squared`` (the training engine's, as ``optimal-token-baseline``).
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import RewardBatch
from rlzoo_estimators._util import float_dtype, masked
from rlzoo_estimators.advantages.optimal_token_baseline import (
    OptimalTokenBaselineAdvantage,
    energy_of,
    group_token_baselines,
)
from rlzoo_estimators.advantages.remax import reward_to_go


def compact(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each row's values at ``valid`` positions moved to its front, 0 after: ``[B, max_n]``."""
    width = int(valid.sum(dim=-1).max().item()) if len(valid) else 0
    out = values.new_zeros(len(values), width)
    for row in range(len(values)):
        kept = values[row][valid[row]]
        out[row, : len(kept)] = kept
    return out


@rlzoo.register("advantage", "tir-optimal-token-baseline")
class TIROptimalTokenBaselineAdvantage(OptimalTokenBaselineAdvantage):
    """OTB with positions counted in policy tokens, so multi-turn responses with tool-output holes line up."""

    formula = "optimal-token-baseline with position n = the n-th policy token of each response (holes skipped)"
    reference = "optimal token baseline, multi-turn (verl, compute_multi_turn_optimal_token_baseline_advantage)"
    verl_name = "adv_estimator=tir_optimal_token_baseline"

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        valid = batch.mask > 0
        energy = compact(energy_of(self, batch), valid)
        returns = compact(reward_to_go(batch.token_rewards, batch.mask), valid)
        lengths = valid.sum(dim=-1, keepdim=True)
        in_response = torch.arange(returns.shape[-1], device=lengths.device).unsqueeze(0) < lengths
        baselines = group_token_baselines(
            returns,
            energy,
            in_response,
            batch.group_index,
            zero_tail=self.params.zero_tail,
            eps=self.params.eps,
            skip_empty=True,
        )
        compact_adv = returns - baselines
        out = torch.zeros(batch.mask.shape, dtype=torch.float64, device=batch.mask.device)
        for row in range(len(out)):
            out[row, valid[row]] = compact_adv[row, : int(lengths[row])]
        return masked(out, batch.mask).to(float_dtype(batch.rewards, batch.mask))
