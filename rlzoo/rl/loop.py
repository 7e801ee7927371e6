"""The RL post-training loop, on one page.

    for step in steps:
        prompts    <- a batch of the task's train prompts                          (sample_prompts, by the run)
        rollout_batch: the schedule's (rlzoo.rl.rollouts.collect, now or prefetched during the previous step):
        repeat up to the batch filter's `max_gen_batches` times, fresh prompts after the first:
            rollouts <- rollout engine samples `group_size` responses per prompt     (time/rollout)
                        (several processes: each rank its share of the prompts, gathered)
            rewards  <- verifier scores every response (+ reward shapers' terms)     (time/verify)
            keep the groups the batch filter keeps; stop once `prompts_per_step` are kept
        (no group kept: skip the update)
        old_logprobs:                                                               (time/old_logprobs)
            old logp   <- training engine on the rollout batch (+ entropy), or the rollout engine's
                          (old_logprobs: rollout-only skips the training engine's pass)
            ref logp   <- the KL reference on the rollout batch, if there is one
            weights    <- train-inference correction from both engines' old log-probs (e.g. TIS)
        teacher logp <- the teacher on the rollout batch, if there is one             (time/teacher)
        values     <- the critic on the rollout batch, if there is one                (time/critic)
        advantages (rlzoo.rl.rollouts.advantages):                                  (time/advantage)
            token rewards -= kl_in_reward's beta * KL(old || reference), if configured
            advantages <- advantage source, per token (+ the critic's returns)
        minibatch_updates:                                                          (time/train)
            loss mask <- response mask less the tokens the correction rejects (none unless it rejects)
            repeat `minibatches_per_rollout` times:
                loss <- objective(logp, old logp, advantages, loss mask [, reference logp]) (+ regularisers)
                training engine takes one optimizer step (not during the critic's warm-up)
                critic takes one optimizer step on the value loss towards the returns
        rollout engine(s) <- the new weights                                        (time/sync)
        step_metrics: the updates', the batch's, the advantages', mismatch, entropy, critic, teacher (+ the times)

:func:`rl_step` reads as this chart, one line or block per phase. The rollouts get only what they use
(:attr:`Components.rollout_parts`, a :class:`~rlzoo.rl.rollouts.RolloutParts`), not the step's whole components.

Every piece is injected by :mod:`rlzoo.runtime.run`; this module knows no concrete component. With several processes
each rank samples and scores its contiguous share of the prompts with its own engine and the shares are gathered
(``Components.rollout_per_rank``), or rank 0 alone samples and the batch is broadcast (``Dist.broadcast``);
either way every rank then holds the whole batch in the same order. MoE routing and the rest of the row split
are not the loop's business: the :class:`~rlzoo.rl.learner.Learner` hides the split over ranks and, for MoE
policies, the router policy's Routing Replay (:mod:`rlzoo.rl.routing_learner`).

When the rollouts are sampled is the :class:`~rlzoo.rl.schedule.RolloutSchedule`'s business: by default at the start
of their step, by the weights it trains from; with ``rollout.overlap: 1`` (:mod:`rlzoo.rl.overlap`) step t+1's batch is
sampled while step t trains, and its old log-probs are computed under the weights that sampled it; with
``rollout.max_staleness: k`` (:mod:`rlzoo.rl.async_rollouts`) a producer thread samples continuously, at most k weight
versions ahead, and the schedule hands it each step's weights (:meth:`RolloutSchedule.publish`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rlzoo.config.schema import RunConfig
from rlzoo.engines import LossFn, RolloutEngine, SamplingSettings, TokenBatch
from rlzoo.engines.device import device_memory_metrics
from rlzoo.episodes.environments import SingleTurn
from rlzoo.episodes.runner import EpisodeRunner
from rlzoo.interfaces import AdvantageSource, BatchFilter, MismatchCorrection, RewardShaper, Sample, Verifier
from rlzoo.interfaces.base import take_reports
from rlzoo.rl.critic import Critic, value_metrics
from rlzoo.rl.learner import Learner
from rlzoo.rl.loss_inputs import LossInputs
from rlzoo.rl.objective import Objective, k3_from_samples_of_old
from rlzoo.rl.reward_kl import KLInReward
from rlzoo.rl.rollouts import RolloutBatch, RolloutParts
from rlzoo.rl.rollouts import advantages as compute_advantages
from rlzoo.rl.schedule import RolloutSchedule
from rlzoo.rl.scoring import score
from rlzoo.rl.teacher import Teacher, distill_metrics
from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.util.decode import response_text
from rlzoo.util.passk import mean_pass_at_k
from rlzoo.util.reductions import reduce_minibatches
from rlzoo.util.seeds import step_seed
from rlzoo.util.tensors import masked_mean
from rlzoo.util.timer import Timer


@dataclass
class Components:
    """Everything one RL step uses (assembled by :mod:`rlzoo.runtime.run`)."""

    objective: Objective
    advantage: AdvantageSource
    verifier: Verifier
    correction: MismatchCorrection
    rollout: RolloutEngine
    learner: Learner
    tokenizer: Any
    reference: Learner | None = None
    dist: Dist = SINGLE
    rollout_per_rank: bool = False  # every rank samples its share of the prompts with its own started engine
    batch_filter: BatchFilter = field(default_factory=BatchFilter)  # the base keeps every group
    shapers: list[RewardShaper] = field(default_factory=list)
    train_set: Sequence[Sample] = ()  # where a batch filter's further generation batches draw fresh prompts
    schedule: RolloutSchedule = field(default_factory=lambda: RolloutSchedule())  # when rollouts are sampled
    episodes: EpisodeRunner | None = None  # what an episode is; None: one turn (the single-turn environment)
    critic: Critic | None = None  # a learned value model (algorithm.critic)
    kl_in_reward: KLInReward | None = None  # the reference KL as a per-token reward penalty
    teacher: Teacher | None = None  # a frozen model scoring the sampled tokens (on-policy distillation)

    def __post_init__(self) -> None:
        if self.episodes is None:
            self.episodes = EpisodeRunner(SingleTurn(), self.tokenizer)

    @property
    def rollout_parts(self) -> RolloutParts:
        """What sampling, scoring and assembling the rollout batch use, all that :mod:`rlzoo.rl.rollouts` is given
        (built at each call, so it sees the fields as they are now)."""
        return RolloutParts(
            engine=self.rollout,
            episodes=self.episodes,
            verifier=self.verifier,
            shapers=self.shapers,
            batch_filter=self.batch_filter,
            train_set=self.train_set,
            tokenizer=self.tokenizer,
            dist=self.dist,
            per_rank=self.rollout_per_rank,
            step_rewards=self.advantage.needs_step_rewards,
            greedy_baseline=self.advantage.needs_greedy_baseline,
        )


def rl_step(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig) -> dict[str, float]:
    """One RL step; with several processes every rank calls it (each samples its share, or rank 0 samples all)."""
    timer = Timer()
    rollout = rollout_batch(step, prompts, c, config, timer)
    if rollout.batch is None:  # the batch filter kept no group: nothing to learn from, the weights stay
        c.schedule.settle(timer)
        c.schedule.publish(step, c.learner, c.rollout, c.rollout_per_rank, updated=False)
        return c.dist.reduce_metrics({**rollout.metrics, **timer.metrics()})
    batch = rollout.batch
    with timer("old_logprobs"):
        old = old_logprobs(rollout, c, config.algorithm.old_logprobs)
    with timer("teacher"):
        teacher_logp = c.teacher.logprobs(batch) if c.teacher is not None else None
    with timer("critic"):
        values = c.critic.values(batch) if c.critic is not None else None
    with timer("advantage"):
        advantages, returns, advantage_metrics = compute_advantages(
            rollout.rewards, c.advantage, c.kl_in_reward, old.logp, old.reference, values, teacher_logp,
            old.sum_pi_squared,
        )
    with timer("train"):
        updates, critic_updates = minibatch_updates(step, batch, old, advantages, values, returns, c, config)
    c.schedule.settle(timer, new_weights=True)  # the rollout engine's weights never change under a generation
    with timer("sync"):
        c.schedule.publish(step, c.learner, c.rollout, c.rollout_per_rank, updated=True)
    metrics = step_metrics(rollout, old, advantage_metrics, updates, values, returns, critic_updates, teacher_logp)
    metrics = {**metrics, **c.learner.step_metrics(), **timer.metrics(), **device_memory_metrics()}
    return c.dist.reduce_metrics(metrics)  # by each value's declared reduction over ranks; time/* are rank 0's


def rollout_batch(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig, timer: Timer) -> RolloutBatch:
    """The step's rollout batch, from the schedule, on every rank in the same order."""
    # every rank samples and scores its share of the prompts (collect gathers the shares), or rank 0 samples all
    # and sends the batch to the others
    samples_here = c.rollout_per_rank or c.dist.is_main
    rollout = c.schedule.collect(step, prompts, c.rollout_parts, config, timer) if samples_here else None
    return rollout if c.rollout_per_rank else c.dist.broadcast(rollout)


