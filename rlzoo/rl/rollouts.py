"""A step's rollout batch: sample ``group_size`` responses per prompt, score and shape them, keep the groups the
batch filter keeps (:mod:`rlzoo.rl.schedule` says when that happens).

    collect(step, prompts):
        repeat up to the batch filter's `max_gen_batches` times, fresh prompts after the first:
            generate_and_score: rollouts <- rollout engine (several processes: each rank its share, gathered)
                                rewards  <- verifier (+ reward shapers' terms; named reward parts, if any)
                                baseline <- one greedy response per prompt, scored alike (needs_greedy_baseline)
            keep the groups the batch filter keeps; stop once `len(prompts)` are kept
        assemble: the kept groups as one padded TokenBatch, rewards per response and per token

:func:`rlzoo.rl.loop.rl_step` asks its schedule for the step's batch; the base
:class:`rlzoo.rl.schedule.RolloutSchedule` calls :func:`collect` at the
start of the step, :class:`rlzoo.rl.overlap.OverlappedRollouts` (``rollout.overlap: 1``) calls the same function one
step ahead in a background thread. Neither calls back into the loop: they take :class:`RolloutParts`, what sampling,
scoring and assembling use, not the step's whole :class:`~rlzoo.rl.loop.Components`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rlzoo.config.schema import RunConfig
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings, TokenBatch
from rlzoo.engines.tokens import make_token_batch
from rlzoo.episodes.runner import EpisodeBatch, EpisodeRunner
from rlzoo.errors import RlzooError
from rlzoo.interfaces import BatchFilter, RewardBatch, RewardShaper, Sample, Verdict, Verifier
from rlzoo.interfaces.base import collecting
from rlzoo.rl.scoring import Scores, score, step_token_ends
from rlzoo.runtime.distributed import SINGLE, Dist
from rlzoo.util.decode import response_text, token_char_ends
from rlzoo.util.reductions import reduce_minibatches
from rlzoo.util.seeds import Stream, generation_seed, rank_seed, step_seed
from rlzoo.util.timer import Timer

_log = logging.getLogger("rlzoo.rl.loop")


@dataclass
class RolloutParts:
    """What sampling, scoring and assembling a rollout batch use, and no more: picked out of the step's components
    (where their defaults live) by :attr:`rlzoo.rl.loop.Components.rollout_parts`."""

    engine: RolloutEngine
    episodes: EpisodeRunner  # what an episode is
    verifier: Verifier
    shapers: list[RewardShaper]
    batch_filter: BatchFilter
    train_set: Sequence[Sample]  # where a batch filter's further generation batches draw fresh prompts
    tokenizer: Any
    dist: Dist
    per_rank: bool  # every rank samples its share of the prompts with its own started engine
    step_rewards: bool  # the advantage source reads per-step rewards (needs_step_rewards): assemble places them
    config: RunConfig  # the run's: sampling, prompts, seeds, the verifier's timeout, the response budget
    greedy_baseline: bool = False  # the advantage source reads a greedy response's reward (needs_greedy_baseline)

    @property
    def ranks(self) -> Dist:
        """The processes that share a generation batch's prompts: the run's with per-rank rollouts, else one."""
        return self.dist if self.per_rank else SINGLE


@dataclass
class RolloutBatch:
    """What rank 0 samples and scores for one step, sent to every rank. ``batch`` is ``None`` (and the tensors
    empty) when the batch filter kept no group: the step has nothing to train on."""

    generations: list[Generation]
    batch: TokenBatch | None
    rollout_logp: torch.Tensor  # [B, T] the rollout engine's log-probs of the sampled tokens
    rewards: RewardBatch  # per response (the verifier's rewards plus the shapers' terms) and per token
    metrics: dict[str, float]


@dataclass
class ScoredGroup:
    """One prompt's ``group_size`` responses, scored and shaped."""

    sample: Sample
    generations: list[Generation]
    verdicts: list[Verdict]
    rewards: torch.Tensor  # [n] the verifier's rewards plus the environment's turn rewards
    shaping: torch.Tensor  # [n] the sum of the reward shapers' terms
    baseline: float | None = None  # the reward of one greedy response to the prompt (greedy_baseline), all terms


