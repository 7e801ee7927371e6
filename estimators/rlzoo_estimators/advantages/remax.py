"""ReMax advantage (Li et al. 2023): the reward-to-go minus the reward of a greedy response to the same prompt.

    A_{i,t} = G_{i,t} - b_{p(i)},      G_{i,t} = sum_{t' >= t} m_{t'} r_{i,t'},      b_p = reward(greedy response to p)

``r_{i,t}`` are the token rewards (the outcome reward at the last policy token, minus the KL-in-reward penalty where
configured), so for an outcome reward ``A_{i,t} = R_i - b``. The greedy response is sampled and scored by the loop
each step (one ``temperature 0`` generation per prompt, verl's ``do_sample=False`` batch; ``time/baseline``,
``reward/baseline_mean``) and counted as the sampled ones are: verifier, turn rewards, reward shapers' terms. As
verl's ``compute_remax_outcome_advantage``, which leaves ``G`` (not 0) at masked positions inside a response.
"""

from __future__ import annotations

import torch

import rlzoo
from rlzoo.interfaces import AdvantageSource, RewardBatch
from rlzoo_estimators._util import float_dtype, masked


def reward_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``G_t = sum_{t' >= t} m_t' r_t'`` per row (float64)."""
    r = masked(token_rewards.to(torch.float64), mask)
    return r.flip(-1).cumsum(-1).flip(-1)


@rlzoo.register("advantage", "remax")
class ReMaxAdvantage(AdvantageSource):
    """ReMax: reward-to-go minus the reward of one greedy response to the same prompt (sampled each step)."""

    formula = "A_{i,t} = sum_{t'>=t} r_{i,t'} - reward(greedy response to the prompt)"
    reference = "ReMax (Li et al. 2023, arXiv:2310.10505)"
    verl_name = "adv_estimator=remax"
    needs_greedy_baseline = True
    reads_token_rewards = True

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        batch.require(
            self.name, "token rewards and each prompt's greedy-response reward", "token_rewards", "reward_baselines"
        )
        baseline = batch.reward_baselines.to(torch.float64).reshape(-1, 1)
        adv = reward_to_go(batch.token_rewards, batch.mask) - baseline
        return masked(adv, batch.mask).to(float_dtype(batch.rewards, batch.mask))