@dataclass
class OldLogprobs:
    """The rollout batch's log-probs before the step's updates, and the train-inference correction from them."""

    logp: Tensor  # the ratio's denominator (algorithm.old_logprobs): the training engine's or the rollout engine's
    train: Tensor | None  # the training engine's pass; None: rollout-only skips it
    entropy: Tensor | None  # the policy's entropy from that pass
    rollout: Tensor  # the rollout engine's
    reference: Tensor | None  # the KL reference's, if there is one
    correction: Tensor  # the mismatch correction's weights (e.g. TIS)
    reports: dict[str, float]  # what the correction reported
    sum_pi_squared: Tensor | None = None  # sum_v pi_old(v)^2 per position, for an advantage that reads it


def old_logprobs(rollout: RolloutBatch, c: Components, source: str) -> OldLogprobs:
    """The old log-probs (``source``: ``algorithm.old_logprobs``), the reference's, and the correction weights."""
    batch, rollout_logp, mask = rollout.batch, rollout.rollout_logp, rollout.batch.response_mask
    routings = [g.routing for g in rollout.generations]
    if source == "rollout-only":  # the rollout engine's log-probs are the old ones: no pass
        c.learner.without_old_pass(batch, routings)
        train_logp, entropy = None, None
    else:
        with c.schedule.behaviour_weights():  # the weights that sampled the batch (overlap: the previous step's)
            train_logp, entropy = c.learner.old_logprobs(batch, rollout_logp, routings)
    sum_pi_squared = None
    if c.advantage.needs_sum_pi_squared:  # one more pass, under the same weights as the old one
        with c.schedule.behaviour_weights():
            sum_pi_squared = c.learner.sum_pi_squared(batch)
    old_logp = train_logp if source == "train" else rollout_logp
    ref_logp = c.reference.logprobs(batch) if c.reference is not None else None
    # without the pass the correction reads nothing of old_train (preflight: reads_train_logprobs is False)
    correction = c.correction.weights(rollout_logp if train_logp is None else train_logp, rollout_logp, mask)
    return OldLogprobs(
        old_logp, train_logp, entropy, rollout_logp, ref_logp, correction, take_reports(c.correction), sum_pi_squared
    )