def collect(step: int, prompts: Sequence[Sample], parts: RolloutParts, timer: Timer) -> RolloutBatch:
    """Sample ``group_size`` responses per prompt, score and shape them, keep the groups the batch filter keeps.

    While fewer than ``len(prompts)`` groups are kept, further generation batches of as many fresh prompts (not
    yet drawn this step) are sampled, up to the filter's ``max_gen_batches``; each batch has its own reproducible
    seeds. The first ``len(prompts)`` kept groups are trained on; fewer is an under-filled batch (a warning and
    ``filter/underfilled``), none a skipped step (``filter/skipped``)."""
    config, target, limit = parts.config, len(prompts), parts.batch_filter.max_gen_batches()
    scored: list[ScoredGroup] = []
    kept: list[ScoredGroup] = []
    per_batch, gen_batch, batch_prompts = [], 0, list(prompts)  # each generation batch's faults and reports
    while batch_prompts:
        _log_shares(step, gen_batch, batch_prompts, parts)
        seed = generation_seed(config.seed, step, gen_batch)
        groups, batch_metrics = generate_and_score(batch_prompts, seed, parts, timer)
        rewards = torch.cat([g.rewards + g.shaping for g in groups])
        group_index = torch.tensor([i for i, g in enumerate(groups) for _ in g.generations])
        with collecting() as filter_reports:  # the batch filter's, of this generation batch
            keep = parts.batch_filter.keep(rewards, group_index)
        per_batch.append({**batch_metrics, **filter_reports})
        scored, gen_batch = scored + groups, gen_batch + 1
        kept += [g for g, flag in zip(groups, keep.tolist(), strict=True) if flag]
        if len(kept) >= target or gen_batch >= limit:
            break
        drawn = {g.sample.prompt for g in scored}
        seed = step_seed(config.seed, step, Stream.FRESH_PROMPTS + gen_batch)
        batch_prompts = fresh_prompts(parts.train_set, drawn, seed, target)
    informative, kept = len(kept), kept[:target]
    if len(kept) < target:
        _log.warning(
            "step %d: the batch filter %r kept %d of %d prompt groups after %d generation batch(es) "
            "(max_gen_batches); %s",
            step,
            parts.batch_filter.name,
            len(kept),
            target,
            gen_batch,
            "training on those" if kept else "skipping this step's update",
        )
    metrics = {
        **rollout_metrics(scored, reduce_minibatches(per_batch)),
        "filter/kept_fraction": informative / len(scored),
        "filter/gen_batches": float(gen_batch),
        "filter/underfilled": float(0 < len(kept) < target),
        "filter/skipped": float(not kept),
    }
    return assemble(kept, parts, metrics)


def _log_shares(step: int, gen_batch: int, prompts: Sequence[Sample], parts: RolloutParts) -> None:
    """In every rank's log file, with per-rank rollouts in several processes: which ranks sample what."""
    ranks = parts.ranks
    if ranks.active:
        mine = ranks.share_items(prompts)
        _log.info(
            "step %d batch %d: rank %d samples %d of %d prompts", step, gen_batch, ranks.rank, len(mine), len(prompts)
        )


