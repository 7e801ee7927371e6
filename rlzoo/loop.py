"""The RL post-training loop, on one page.

    for step in steps:
        prompts    <- a batch of the task's train prompts
        repeat up to the batch filter's `max_gen_batches` times, fresh prompts after the first:
            rollouts <- rollout engine samples `group_size` responses per prompt     (time/rollout)
                        (several processes: each rank its share of the prompts, gathered)
            rewards  <- verifier scores every response (+ reward shapers' terms)     (time/verify)
            keep the groups the batch filter keeps; stop once `prompts_per_step` are kept
        (no group kept: skip the update)
        advantages <- advantage source, per token                                   (time/advantage)
        old logp   <- training engine on the rollout batch (+ entropy), or the rollout engine's  (time/old_logprobs)
                      (old_logprobs: rollout-only skips the training engine's pass)
        weights    <- train-inference correction from both engines' old log-probs (e.g. TIS)
        repeat `minibatches_per_rollout` times:                                     (time/train)
            loss   <- objective(logp, old logp, advantages, mask [, reference logp]) (+ regularisers)
            training engine takes one optimizer step
        rollout engine(s) <- the new weights                                        (time/sync)

Every piece is injected by :mod:`rlzoo.run`; this module knows no concrete component. With several processes
each rank samples and scores its contiguous share of the prompts with its own engine and the shares are gathered
(``Components.rollout_per_rank``), or rank 0 alone samples and the batch is broadcast (``Dist.from_main``);
either way every rank then holds the whole batch in the same order. MoE routing and the rest of the row split
are not the loop's business: the :class:`~rlzoo.learner.Learner` hides the split over ranks and, for MoE
policies, the router policy's Routing Replay (:mod:`rlzoo.routing_learner`).

When the rollouts are sampled is the :class:`RolloutSchedule`'s business: by default at the start of their step,
by the weights it trains from; with ``rollout.overlap: 1`` (:mod:`rlzoo.overlap`) step t+1's batch is sampled while
step t trains, and its old log-probs are computed under the weights that sampled it.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rlzoo.config import RunConfig
from rlzoo.decode import response_text, token_char_ends
from rlzoo.distributed import SINGLE, Dist
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings, TokenBatch
from rlzoo.engines.tokens import make_token_batch
from rlzoo.interfaces import (
    AdvantageSource,
    BatchFilter,
    MismatchCorrection,
    RewardBatch,
    RewardShaper,
    Sample,
    Verdict,
    Verifier,
)
from rlzoo.learner import Learner
from rlzoo.metrics import Timer, mean_of
from rlzoo.objective import Objective, k3_from_samples_of_old, masked_mean
from rlzoo.passk import mean_pass_at_k
from rlzoo.prompts import prompt_ids
from rlzoo.scoring import score, step_token_ends

_log = logging.getLogger("rlzoo.loop")


@dataclass
class Components:
    """Everything one RL step uses (assembled by :mod:`rlzoo.run`)."""

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


class RolloutSchedule:
    """When a step's rollout batch is sampled and under which weights its old log-probs are computed.

    This base samples each batch at the start of its step (:func:`collect`), with the weights the step trains
    from, so nothing is in flight across steps. :class:`rlzoo.overlap.OverlappedRollouts` (``rollout.overlap: 1``)
    samples step t+1's batch while step t trains."""

    def collect(self, step: int, prompts: Sequence[Sample], c: Components, config: RunConfig, timer: Timer) -> RolloutBatch:
        """Step ``step``'s rollout batch (on rank 0, or on every rank with per-rank rollouts)."""
        return collect(step, prompts, c, config, timer)

    def behaviour_weights(self) -> AbstractContextManager[None]:
        """Around the old-log-prob pass of the batch :meth:`collect` returned last: the training engine holds the
        weights that sampled it."""
        return nullcontext()

    def settle(self, timer: Timer, new_weights: bool = False) -> None:
        """Before a step returns: no generation is in flight; ``new_weights``: the rollout engine is about to
        receive the step's updated weights."""

    def close(self) -> None:
        """When the run ends (also by an error): wait for any generation still in flight."""


