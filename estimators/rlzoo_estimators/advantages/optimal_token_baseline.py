"""Optimal token baseline (OTB, verl's ``optimal_token_baseline``): a baseline per prompt group *and per position*,
the return weighted by how much gradient energy each response has accumulated up to that position.

    G_{i,t} = sum_{t' >= t} m_{t'} r_{i,t'}                                   (reward-to-go of the token rewards)
    s_{i,t} = 1 - 2 pi_t + sum_v pi(v)^2          = ||grad_logits log pi(y_t)||^2 of a softmax, pi_t = exp(old_logp)
    W_{i,t} = sum_{t' <= t} m_{t'} rho_{i,t'}^2 s_{i,t'}                     (cumulative path-variance proxy)
    B_t     = sum_{i in g} m_{i,t} G_{i,t} W_{i,t} / (sum_{i in g} m_{i,t} W_{i,t} + eps)
    A_{i,t} = m_{i,t} (G_{i,t} - B_t)

``B_t`` is the variance-minimising baseline ``E[G W] / E[W]`` of the gradient estimator at position ``t``. A group of
one response gets ``B = 0``. With ``zero_tail`` the baseline of a group's single longest response is 0 beyond the
second-longest one's length (where it alone would give ``B_t ~ G_t``, an advantage of ~0). Positions are columns of
the batch (use ``tir-optimal-token-baseline`` when responses have holes, multi-turn). As verl's
``compute_optimal_token_baseline_advantage``.

``rho`` is 1 unless ``rollout_is``: then it is the train-inference correction's weight of each token
(``RewardBatch.rollout_is_weights``, the weights of ``algorithm.correction`` such as ``tis``), as verl scales each
step's term by ``rollout_is_weights ** 2`` before the cumulative sum, so that the baseline minimises the variance of
the importance-weighted gradient. ``rlzoo train`` passes the step's correction weights (all ones without a
correction, where ``rollout_is`` changes nothing); from a loop of your own, set ``RewardBatch.rollout_is_weights``.

``sum_v pi(v)^2`` (``RewardBatch.token_stats["sum_pi_squared"]``) is a statistic of the whole next-token distribution
of the old policy, declared in ``needs_token_stats``: ``rlzoo train`` has the training engine compute it in one more
no-grad pass (engines that declare ``computes_token_stats``; its provider is in ``rlzoo.engines.token_stats``); from
a loop of your own, pass it in ``token_stats`` with ``old_logprobs`` and ``token_rewards``.
"""

from __future__ import annotations

import torch
from pydantic import Field

import rlzoo
from rlzoo.interfaces import AdvantageSource, Params, RewardBatch
from rlzoo_estimators._util import float_dtype, masked
from rlzoo_estimators.advantages.remax import reward_to_go


def group_token_baselines(
    returns: torch.Tensor,
    energy: torch.Tensor,
    valid: torch.Tensor,
    group_index: torch.Tensor,
    *,
    zero_tail: bool,
    eps: float,
    skip_empty: bool,
) -> torch.Tensor:
    """``[B, L]`` baselines ``B_t = sum_g m G W / (sum_g m W + eps)`` per group of equal ``group_index`` and column;
    0 for a group of one (``skip_empty``: empty rows belong to no group). ``zero_tail``: 0 in the unique longest row
    of a group from the second-longest row's length on (lengths as counts of ``valid``, positions as columns)."""
    baselines = torch.zeros_like(returns)
    lengths = valid.sum(dim=-1)
    m = valid.to(returns.dtype)
    groups = group_index.reshape(-1).to(lengths.device)
    for group in torch.unique(groups):
        rows = torch.nonzero((groups == group) & ((lengths > 0) if skip_empty else True)).flatten()
        if len(rows) < 2:
            continue
        numerator = (returns[rows] * energy[rows] * m[rows]).sum(dim=0)
        denominator = (energy[rows] * m[rows]).sum(dim=0) + eps
        baselines[rows] = (numerator / denominator).unsqueeze(0).expand(len(rows), -1)
        if zero_tail:
            ordered = torch.sort(lengths[rows]).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            at_longest = rows[lengths[rows] == longest]
            if len(at_longest) == 1 and longest > second:
                baselines[at_longest[0], second:] = 0.0
    return baselines


def path_energy(
    old_logprobs: torch.Tensor, sum_pi_squared: torch.Tensor, mask: torch.Tensor, is_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """``W_t = sum_{t' <= t} m rho_t'^2 s_t'``, ``s_t = 1 - 2 exp(old_logp_t) + sum_pi_squared_t`` (float64);
    ``rho`` the ``is_weights`` (1 when None)."""
    per_token = 1.0 - 2.0 * torch.exp(old_logprobs.to(torch.float64)) + sum_pi_squared.to(torch.float64)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(torch.float64) ** 2
    return masked(per_token, mask).cumsum(dim=-1)


def energy_of(source: OptimalTokenBaselineAdvantage, batch: RewardBatch) -> torch.Tensor:
    """The batch's ``W`` for ``source`` (its ``rollout_is`` option decides whether the correction weights enter)."""
    weighted = source.params.rollout_is
    what = "token rewards, the old log-probs and sum_v pi(v)^2 per position"
    batch.require(source.name, what, "token_rewards", "old_logprobs")
    batch.require_token_stats(source.name, "sum_pi_squared")
    if weighted:
        batch.require(source.name, "the train-inference correction's weights, for rollout_is", "rollout_is_weights")
    weights = batch.rollout_is_weights if weighted else None
    return path_energy(batch.old_logprobs, batch.token_stats["sum_pi_squared"], batch.mask, weights)


@rlzoo.register("advantage", "optimal-token-baseline")
class OptimalTokenBaselineAdvantage(AdvantageSource):
    """OTB: reward-to-go minus a per-position group baseline weighted by each response's accumulated gradient energy."""

    formula = (
        "A_{i,t} = G_{i,t} - sum_g G W / sum_g W at position t, W_{i,t} = sum_{t'<=t} rho_t'^2 (1 - 2 pi_t' + "
        "sum_v pi(v)^2), rho = 1 (rollout_is: the correction's weight)"
    )
    reference = "optimal token baseline (verl, core_algos.compute_optimal_token_baseline_advantage)"
    verl_name = "adv_estimator=optimal_token_baseline"
    reads_token_rewards = True
    needs_token_stats = frozenset({"sum_pi_squared"})

    class Params(Params):
        zero_tail: bool = Field(
            True,
            description="0 baseline for a group's unique longest response past the second-longest (verl: handle_zero_tail)",
        )
        eps: float = Field(1e-8, ge=0.0, description="added to the baseline's denominator")
        rollout_is: bool = Field(
            False,
            description="scale each position's energy by the squared train-inference correction weight "
            "(RewardBatch.rollout_is_weights, algorithm.correction's; verl: rollout_is_weights)",
        )

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        returns = reward_to_go(batch.token_rewards, batch.mask)
        energy = energy_of(self, batch)
        baselines = group_token_baselines(
            returns,
            energy,
            batch.mask > 0,
            batch.group_index,
            zero_tail=self.params.zero_tail,
            eps=self.params.eps,
            skip_empty=False,
        )
        return masked(returns - baselines, batch.mask).to(float_dtype(batch.rewards, batch.mask))
