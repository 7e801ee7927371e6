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
        old_pass:                                                                   (time/old_logprobs)
            old logp   <- training engine on the rollout batch (+ entropy), or the rollout engine's
                          (old_logprobs: rollout-only skips the training engine's pass)
            token stats <- the statistics the advantage source names (needs_token_stats), same weights
            ref logp   <- the KL reference on the rollout batch, if there is one
            weights    <- train-inference correction from both engines' old log-probs (e.g. TIS)
        teacher logp <- the teacher on the rollout batch, if there is one             (time/teacher)
        values     <- the critic on the rollout batch, if there is one                (time/critic)
        advantages (rlzoo.rl.advantages):                                           (time/advantage)
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

:func:`rl_step` reads as this chart, one line or block per phase; each phase fills its part of the step's
:class:`~rlzoo.rl.step_record.StepRecord` and reads what the phases before it put there. The rollouts get only what
they use (:meth:`Components.rollout_parts`, a :class:`~rlzoo.rl.rollouts.RolloutParts`), not the step's whole
components.

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
from rlzoo.engines import LossFn, RolloutEngine, SamplingSettings
from rlzoo.engines.device import device_memory_metrics
from rlzoo.episodes.environments import SingleTurn
from rlzoo.episodes.runner import EpisodeRunner
from rlzoo.interfaces import AdvantageSource, BatchFilter, MismatchCorrection, RewardShaper, Sample, Verifier
from rlzoo.interfaces.base import collecting
from rlzoo.rl.advantages import advantages
from rlzoo.rl.critic import Critic, value_metrics
from rlzoo.rl.learner import Learner
from rlzoo.rl.loss_inputs import LossInputs
from rlzoo.rl.objective import Objective, k3_from_samples_of_old
from rlzoo.rl.reward_kl import KLInReward
from rlzoo.rl.rollouts import RolloutBatch, RolloutParts, score_last_turns, verdict_parts
from rlzoo.rl.schedule import RolloutSchedule
from rlzoo.rl.step_record import OldLogprobs, StepRecord, filled
from rlzoo.rl.teacher import Teacher, distill_metrics
from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.services import service_metrics
from rlzoo.util.passk import mean_pass_at_k
from rlzoo.util.reductions import reduce_minibatches
from rlzoo.util.seeds import Stream, step_seed
from rlzoo.util.tensors import masked_mean


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

    def rollout_parts(self, config: RunConfig) -> RolloutParts:
        """What sampling, scoring and assembling the rollout batch use, all that :mod:`rlzoo.rl.rollouts` is given
        (built at each call, so it sees the fields as they are now)."""
        assert self.episodes is not None  # __post_init__ fills it
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
            config=config,
            greedy_baseline=self.advantage.needs_greedy_baseline,
        )


def rl_step(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig) -> dict[str, float]:
    """One RL step; with several processes every rank calls it (each samples its share, or rank 0 samples all)."""
    record, parts = StepRecord(step), c.rollout_parts(config)
    timer = record.timer
    record.rollout = rollout_batch(record, prompts, c, parts)
    if record.batch is None:  # the batch filter kept no group: nothing to learn from, the weights stay
        c.schedule.settle(timer)
        c.schedule.publish(step, c.learner, parts, updated=False)
        return c.dist.reduce_metrics({**record.rollout.metrics, **timer.metrics()})
    with timer("old_logprobs"), collecting(into=record.reports):
        old_pass(record, c, config.algorithm.old_logprobs)
    with timer("teacher"):
        record.teacher_logp = c.teacher.logprobs(record.batch) if c.teacher is not None else None
    with timer("critic"):
        record.values = c.critic.values(record.batch) if c.critic is not None else None
    with timer("advantage"):
        advantages(record, c.advantage, c.kl_in_reward)
    with timer("train"), collecting(into=record.reports):
        minibatch_updates(record, c, config)
    c.schedule.settle(timer, new_weights=True)  # the rollout engine's weights never change under a generation
    with timer("sync"):
        c.schedule.publish(step, c.learner, parts, updated=True)
    metrics = {**step_metrics(record), **learners_metrics(c), **timer.metrics(), **device_memory_metrics()}
    return c.dist.reduce_metrics(metrics)  # by each value's declared reduction over ranks; time/* are rank 0's