def rl_step(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig) -> dict[str, float]:
    """One RL step; with several processes every rank calls it (each samples its share, or rank 0 samples all)."""
    algo, timer = config.algorithm, Timer()
    sample = lambda: c.schedule.collect(step, prompts, c, config, timer)  # noqa: E731
    # every rank samples and scores its share of the prompts (collect gathers the shares), or rank 0 samples all
    rollout = sample() if c.rollout_per_rank else c.dist.from_main(sample)
    if rollout.batch is None:  # the batch filter kept no group: nothing to learn from, the weights stay
        c.schedule.settle(timer)
        return c.dist.mean_metrics({**rollout.metrics, **timer.metrics()})
    batch, mask, rollout_logp = rollout.batch, rollout.batch.response_mask, rollout.rollout_logp

    with timer("old_logprobs"):
        routings = [g.routing for g in rollout.generations]
        if algo.old_logprobs == "rollout-only":  # the rollout engine's log-probs are the old ones: no pass
            c.learner.without_old_pass(batch, routings)
            train_logp, old_entropy = None, None
        else:
            with c.schedule.behaviour_weights():  # the weights that sampled the batch (overlap: the previous step's)
                train_logp, old_entropy = c.learner.old_logprobs(batch, rollout_logp, routings)
        old_logp = train_logp if algo.old_logprobs == "train" else rollout_logp
        ref_logp = c.reference.logprobs(batch) if c.reference is not None else None
        # without the pass the correction reads nothing of old_train (preflight: reads_train_logprobs is False)
        correction = c.correction.weights(rollout_logp if train_logp is None else train_logp, rollout_logp, mask)

    update_metrics = []
    with timer("train"):
        shuffle = step_seed(config.seed, step, 2)
        for index, rows in enumerate(minibatches(len(mask), algo.minibatches_per_rollout, shuffle)):
            seed = step_seed(config.seed, step, 100 + index)  # components that draw at random (e.g. clip-cov)

            def loss_fn(logp: Tensor, entropy: Tensor | None = None, rows: Tensor = rows, seed: int = seed) -> tuple:
                reference = ref_logp[rows] if ref_logp is not None else None
                advantages, weights = rollout.advantages[rows], correction[rows]
                return c.objective(logp, old_logp[rows], advantages, mask[rows], reference, weights, seed, entropy)

            update_metrics.append(c.learner.update(batch, rows, loss_fn, c.objective.needs_entropy))

    c.schedule.settle(timer, new_weights=True)  # the rollout engine's weights never change under a generation
    with timer("sync"):
        c.learner.push_weights(c.rollout, every_rank=c.rollout_per_rank)

    mismatch, policy = {}, {}
    if train_logp is not None:  # the training engine's own pass ran
        mismatch = mismatch_metrics(train_logp, rollout_logp, correction, mask)
        policy = {"policy/entropy": masked_mean(old_entropy, mask).item()}
    metrics = {**mean_of(update_metrics), **rollout.metrics, **mismatch, **policy, **c.learner.step_metrics()}
    return c.dist.mean_metrics({**metrics, **timer.metrics()})  # rank-local values averaged; time/* are rank 0's


@dataclass
class RolloutBatch:
    """What rank 0 samples and scores for one step, sent to every rank. ``batch`` is ``None`` (and the tensors
    empty) when the batch filter kept no group: the step has nothing to train on."""

    generations: list[Generation]
    batch: TokenBatch | None
    rollout_logp: torch.Tensor  # [B, T] the rollout engine's log-probs of the sampled tokens
    rewards: torch.Tensor  # [B] the verifier's rewards plus the reward shapers' terms
    advantages: torch.Tensor  # [B, T]
    metrics: dict[str, float]


@dataclass
class ScoredGroup:
    """One prompt's ``group_size`` responses, scored and shaped."""

    sample: Sample
    generations: list[Generation]
    verdicts: list[Verdict]
    rewards: torch.Tensor  # [n] the verifier's rewards
    shaping: torch.Tensor  # [n] the sum of the reward shapers' terms


def collect(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig, timer: Timer) -> RolloutBatch:
    """Sample ``group_size`` responses per prompt, score and shape them, keep the groups the batch filter keeps,
    compute advantages.

    While fewer than ``len(prompts)`` groups are kept, further generation batches of as many fresh prompts (not
    yet drawn this step) are sampled, up to the filter's ``max_gen_batches``; each batch has its own reproducible
    seeds. The first ``len(prompts)`` kept groups are trained on; fewer is an under-filled batch (a warning and
    ``filter/underfilled``), none a skipped step (``filter/skipped``)."""
    target, limit = len(prompts), c.batch_filter.max_gen_batches()
    scored: list[ScoredGroup] = []
    kept: list[ScoredGroup] = []
    faults, gen_batch, batch_prompts = Counter(), 0, list(prompts)
    while batch_prompts:
        groups, batch_faults = generate_and_score(step, gen_batch, batch_prompts, c, config, timer)
        rewards = torch.cat([g.rewards + g.shaping for g in groups])
        group_index = torch.tensor([i for i, g in enumerate(groups) for _ in g.generations])
        keep = c.batch_filter.keep(rewards, group_index)
        scored, gen_batch = scored + groups, gen_batch + 1
        faults.update(batch_faults)
        kept += [g for g, flag in zip(groups, keep.tolist(), strict=True) if flag]
        if len(kept) >= target or gen_batch >= limit:
            break
        batch_prompts = fresh_prompts(c.train_set, {g.sample.prompt for g in scored}, step, gen_batch, target, config)
    informative, kept = len(kept), kept[:target]
    if len(kept) < target:
        _log.warning(
            "step %d: the batch filter %r kept %d of %d prompt groups after %d generation batch(es) "
            "(max_gen_batches); %s", step, c.batch_filter.name, len(kept), target, gen_batch,
            "training on those" if kept else "skipping this step's update",
        )
    metrics = {
        **rollout_metrics(scored, dict(faults)),
        "filter/kept_fraction": informative / len(scored),
        "filter/gen_batches": float(gen_batch),
        "filter/underfilled": float(0 < len(kept) < target),
        "filter/skipped": float(not kept),
    }
    return assemble(kept, c, config, timer, metrics)


