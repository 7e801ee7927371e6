"""The step's advantage phase: what the advantage source sees of the step record, and what it gives back.

token rewards -= kl_in_reward's beta * KL(old || reference), if configured
RewardBatch   <- the rollout's rewards, the critic's values, the correction's weights, and what the source reads:
                 teacher and old log-probs (needs_teacher), the named token statistics (needs_token_stats)
advantages, returns <- the advantage source
"""

from __future__ import annotations

from dataclasses import replace

from rlzoo.interfaces import AdvantageSource, RewardBatch
from rlzoo.interfaces.base import collecting
from rlzoo.rl.reward_kl import KLInReward
from rlzoo.rl.step_record import StepRecord, filled
from rlzoo.util.tensors import masked_mean


def reward_batch(record: StepRecord, source: AdvantageSource) -> RewardBatch:
    """The rollout's rewards with what ``source`` declares it reads from the step: the teacher's and the old
    log-probs (``needs_teacher``), the old log-probs and each named statistic (``needs_token_stats``), and the
    critic's values (``None`` without a critic); the correction's weights always (no gradient; read by a source's
    rollout-IS option)."""
    old = filled(record.old, "old")
    rewards = replace(
        filled(record.rollout, "rollout").rewards, values=record.values, rollout_is_weights=old.correction
    )
    if source.needs_teacher:
        rewards = replace(rewards, teacher_logprobs=record.teacher_logp, old_logprobs=old.logp)
    if source.needs_token_stats:
        stats = {name: record.token_stats[name] for name in sorted(source.needs_token_stats)}
        rewards = replace(rewards, old_logprobs=old.logp, token_stats=stats)
    return rewards


def advantages(record: StepRecord, source: AdvantageSource, kl_in_reward: KLInReward | None) -> None:
    """Fill ``record``'s ``[B, T]`` advantages, the critic's returns (``None`` without a critic) and their metrics:
    the KL-in-reward penalty first (on the old log-probs), then the advantage ``source``."""
    metrics: dict[str, float] = {}
    rewards = reward_batch(record, source)
    if kl_in_reward is not None:
        old, token_rewards = filled(record.old, "old"), filled(rewards.token_rewards, "rollout.rewards.token_rewards")
        penalised, metrics = kl_in_reward.penalise(token_rewards, old.logp, old.reference, rewards.mask)
        rewards = replace(rewards, token_rewards=penalised)
    with collecting() as reports:  # the source's
        record.advantages, record.returns = source.advantages_and_returns(rewards)
    metrics = {**metrics, "advantage/abs_mean": masked_mean(record.advantages.abs(), rewards.mask).item()}
    record.advantage_metrics = {**metrics, **reports}