def rollout_batch(record: StepRecord, prompts: Sequence[Sample], c: Components, parts: RolloutParts) -> RolloutBatch:
    """The step's rollout batch, from the schedule, on every rank in the same order."""
    # every rank samples and scores its share of the prompts (collect gathers the shares), or rank 0 samples all
    # and sends the batch to the others
    if c.rollout_per_rank:
        return c.schedule.collect(record.step, prompts, parts, record.timer)
    rollout = c.schedule.collect(record.step, prompts, parts, record.timer) if c.dist.is_main else None
    return c.dist.broadcast(rollout)


def old_pass(record: StepRecord, c: Components, source: str) -> None:
    """Fill the record's old log-probs (``source``: ``algorithm.old_logprobs``), the reference's, the correction
    weights, and the token statistics the advantage source declares (``needs_token_stats``)."""
    rollout = filled(record.rollout, "rollout")
    batch = filled(rollout.batch, "rollout.batch")
    rollout_logp, mask = rollout.rollout_logp, batch.response_mask
    routings = [g.routing for g in rollout.generations]
    if source == "rollout-only":  # the rollout engine's log-probs are the old ones: no pass
        c.learner.without_old_pass(batch, routings)
        train_logp, entropy = None, None
    else:
        with c.schedule.behaviour_weights():  # the weights that sampled the batch (overlap: the previous step's)
            train_logp, entropy = c.learner.old_logprobs(batch, rollout_logp, routings)
    if c.advantage.needs_token_stats:  # more passes, under the same weights as the old one
        with c.schedule.behaviour_weights():
            record.token_stats = c.learner.token_stats(batch, sorted(c.advantage.needs_token_stats))
    old_logp = filled(train_logp, "old.train") if source == "train" else rollout_logp
    ref_logp = c.reference.logprobs(batch) if c.reference is not None else None
    # without the pass the correction reads nothing of old_train (preflight: reads_train_logprobs is False)
    correction = c.correction.weights(rollout_logp if train_logp is None else train_logp, rollout_logp, mask)
    record.old = OldLogprobs(old_logp, train_logp, entropy, rollout_logp, ref_logp, correction)


def minibatch_updates(record: StepRecord, c: Components, config: RunConfig) -> None:
    """``algorithm.minibatches_per_rollout`` minibatches of shuffled rows: on each one optimizer step of the policy
    (not during the critic's warm-up), then of the critic; the policy's and the critic's metrics per minibatch."""
    critic, batch, step = c.critic, filled(record.batch, "batch"), record.step
    mask = batch.response_mask
    policy_learns = critic is None or step >= critic.warmup_steps
    record.loss_mask = loss_mask = mask * kept_tokens(c.correction, record, mask)
    old, advantages = filled(record.old, "old"), filled(record.advantages, "advantages")
    # to the loss's device once a step
    inputs = LossInputs(old.logp, advantages, loss_mask, old.reference, old.correction)
    shuffle = step_seed(config.seed, step, Stream.SHUFFLE)
    for index, rows in enumerate(minibatches(len(mask), config.algorithm.minibatches_per_rollout, shuffle)):
        seed = step_seed(config.seed, step, Stream.MINIBATCH_LOSS + index)  # components that draw at random
        if policy_learns:
            loss_fn = minibatch_loss(c.objective, inputs, rows, seed)
            record.updates.append(c.learner.update(batch, rows, loss_fn, c.objective.needs_entropy))
        if critic is not None:
            values, returns = filled(record.values, "values"), filled(record.returns, "returns")
            record.critic_updates.append(critic.update(batch, rows, values, returns))


def kept_tokens(correction: MismatchCorrection, record: StepRecord, mask: Tensor) -> Tensor:
    """The tokens the correction keeps in the policy loss (a rejected one counts as padding there); what it reports
    joins the step's reports (the train phase's scope, ``collecting(into=record.reports)``) with its weights' reports."""
    old = filled(record.old, "old")
    train = old.rollout if old.train is None else old.train  # rollout-only: the correction reads no old_train
    return correction.keep(train, old.rollout, mask, filled(record.advantages, "advantages"))