def generate_and_score(
    prompts: Sequence[Sample], seed: int, parts: RolloutParts, timer: Timer
) -> tuple[list[ScoredGroup], dict[str, float]]:
    """One generation batch: ``group_size`` responses per prompt, the verifier's rewards and the shapers' terms;
    also the verifier's fault counts (``verifier/errors``, ``/timeouts``, ``/nonfinite_rewards``, summed over the
    ranks' shares) and what the rollout engine (``rollout_engine/<name>/*``, each rank's share combined as the
    values declare) and the reward shapers reported.

    With ``parts.per_rank`` rank ``r`` samples and scores ``Dist.share_items(prompts)`` (whole groups, so
    group-relative advantages are unchanged) with seed ``rank_seed(seed, r)``; the shares are all-gathered in rank
    order, so every rank returns the groups in the order of ``prompts``, as one engine would."""
    ranks, config = parts.ranks, parts.config
    sampling = SamplingSettings(
        n=config.rollout.group_size,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        seed=rank_seed(seed, ranks.rank),
    )
    mine = ranks.share_items(prompts)
    with timer("rollout"):  # includes waiting for the slowest rank's share (episodes: tools and all turns)
        with collecting() as sampled:  # the rollout engine's (and the episodes' components') on this rank's share
            ran = parts.episodes.run(parts.engine, mine, sampling, config.prompt) if mine else EpisodeBatch([])
        local = ran.groups
        shares = ranks.all_gather_object((local, {**ran.metrics, **sampled}))
    with timer("verify"):
        samples = [s for s, group in zip(mine, local, strict=True) for _ in group]
        all_scores = ranks.all_gather_object(score_last_turns(ran, samples, parts))
    baselines: list[float] = []
    greedy_scores: list[Scores] = []
    if parts.greedy_baseline:
        baselines, greedy_scores = greedy_baselines(mine, sampling, parts, timer)
    groups = [group for share, _ in shares for group in share]
    generations = [g for group in groups for g in group]
    verdicts = [v for scores in all_scores for v in scores.verdicts]
    # fault and tool counts: the shares' sum
    metrics = reduce_minibatches([s.metrics() for s in [*all_scores, *greedy_scores]] + [m for _, m in shares if m])
    rewards = episode_rewards(verdicts, generations)
    shaping, reports = shaping_terms(rewards, generations, parts)
    metrics.update(reports)
    out: list[ScoredGroup] = []
    start = 0
    for sample, group in zip(prompts, groups, strict=True):
        rows = slice(start, start + len(group))
        baseline = baselines[len(out)] if baselines else None
        out.append(ScoredGroup(sample, group, verdicts[rows], rewards[rows], shaping[rows], baseline))
        start += len(group)
    return out, metrics


def greedy_baselines(
    mine: Sequence[Sample], sampling: SamplingSettings, parts: RolloutParts, timer: Timer
) -> tuple[list[float], list[Scores]]:
    """ReMax's baselines (verl: one ``do_sample=False`` generation per prompt): the reward of one greedy response
    to each prompt, counted as the sampled ones are (verifier, turn rewards, shapers' terms), in the order of all
    ranks' prompts; and each rank's scores (their faults count as the step's). Timed as ``time/baseline``."""
    with timer("baseline"):
        greedy = replace(sampling, n=1, temperature=0.0, top_p=1.0)
        ran = parts.episodes.run(parts.engine, mine, greedy, parts.config.prompt) if mine else EpisodeBatch([])
        generations = [group[0] for group in ran.groups]
        scores = score_last_turns(ran, list(mine), parts)
        rewards = episode_rewards(scores.verdicts, generations)
        # the step reports the shapers' view of the sampled responses, not of these
        shaped = rewards + shaping_terms(rewards, generations, parts)[0]
        gathered = parts.ranks.all_gather_object((shaped.tolist(), scores))
    return [b for share, _ in gathered for b in share], [s for _, s in gathered]


def score_last_turns(ran: EpisodeBatch, samples: list[Sample], parts: RolloutParts) -> Scores:
    """The verifier's scores of each episode's last turn (decoded), ``samples`` one per episode in order; an episode
    whose environment failed scores 0 (its verdict replaced; the verifier's faults stay counted). Training, the
    greedy baselines and evaluation score this way."""
    responses = [response_text(parts.tokenizer, g.last_turn_ids) for group in ran.groups for g in group]
    scores = score(parts.verifier, samples, responses, parts.config.train.verifier_timeout_s)
    return replace(scores, verdicts=ran.scored(scores.verdicts))


def episode_rewards(verdicts: Sequence[Verdict], generations: Sequence[Generation]) -> torch.Tensor:
    """``[n]`` each episode's reward: the verifier's plus the environment's turn rewards."""
    return torch.tensor([v.reward + sum(g.turn_rewards or ()) for v, g in zip(verdicts, generations, strict=True)])