def generate_and_score(
    step: int, gen_batch: int, prompts: Sequence[Sample], c: Components, config: RunConfig, timer: Timer
) -> tuple[list[ScoredGroup], dict[str, float]]:
    """One generation batch: ``group_size`` responses per prompt, the verifier's rewards and the shapers' terms;
    also the verifier's fault counts (``verifier/errors``, ``/timeouts``, ``/nonfinite_rewards``).

    With ``c.rollout_per_rank`` rank ``r`` samples and scores ``Dist.share_items(prompts)`` (whole groups, so
    group-relative advantages are unchanged) with seed ``rank_seed(seed, r)``; the shares are all-gathered in rank
    order, so every rank returns the groups in the order of ``prompts``, as one engine would."""
    ranks = c.dist if c.rollout_per_rank else SINGLE
    seed = step_seed(config.seed, step, 1) if gen_batch == 0 else step_seed(config.seed, step, 30_000 + gen_batch)
    sampling = SamplingSettings(
        n=config.rollout.group_size,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        seed=rank_seed(seed, ranks.rank),
    )
    mine = ranks.share_items(prompts)
    if ranks.active:  # in every rank's log file: which ranks sampled what
        _log.info("step %d batch %d: rank %d samples %d of %d prompts", step, gen_batch, ranks.rank, len(mine), len(prompts))
    with timer("rollout"):  # includes waiting for the slowest rank's share
        local = c.rollout.generate([prompt_ids(c.tokenizer, s, config.prompt) for s in mine], sampling) if mine else []
        shares = ranks.all_gather_object(local)
    with timer("verify"):
        samples = [s for s, group in zip(mine, local, strict=True) for _ in group]
        responses = [response_text(c.tokenizer, g.response_ids) for group in local for g in group]
        all_scores = ranks.all_gather_object(score(c.verifier, samples, responses, config.train.verifier_timeout_s))
    groups = [group for share in shares for group in share]
    generations = [g for group in groups for g in group]
    verdicts = [v for scores in all_scores for v in scores.verdicts]
    faults = Counter()
    for scores in all_scores:
        faults.update(scores.metrics())
    rewards = torch.tensor([v.reward for v in verdicts], dtype=torch.float32)
    lengths = torch.tensor([len(g.response_ids) for g in generations])
    shaping = torch.zeros_like(rewards)
    for shaper in c.shapers:
        shaping = shaping + shaper.shape(rewards, lengths, config.rollout.max_new_tokens)
    out, start = [], 0
    for sample, group in zip(prompts, groups, strict=True):
        rows = slice(start, start + len(group))
        out.append(ScoredGroup(sample, group, verdicts[rows], rewards[rows], shaping[rows]))
        start += len(group)
    return out, dict(faults)