def minibatch_loss(objective: Objective, inputs: LossInputs, rows: Tensor, seed: int) -> LossFn:
    """The objective on the minibatch ``rows``, as :meth:`Learner.update` calls it: ``loss_fn(logp [, entropy])``,
    computed on the device of ``logp``, its metrics left there (the step reads them all at once)."""

    def loss_fn(logp: Tensor, entropy: Tensor | None = None) -> tuple[Tensor, dict[str, Any]]:
        old_logp, advantages, mask, reference, weights = inputs.rows(rows, logp.device)
        return objective.on_device(logp, old_logp, advantages, mask, reference, weights, seed, entropy)

    return loss_fn


def step_metrics(record: StepRecord) -> dict[str, float]:
    """The step's metrics (this rank's; the training engine's step metrics and the times aside): the updates', the
    rollout batch's, the advantages', the mismatch and the policy's entropy, the critic's and the teacher's."""
    old, mask = filled(record.old, "old"), filled(record.batch, "batch").response_mask
    mismatch, policy = {}, {}
    if old.train is not None:  # the training engine's own pass ran
        mismatch = mismatch_metrics(old.train, old.rollout, old.correction, mask)
        policy = {"policy/entropy": masked_mean(filled(old.entropy, "old.entropy"), mask).item()}
    if record.values is not None:  # there is a critic
        returns = filled(record.returns, "returns")
        critic = {**value_metrics(record.values, returns, mask), **reduce_minibatches(record.critic_updates)}
        policy = {**policy, **critic}
    if record.teacher_logp is not None:
        policy = {**policy, **distill_metrics(old.logp, record.teacher_logp, mask)}
    return {
        **reduce_minibatches(record.updates),
        **filled(record.rollout, "rollout").metrics,
        **record.advantage_metrics,
        **mismatch,
        **policy,
        **record.reports,
    }


def learners_metrics(c: Components) -> dict[str, float]:
    """The policy learner's step metrics (routing diagnostics; the engines' reports outside the updates) and the
    critic's (its engine's reports in the values pass)."""
    return {**c.learner.step_metrics(), **(c.critic.step_metrics() if c.critic is not None else {})}


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
    failed as a wrong one (``eval/episode_errors``). A service verifier's counters of the evaluation's scoring are
    logged as ``eval/<prefix>_<name>`` (``eval/remote_requests``, ...: :func:`rlzoo.services.service_metrics`)."""
    sampling = SamplingSettings(
        n=config.train.eval_samples_per_prompt,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.train.eval_temperature,
        top_p=1.0,
        seed=step_seed(config.seed, 0, Stream.EVAL),
    )
    parts = RolloutParts(
        rollout,
        episodes or EpisodeRunner(SingleTurn(), tokenizer),
        verifier,
        [],
        BatchFilter(),
        (),
        tokenizer,
        SINGLE,
        per_rank=False,
        step_rewards=False,
        config=config,
    )
    ran = parts.episodes.run(rollout, samples, sampling, config.prompt)
    groups = ran.groups
    repeated = [s for s, group in zip(samples, groups, strict=True) for _ in group]
    scores = score_last_turns(ran, repeated, parts)
    verdicts = scores.verdicts  # an episode whose environment failed scores 0
    rewards = torch.tensor([v.reward for v in verdicts])
    verdict_correct = torch.tensor([bool(v.correct) for v in verdicts])
    correct = [int(part.sum()) for part in torch.split(verdict_correct, [len(g) for g in groups])]  # per prompt
    named = verdict_parts(verdicts) or {}
    return {
        "eval/accuracy": verdict_correct.float().mean().item(),
        "eval/reward_mean": rewards.mean().item(),
        # a weighted verifier's parts held out one by one (a judge's score beside a rule that guards it)
        **{f"eval/reward_parts_{name}_mean": values.mean().item() for name, values in named.items()},
        "eval/verifier_errors": float(scores.failed),
        **mean_pass_at_k([len(g) for g in groups], correct, config.train.eval_pass_at_k),
        **{
            f"eval/{key.replace('/', '_')}": float(value)
            for key, value in ran.metrics.items()
            if key in EVAL_EPISODE_KEYS
        },
        # what scoring by a service cost (eval/remote_requests, eval/judge_prompt_tokens, ...)
        **{f"eval/{key.replace('/', '_')}": float(value) for key, value in service_metrics(scores.phase).items()},
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
    rng = random.Random(step_seed(config.seed, step, Stream.PROMPTS))
    return rng.sample(list(train_set), k=min(config.rollout.prompts_per_step, len(train_set)))