def shaping_terms(
    rewards: torch.Tensor, generations: Sequence[Generation], parts: RolloutParts
) -> tuple[torch.Tensor, dict[str, float]]:
    """``[n]`` the sum of the reward shapers' terms (each reads the rewards and the policy tokens of all turns), and
    what the shapers reported."""
    lengths = torch.tensor([g.policy_tokens for g in generations])
    shaping = torch.zeros_like(rewards)
    with collecting() as reports:
        for shaper in parts.shapers:
            shaping = shaping + shaper.shape(rewards, lengths, parts.config.response_budget())
    return shaping, reports


def assemble(groups: list[ScoredGroup], parts: RolloutParts, metrics: dict[str, float]) -> RolloutBatch:
    """The kept groups as one padded batch with their rewards per response and per token (an empty batch when none
    was kept); advantages come later, once the old log-probs and values are known (:func:`advantages`)."""
    config, generations = parts.config, [g for group in groups for g in group.generations]
    verdicts = [v for group in groups for v in group.verdicts]
    if not groups:
        empty = torch.zeros(0, config.rollout.max_new_tokens)
        return RolloutBatch(
            [], None, empty, RewardBatch(torch.zeros(0), torch.zeros(0, dtype=torch.long), empty), metrics
        )
    rewards = torch.cat([g.rewards + g.shaping for g in groups])
    group_index = torch.tensor([i for i, group in enumerate(groups) for _ in group.generations])
    batch = make_token_batch(
        [g.prompt_ids for g in generations],
        [g.response_ids for g in generations],
        parts.tokenizer.pad_token_id,
        response_width=parts.episodes.response_width(config.rollout.max_new_tokens),
        policy_masks=[g.policy_mask for g in generations],
    )
    mask = batch.response_mask
    turn_rewards, turn_ends = turn_steps(groups)
    step_rewards, step_ends = None, None
    if parts.step_rewards and parts.episodes.environment.gives_turn_rewards:
        step_rewards, step_ends = turn_rewards, turn_ends
    elif parts.step_rewards:
        step_rewards = [v.step_rewards or [] for v in verdicts]
        step_ends = [  # the verifier's steps lie in the last turn: after the earlier turns' policy tokens
            [
                g.policy_tokens - len(g.last_turn_ids) + end
                for end in step_token_ends(v.step_spans or [], token_char_ends(parts.tokenizer, g.last_turn_ids))
            ]
            for v, g in zip(verdicts, generations, strict=True)
        ]
    token_rewards = token_level_rewards(turn_rewards, turn_ends, mask)
    reward_batch = RewardBatch(
        rewards,
        group_index,
        mask,
        step_rewards,
        step_ends,
        token_rewards=token_rewards,
        reward_parts=reward_parts(groups, parts),
        reward_baselines=_baselines(groups) if parts.greedy_baseline else None,
    )
    return RolloutBatch(generations, batch, _rollout_logprobs(generations, mask), reward_batch, metrics)


def verdict_parts(verdicts: Sequence[Verdict]) -> dict[str, torch.Tensor] | None:
    """Each named reward part of the verdicts (sorted by name), ``[n]``, 0 where a verdict lacks it (as a verifier
    fault scores 0); ``None`` when no verdict carries parts."""
    names = sorted({name for v in verdicts for name in (v.parts or {})})
    if not names:
        return None
    return {name: torch.tensor([float((v.parts or {}).get(name, 0.0)) for v in verdicts]) for name in names}


def reward_parts(groups: list[ScoredGroup], parts: RolloutParts) -> dict[str, torch.Tensor] | None:
    """The verdicts' reward parts and, beside them, the other terms of the reward as parts of their own: ``shaping``
    (the shapers' terms) when there are shapers, ``turns`` (the environment's turn rewards) when it gives them; so
    that an advantage normalising parts one by one (``gdpo``) loses no term. ``None`` without verdict parts."""
    out = verdict_parts([v for group in groups for v in group.verdicts])
    if out is None:
        return None
    extra = {}
    if parts.shapers:
        extra["shaping"] = torch.cat([g.shaping for g in groups])
    if parts.episodes.environment.gives_turn_rewards:
        extra["turns"] = torch.tensor([float(sum(g.turn_rewards or ())) for group in groups for g in group.generations])
    clash = sorted(set(extra) & set(out))
    if clash:
        raise RlzooError(
            f"verifier: its verdicts carry a reward part named {clash[0]!r}, a name kept for the reward's "
            f"{'shapers' if clash[0] == 'shaping' else 'turn rewards'}: rename the verifier's part"
        )
    return {**out, **extra}