def assemble(
    groups: list[ScoredGroup], c: Components, config: RunConfig, timer: Timer, metrics: dict[str, float]
) -> RolloutBatch:
    """The kept groups as one padded batch with per-token advantages (an empty batch when none was kept)."""
    generations = [g for group in groups for g in group.generations]
    verdicts = [v for group in groups for v in group.verdicts]
    if not groups:
        empty = torch.zeros(0, config.rollout.max_new_tokens)
        return RolloutBatch([], None, empty, torch.zeros(0), empty, metrics)
    rewards = torch.cat([g.rewards + g.shaping for g in groups])
    group_index = torch.tensor([i for i, group in enumerate(groups) for _ in group.generations])
    batch = make_token_batch(
        [g.prompt_ids for g in generations],
        [g.response_ids for g in generations],
        c.tokenizer.pad_token_id,
        response_width=config.rollout.max_new_tokens,
    )
    mask = batch.response_mask
    with timer("advantage"):
        step_rewards, step_ends = None, None
        if c.advantage.needs_step_rewards:
            step_rewards = [v.step_rewards or [] for v in verdicts]
            step_ends = [
                step_token_ends(v.step_spans or [], token_char_ends(c.tokenizer, g.response_ids))
                for v, g in zip(verdicts, generations, strict=True)
            ]
        advantages = c.advantage.compute(RewardBatch(rewards, group_index, mask, step_rewards, step_ends))
    metrics = {**metrics, "advantage/abs_mean": masked_mean(advantages.abs(), mask).item()}
    return RolloutBatch(generations, batch, _rollout_logprobs(generations, mask), rewards, advantages, metrics)


def rollout_metrics(groups: list[ScoredGroup], verifier_faults: dict[str, float]) -> dict[str, float]:
    """Rewards and response lengths of everything sampled this step (kept by the batch filter or not)."""
    rewards = torch.cat([g.rewards for g in groups])
    shaping = torch.cat([g.shaping for g in groups])
    generations = [g for group in groups for g in group.generations]
    correct = [v.correct for group in groups for v in group.verdicts]
    lengths = torch.tensor([len(g.response_ids) for g in generations], dtype=torch.float32)
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "reward/correct_fraction": sum(correct) / len(correct),
        "reward/shaping_mean": shaping.mean().item(),
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/finished_fraction": sum(g.finished for g in generations) / len(generations),
        **verifier_faults,
    }


def evaluate(
    samples: Sequence[Sample], rollout: RolloutEngine, verifier: Verifier, tokenizer: Any, config: RunConfig
) -> dict[str, float]:
    """Held-out accuracy: share of correct responses, ``train.eval_samples_per_prompt`` per prompt, sampled at
    ``train.eval_temperature`` (0 = greedy) with a fixed seed, so every evaluation sees the same random stream."""
    sampling = SamplingSettings(
        n=config.train.eval_samples_per_prompt,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.train.eval_temperature,
        top_p=1.0,
        seed=step_seed(config.seed, 0, 3),
    )
    groups = rollout.generate([prompt_ids(tokenizer, s, config.prompt) for s in samples], sampling)
    responses = [response_text(tokenizer, g.response_ids) for group in groups for g in group]
    repeated = [s for s, group in zip(samples, groups, strict=True) for _ in group]
    scores = score(verifier, repeated, responses, config.train.verifier_timeout_s)
    rewards = torch.tensor([v.reward for v in scores.verdicts])
    verdict_correct = torch.tensor([bool(v.correct) for v in scores.verdicts])
    correct = [int(part.sum()) for part in torch.split(verdict_correct, [len(g) for g in groups])]  # per prompt
    return {
        "eval/accuracy": verdict_correct.float().mean().item(),
        "eval/reward_mean": rewards.mean().item(),
        "eval/verifier_errors": float(scores.failed),
        **mean_pass_at_k([len(g) for g in groups], correct, config.train.eval_pass_at_k),
    }


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


def step_seed(seed: int, step: int, stream: int) -> int:
    """Independent, reproducible seeds per (run seed, step, purpose): a resumed run draws the same numbers."""
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**31 - 1)


def rank_seed(seed: int, rank: int) -> int:
    """Rank ``rank``'s sampling seed for a generation batch seeded ``seed``: rank 0 keeps it (one process samples
    as it always did), the others get independent streams, so no two ranks draw correlated samples."""
    return seed if rank == 0 else step_seed(seed, rank, 40_000)


def sample_prompts(train_set: Sequence[Sample], step: int, config: RunConfig) -> list[Sample]:
    rng = random.Random(step_seed(config.seed, step, 0))
    return rng.sample(list(train_set), k=min(config.rollout.prompts_per_step, len(train_set)))


def fresh_prompts(
    train_set: Sequence[Sample], drawn: set[str], step: int, gen_batch: int, count: int, config: RunConfig
) -> list[Sample]:
    """Up to ``count`` prompts of ``train_set`` not yet ``drawn`` this step, for generation batch ``gen_batch``."""
    rng = random.Random(step_seed(config.seed, step, 20_000 + gen_batch))
    unseen = [s for s in train_set if s.prompt not in drawn]
    return rng.sample(unseen, k=min(count, len(unseen)))


def _rollout_logprobs(generations: list[Generation], mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(mask)
    for row, g in enumerate(generations):
        out[row, : len(g.response_logprobs)] = torch.tensor(g.response_logprobs, dtype=out.dtype)
    return out