def minibatch_updates(
    step: int,
    batch: TokenBatch,
    old: OldLogprobs,
    advantages: Tensor,
    values: Tensor | None,
    returns: Tensor | None,
    c: Components,
    config: RunConfig,
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """``algorithm.minibatches_per_rollout`` minibatches of shuffled rows: on each one optimizer step of the policy
    (not during the critic's warm-up), then of the critic; the policy's and the critic's metrics per minibatch."""
    critic, mask = c.critic, batch.response_mask
    policy_learns = critic is None or step >= critic.warmup_steps
    loss_mask = mask * kept_tokens(c.correction, old, advantages, mask)
    inputs = LossInputs(old.logp, advantages, loss_mask, old.reference, old.correction)  # to the loss's device once
    updates, critic_updates = [], []
    shuffle = step_seed(config.seed, step, 2)
    for index, rows in enumerate(minibatches(len(mask), config.algorithm.minibatches_per_rollout, shuffle)):
        seed = step_seed(config.seed, step, 100 + index)  # components that draw at random (e.g. clip-cov)
        if policy_learns:
            loss_fn = minibatch_loss(c.objective, inputs, rows, seed)
            updates.append(c.learner.update(batch, rows, loss_fn, c.objective.needs_entropy))
        if critic is not None:
            critic_updates.append(critic.update(batch, rows, values, returns))
    return updates, critic_updates


def kept_tokens(correction: MismatchCorrection, old: OldLogprobs, advantages: Tensor, mask: Tensor) -> Tensor:
    """The tokens the correction keeps in the policy loss (a rejected one counts as padding there); what it reported
    joins the step's metrics with its weights' reports."""
    train = old.rollout if old.train is None else old.train  # rollout-only: the correction reads no old_train
    keep = correction.keep(train, old.rollout, mask, advantages)
    old.reports.update(take_reports(correction))
    return keep


def minibatch_loss(objective: Objective, inputs: LossInputs, rows: Tensor, seed: int) -> LossFn:
    """The objective on the minibatch ``rows``, as :meth:`Learner.update` calls it: ``loss_fn(logp [, entropy])``,
    computed on the device of ``logp``, its metrics left there (the step reads them all at once)."""

    def loss_fn(logp: Tensor, entropy: Tensor | None = None) -> tuple[Tensor, dict[str, Any]]:
        old_logp, advantages, mask, reference, weights = inputs.rows(rows, logp.device)
        return objective.on_device(logp, old_logp, advantages, mask, reference, weights, seed, entropy)

    return loss_fn


def step_metrics(
    rollout: RolloutBatch,
    old: OldLogprobs,
    advantage_metrics: dict[str, float],
    updates: list[dict[str, float]],
    values: Tensor | None,
    returns: Tensor | None,
    critic_updates: list[dict[str, float]],
    teacher_logp: Tensor | None,
) -> dict[str, float]:
    """The step's metrics (this rank's; the training engine's step metrics and the times aside): the updates', the
    rollout batch's, the advantages', the mismatch and the policy's entropy, the critic's and the teacher's."""
    mask = rollout.batch.response_mask
    mismatch, policy = {}, {}
    if old.train is not None:  # the training engine's own pass ran
        mismatch = mismatch_metrics(old.train, old.rollout, old.correction, mask)
        policy = {"policy/entropy": masked_mean(old.entropy, mask).item()}
    if values is not None:  # there is a critic
        policy = {**policy, **value_metrics(values, returns, mask), **reduce_minibatches(critic_updates)}
    if teacher_logp is not None:
        policy = {**policy, **distill_metrics(old.logp, teacher_logp, mask)}
    return {**reduce_minibatches(updates), **rollout.metrics, **advantage_metrics, **mismatch, **policy, **old.reports}


def evaluate(
    samples: Sequence[Sample],
    rollout: RolloutEngine,
    verifier: Verifier,
    tokenizer: Any,
    config: RunConfig,
    episodes: EpisodeRunner | None = None,
) -> dict[str, float]:
    """Held-out accuracy: share of correct responses (episodes: of correct last turns), ``train.eval_samples_per_
    prompt`` per prompt, sampled at ``train.eval_temperature`` (0 = greedy) with a fixed seed, so every evaluation
    sees the same random stream; ``eval/pass@k`` counts an episode as one attempt, and an episode whose environment
    failed as a wrong one (``eval/episode_errors``)."""
    sampling = SamplingSettings(
        n=config.train.eval_samples_per_prompt,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.train.eval_temperature,
        top_p=1.0,
        seed=step_seed(config.seed, 0, 3),
    )
    episodes = episodes or EpisodeRunner(SingleTurn(), tokenizer)
    ran = episodes.run(rollout, samples, sampling, config.prompt)
    groups = ran.groups
    responses = [response_text(tokenizer, g.last_turn_ids) for group in groups for g in group]
    repeated = [s for s, group in zip(samples, groups, strict=True) for _ in group]
    scores = score(verifier, repeated, responses, config.train.verifier_timeout_s)
    verdicts = ran.scored(scores.verdicts)  # an episode whose environment failed scores 0
    rewards = torch.tensor([v.reward for v in verdicts])
    verdict_correct = torch.tensor([bool(v.correct) for v in verdicts])
    correct = [int(part.sum()) for part in torch.split(verdict_correct, [len(g) for g in groups])]  # per prompt
    return {
        "eval/accuracy": verdict_correct.float().mean().item(),
        "eval/reward_mean": rewards.mean().item(),
        "eval/verifier_errors": float(scores.failed),
        **mean_pass_at_k([len(g) for g in groups], correct, config.train.eval_pass_at_k),
        **{f"eval/{key.replace('/', '_')}": float(value) for key, value in ran.metrics.items() if key in EVAL_EPISODE_KEYS},
    }


#: the episode metrics an evaluation logs too (as eval/episode_turns_mean, ...; eval/episode_errors only when an
#: environment failed)
EVAL_EPISODE_KEYS = ("episode/turns_mean", "episode/truncated", "tool/calls_per_episode", "episode/errors")


def mismatch_metrics(
    train_logp: torch.Tensor, rollout_logp: torch.Tensor, correction: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the training engine's, and the correction's mean weight."""
    return {
        "mismatch/abs_logp_diff": masked_mean((train_logp - rollout_logp).abs(), mask).item(),
        "mismatch/kl": masked_mean(k3_from_samples_of_old(train_logp, rollout_logp), mask).item(),
        "mismatch/weight_mean": masked_mean(correction, mask).item(),
    }


def minibatches(count: int, number: int, seed: int) -> list[torch.Tensor]:
    """The rows of a rollout batch shuffled with ``seed`` and cut into ``number`` off-policy minibatches."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return [rows for rows in torch.tensor_split(order, number) if len(rows) > 0]


def sample_prompts(train_set: Sequence[Sample], step: int, config: RunConfig) -> list[Sample]:
    rng = random.Random(step_seed(config.seed, step, 0))
    return rng.sample(list(train_set), k=min(config.rollout.prompts_per_step, len(train_set)))