def _baselines(groups: list[ScoredGroup]) -> torch.Tensor:
    out: list[float] = []
    for group in groups:
        assert group.baseline is not None  # generate_and_score gives every group one (greedy_baseline)
        out += [float(group.baseline)] * len(group.generations)
    return torch.tensor(out)


def token_level_rewards(
    step_rewards: list[list[float]], step_ends: list[list[int]], mask: torch.Tensor
) -> torch.Tensor:
    """``[B, T]`` each step's reward at its last policy token (``step_ends`` count policy tokens, i.e. the columns
    where ``mask`` is 1), 0 elsewhere: verl's ``token_level_scores`` (one step: the outcome at the last token)."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for row, (rewards_i, ends_i) in enumerate(zip(step_rewards, step_ends, strict=True)):
        columns = torch.nonzero(mask[row] > 0).flatten()
        for reward, end in zip(rewards_i, ends_i, strict=True):
            if 0 < end <= len(columns):  # a step without policy tokens has nowhere to put its reward
                out[row, columns[end - 1]] += reward
    return out


def turn_steps(groups: list[ScoredGroup]) -> tuple[list[list[float]], list[list[int]]]:
    """One step per turn of each episode (for ``process``): the environment's turn rewards, the verifier's reward
    and the shapers' terms added to the last; each step ends after its turn's policy tokens."""
    rewards, ends = [], []
    for group in groups:
        for g, outcome in zip(group.generations, (group.rewards + group.shaping).tolist(), strict=True):
            turn_rewards = list(g.turn_rewards or [0.0])
            turn_rewards[-1] += outcome - sum(g.turn_rewards or ())  # group.rewards holds the turn rewards' sum
            rewards.append(turn_rewards)
            spans = g.turns or [(0, len(g.response_ids))]
            ends.append(torch.cumsum(torch.tensor([e - s for s, e in spans]), 0).tolist())
    return rewards, ends


def rollout_metrics(groups: list[ScoredGroup], batch_metrics: dict[str, float]) -> dict[str, float]:
    """Rewards and response lengths of everything sampled this step (kept by the batch filter or not), with
    ``batch_metrics`` (the generation batches' verifier fault counts and components' reports) as they are."""
    rewards = torch.cat([g.rewards for g in groups])
    shaping = torch.cat([g.shaping for g in groups])
    generations = [g for group in groups for g in group.generations]
    correct = [bool(v.correct) for group in groups for v in group.verdicts]  # a bool since Verdict.__post_init__
    lengths = torch.tensor([g.policy_tokens for g in generations], dtype=torch.float32)
    named = verdict_parts([v for group in groups for v in group.verdicts]) or {}
    extra = {f"reward/parts/{name}_mean": values.mean().item() for name, values in named.items()}
    baselines = [g.baseline for g in groups if g.baseline is not None]
    if baselines:  # greedy_baseline: every group has one
        extra["reward/baseline_mean"] = sum(baselines) / len(groups)
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "reward/correct_fraction": sum(correct) / len(correct),
        "reward/shaping_mean": shaping.mean().item(),
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/finished_fraction": sum(g.finished for g in generations) / len(generations),
        **extra,
        **batch_metrics,
    }


def fresh_prompts(train_set: Sequence[Sample], drawn: set[str], seed: int, count: int) -> list[Sample]:
    """Up to ``count`` prompts of ``train_set`` not yet ``drawn`` this step, drawn with ``seed``."""
    rng = random.Random(seed)
    unseen = [s for s in train_set if s.prompt not in drawn]
    return rng.sample(unseen, k=min(count, len(unseen)))


def _rollout_logprobs(generations: list[Generation], mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(mask)
    for row, g in enumerate(generations):
        out[row, : len(g.response_logprobs)] = torch.tensor(g.response_logprobs, dtype=out.dtype)
    return out
