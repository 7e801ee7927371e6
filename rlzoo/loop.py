"""The RL post-training loop, on one page.

    for step in steps:
        prompts    <- a batch of the task's train prompts
        rollouts   <- rollout engine samples `group_size` responses per prompt       (time/rollout)
        rewards    <- verifier scores every response                                (time/verify)
        advantages <- advantage source, per token                                   (time/advantage)
        old logp   <- training engine on the rollout batch, or the rollout engine's (time/old_logprobs)
                      (MoE: the experts of this pass, or R3 the rollout's, are kept for replay)
        weights    <- train-inference correction from both engines' old log-probs (e.g. TIS)
        repeat `minibatches_per_rollout` times:                                     (time/train)
            loss   <- objective(logp, old logp, advantages, mask [, reference logp])
            training engine takes one optimizer step (MoE: replaying the kept experts, R2/R3)
        rollout engine <- the new weights                                           (time/sync)

Every piece is injected (see ``rlzoo.run``); this module knows no concrete component.

Several processes (``dist``, :mod:`rlzoo.distributed`): rank 0 alone samples, scores and computes advantages,
then broadcasts the batch; every rank computes the old (and reference) log-probs of its share of the rows and
the shares are gathered, so all ranks hold the same full tensors. In an update each rank runs the forward and
backward of its share of the minibatch; the loss is computed on the gathered log-probs of the whole minibatch
(this rank's rows keep their gradient), so every aggregation sees the global batch, and it is multiplied by the
world size because the training engine averages gradients over ranks. Metrics are the whole minibatch's.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlzoo.config import RunConfig
from rlzoo.distributed import SINGLE, Dist
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings, TokenBatch, TrainingEngine
from rlzoo.engines.tokens import make_token_batch, select_rows
from rlzoo.interfaces import AdvantageSource, MismatchCorrection, RewardBatch, RouterPolicy, Sample, Verifier
from rlzoo.metrics import Timer, mean_of
from rlzoo.replay import StepRouting, routing_source
from rlzoo.objective import Objective, k3_from_samples_of_old, masked_mean
from rlzoo.scoring import char_ends_of_tokens, score, step_token_ends


@dataclass
class Components:
    objective: Objective
    advantage: AdvantageSource
    verifier: Verifier
    rollout: RolloutEngine
    trainer: TrainingEngine
    correction: MismatchCorrection
    tokenizer: Any
    reference: TrainingEngine | None = None
    router: RouterPolicy | None = None
    moe: bool = False


def step_seed(seed: int, step: int, stream: int) -> int:
    """Independent, reproducible seeds per (run seed, step, purpose): a resumed run draws the same numbers."""
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**31 - 1)


@dataclass
class RolloutBatch:
    """What rank 0 samples and scores for one step, broadcast to every rank."""

    generations: list[Generation]
    batch: TokenBatch
    rollout_logp: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    metrics: dict[str, float]


def collect(step: int, prompts: Sequence[Sample], c: Components, config: RunConfig, timer: Timer) -> RolloutBatch:
    """Sample ``group_size`` responses per prompt, score them, compute advantages (rank 0 in a multi-process run)."""
    sampling = SamplingSettings(
        n=config.rollout.group_size,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        seed=step_seed(config.seed, step, 1),
    )

    with timer("rollout"):
        groups = c.rollout.generate([encode(c.tokenizer, s.prompt) for s in prompts], sampling)
    generations = [g for group in groups for g in group]
    samples = [s for s, group in zip(prompts, groups, strict=True) for _ in group]
    group_index = torch.tensor([i for i, group in enumerate(groups) for _ in group])

    with timer("verify"):
        pieces = [[c.tokenizer.decode([t], skip_special_tokens=True) for t in g.response_ids] for g in generations]
        responses = ["".join(p) for p in pieces]
        scores = score(c.verifier, samples, responses)
    rewards = torch.tensor([v.reward for v in scores.verdicts], dtype=torch.float32)

    batch = make_token_batch(
        [g.prompt_ids for g in generations],
        [g.response_ids for g in generations],
        c.tokenizer.pad_token_id,
        response_width=config.rollout.max_new_tokens,
    )
    mask = batch.response_mask
    rollout_logp = _rollout_logprobs(generations, mask)

    with timer("advantage"):
        step_rewards, step_ends = None, None
        if c.advantage.needs_step_rewards:
            step_rewards = [v.step_rewards or [] for v in scores.verdicts]
            step_ends = [
                step_token_ends(v.step_spans or [], char_ends_of_tokens(p)) for v, p in zip(scores.verdicts, pieces)
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
        "verifier/errors": float(scores.errors),
    }
    return RolloutBatch(generations, batch, rollout_logp, rewards, advantages, metrics)


def rl_step(
    step: int, prompts: Sequence[Sample], c: Components, config: RunConfig, dist: Dist = SINGLE
) -> dict[str, float]:
    """One RL step; with several processes every rank calls it (rank 0 with the rollout engine)."""
    algo, timer = config.algorithm, Timer()
    collected = collect(step, prompts, c, config, timer) if dist.is_main else None
    collected = dist.broadcast(collected)
    generations, batch = collected.generations, collected.batch
    mask, rollout_logp, advantages = batch.response_mask, collected.rollout_logp, collected.advantages
    count = len(generations)
    local_batch = select_rows(batch, dist.share(torch.arange(count))) if dist.active else batch

    routing = StepRouting(c.trainer, routing_source(c.router), dist) if c.moe else None
    with timer("old_logprobs"):
        if routing is not None:  # MoE: record (or, R3, replay) the experts of the old-log-prob pass
            train_logp = routing.old_logprobs(batch, generations, rollout_logp)
        else:
            train_logp = dist.gather_rows(c.trainer.logprobs(local_batch), count)
        old_logp = train_logp if algo.old_logprobs == "train" else rollout_logp
        ref_logp = dist.gather_rows(c.reference.logprobs(local_batch), count) if c.reference is not None else None
        correction = c.correction.weights(train_logp, rollout_logp, mask)

    update_metrics = []
    with timer("train"):
        order = torch.randperm(count, generator=torch.Generator().manual_seed(step_seed(config.seed, step, 2)))
        for rows in torch.tensor_split(order, algo.minibatches_per_rollout):  # off-policy minibatches
            if len(rows) == 0:
                continue

            def loss_fn(logp: torch.Tensor, rows: torch.Tensor = rows) -> tuple[torch.Tensor, dict[str, float]]:
                # this rank's rows of the minibatch -> all its rows (only this rank's carry gradient)
                logp = dist.gather_rows_differentiable(logp, len(rows))
                loss, metrics = c.objective(
                    logp,
                    old_logp[rows],
                    advantages[rows],
                    mask[rows],
                    ref_logp=ref_logp[rows] if ref_logp is not None else None,
                    weights=correction[rows],
                )
                # the engine averages the ranks' gradients; each rank's holds only its rows' part of the sum
                return (loss * dist.world if dist.active else loss), metrics

            if routing is not None:  # MoE: replay the reference experts (R2/R3) and measure flips
                update_metrics.append(routing.train_step(batch, rows, loss_fn))
            else:
                update_metrics.append(c.trainer.train_step(select_rows(batch, dist.share(rows)), loss_fn))

    with timer("sync"):
        weights = c.trainer.named_weights()  # a collective under ZeRO-3 / expert parallelism: every rank calls it
        if dist.is_main:
            c.rollout.sync_weights(weights)

    metrics = mean_of(update_metrics)
    metrics["train/nonfinite_steps"] = float(sum(m.get("train/nonfinite_steps", 0.0) for m in update_metrics))
    metrics.update(
        {
            **collected.metrics,
            "mismatch/abs_logp_diff": masked_mean((train_logp - rollout_logp).abs(), mask).item(),
            "mismatch/kl": masked_mean(k3_from_samples_of_old(train_logp, rollout_logp), mask).item(),
            "mismatch/weight_mean": masked_mean(correction, mask).item(),
            **(routing.metrics if routing is not None else {}),
            **timer.metrics(),
        }
    )
    return dist.mean_metrics(metrics)  # rank-local values (e.g. train/aux_loss) averaged; time/* are rank 0's


def evaluate(samples: Sequence[Sample], c: Components, config: RunConfig) -> dict[str, float]:
    """Held-out accuracy: share of correct responses, ``train.eval_samples_per_prompt`` per prompt, sampled at
    ``train.eval_temperature`` (0 = greedy) with a fixed seed, so every evaluation sees the same random stream."""
    sampling = SamplingSettings(
        n=config.train.eval_samples_per_prompt,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.train.eval_temperature,
        top_p=1.0,
        seed=step_seed(config.seed, 0, 3),
    )
    groups = c.rollout.generate([encode(c.tokenizer, s.prompt) for s in samples], sampling)
    responses = [c.tokenizer.decode(g.response_ids, skip_special_tokens=True) for group in groups for g in group]
    repeated = [s for s, group in zip(samples, groups, strict=True) for _ in group]
    scores = score(c.verifier, repeated, responses)
    rewards = torch.tensor([v.reward for v in scores.verdicts])
    return {
        "eval/accuracy": (rewards >= 1.0).float().mean().item(),
        "eval/reward_mean": rewards.mean().item(),
        "eval/verifier_errors": float(scores.errors),
    }


def sample_prompts(train_set: Sequence[Sample], step: int, config: RunConfig) -> list[Sample]:
    rng = random.Random(step_seed(config.seed, step, 0))
    return rng.sample(list(train_set), k=min(config.rollout.prompts_per_step, len(train_set)))


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _rollout_logprobs(generations: list, mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(mask)
    for row, g in enumerate(generations):
        out[row, : len(g.response_logprobs)] = torch.tensor(g.response_logprobs, dtype=out.dtype)
    return out
