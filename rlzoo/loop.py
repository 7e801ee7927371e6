"""The RL post-training loop, on one page.

    for step in steps:
        prompts    <- a batch of the task's train prompts
        rollouts   <- rollout engine samples `group_size` responses per prompt       (time/rollout)
        rewards    <- verifier scores every response                                (time/verify)
        advantages <- advantage source, per token                                   (time/advantage)
        old logp   <- training engine on the rollout batch, or the rollout engine's (time/old_logprobs)
        weights    <- train-inference correction from both engines' old log-probs (e.g. TIS)
        repeat `minibatches_per_rollout` times:                                     (time/train)
            loss   <- objective(logp, old logp, advantages, mask [, reference logp])
            training engine takes one optimizer step
        rollout engine <- the new weights                                           (time/sync)

Every piece is injected by :mod:`rlzoo.run`; this module knows no concrete component. Processes and MoE routing
are not the loop's business: rank 0 alone samples (``Dist.from_main``), and the :class:`~rlzoo.learner.Learner`
hides the row split over ranks and, for MoE policies, the router policy's Routing Replay (:mod:`rlzoo.replay`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlzoo.config import RunConfig
from rlzoo.decode import response_text, token_char_ends
from rlzoo.distributed import SINGLE, Dist
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings, TokenBatch
from rlzoo.engines.tokens import make_token_batch
from rlzoo.interfaces import AdvantageSource, MismatchCorrection, RewardBatch, Sample, Verifier
from rlzoo.learner import Learner
from rlzoo.metrics import Timer, mean_of
from rlzoo.objective import Objective, k3_from_samples_of_old, masked_mean
from rlzoo.passk import mean_pass_at_k
from rlzoo.prompts import prompt_ids
from rlzoo.scoring import score, step_token_ends


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


def rl_step(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig) -> dict[str, float]:
    """One RL step; with several processes every rank calls it (rank 0 samples and scores)."""
    algo, timer = config.algorithm, Timer()
    rollout = c.dist.from_main(lambda: collect(step, prompts, c, config, timer))
    batch, mask, rollout_logp = rollout.batch, rollout.batch.response_mask, rollout.rollout_logp

    with timer("old_logprobs"):
        train_logp = c.learner.old_logprobs(batch, rollout_logp, [g.routing for g in rollout.generations])
        old_logp = train_logp if algo.old_logprobs == "train" else rollout_logp
        ref_logp = c.reference.logprobs(batch) if c.reference is not None else None
        correction = c.correction.weights(train_logp, rollout_logp, mask)

    update_metrics = []
    with timer("train"):
        shuffle = step_seed(config.seed, step, 2)
        for index, rows in enumerate(minibatches(len(mask), algo.minibatches_per_rollout, shuffle)):
            seed = step_seed(config.seed, step, 100 + index)  # components that draw at random (e.g. clip-cov)

            def loss_fn(logp: torch.Tensor, rows: torch.Tensor = rows, seed: int = seed) -> tuple[torch.Tensor, dict]:
                reference = ref_logp[rows] if ref_logp is not None else None
                advantages, weights = rollout.advantages[rows], correction[rows]
                return c.objective(logp, old_logp[rows], advantages, mask[rows], reference, weights, seed=seed)

            update_metrics.append(c.learner.update(batch, rows, loss_fn))

    with timer("sync"):
        c.learner.push_weights(c.rollout)

    mismatch = mismatch_metrics(train_logp, rollout_logp, correction, mask)
    metrics = {**mean_of(update_metrics), **rollout.metrics, **mismatch, **c.learner.step_metrics(), **timer.metrics()}
    return c.dist.mean_metrics(metrics)  # rank-local values (e.g. train/aux_loss) averaged; time/* are rank 0's


@dataclass
class RolloutBatch:
    """What rank 0 samples and scores for one step, sent to every rank."""

    generations: list[Generation]
    batch: TokenBatch
    rollout_logp: torch.Tensor  # [B, T] the rollout engine's log-probs of the sampled tokens
    rewards: torch.Tensor  # [B]
    advantages: torch.Tensor  # [B, T]
    metrics: dict[str, float]


def collect(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig, timer: Timer) -> RolloutBatch:
    """Sample ``group_size`` responses per prompt, score them, compute advantages."""
    sampling = SamplingSettings(
        n=config.rollout.group_size,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        seed=step_seed(config.seed, step, 1),
    )
    with timer("rollout"):
        groups = c.rollout.generate([prompt_ids(c.tokenizer, s, config.prompt) for s in prompts], sampling)
    generations = [g for group in groups for g in group]
    samples = [s for s, group in zip(prompts, groups, strict=True) for _ in group]
    group_index = torch.tensor([i for i, group in enumerate(groups) for _ in group])

    with timer("verify"):
        scores = score(c.verifier, samples, [response_text(c.tokenizer, g.response_ids) for g in generations], config.train.verifier_timeout_s)
    rewards = torch.tensor([v.reward for v in scores.verdicts], dtype=torch.float32)
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
            step_rewards = [v.step_rewards or [] for v in scores.verdicts]
            step_ends = [
                step_token_ends(v.step_spans or [], token_char_ends(c.tokenizer, g.response_ids))
                for v, g in zip(scores.verdicts, generations, strict=True)
            ]
        advantages = c.advantage.compute(RewardBatch(rewards, group_index, mask, step_rewards, step_ends))

    lengths = mask.sum(dim=1)
    metrics = {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "reward/correct_fraction": (rewards >= 1.0).float().mean().item(),
        "advantage/abs_mean": masked_mean(advantages.abs(), mask).item(),
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/finished_fraction": sum(g.finished for g in generations) / len(generations),
        **scores.metrics(),
    }
    return RolloutBatch(generations, batch, _rollout_logprobs(generations, mask), rewards, advantages, metrics)


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
    correct = [int(part.sum()) for part in torch.split(rewards >= 1.0, [len(g) for g in groups])]  # per prompt
    return {
        "eval/accuracy": (rewards >= 1.0).float().mean().item(),
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


def sample_prompts(train_set: Sequence[Sample], step: int, config: RunConfig) -> list[Sample]:
    rng = random.Random(step_seed(config.seed, step, 0))
    return rng.sample(list(train_set), k=min(config.rollout.prompts_per_step, len(train_set)))


def _rollout_logprobs(generations: list[Generation], mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(mask)
    for row, g in enumerate(generations):
        out[row, : len(g.response_logprobs)] = torch.tensor(g.response_logprobs, dtype=out.dtype)
    return out
