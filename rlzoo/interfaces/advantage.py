"""Advantage sources: turn verifier rewards into per-token advantages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from rlzoo.interfaces.base import Component
from rlzoo.interfaces.run_facts import Problem, RunFacts
from rlzoo.interfaces.token_stats import token_statistic_names


@dataclass
class RewardBatch:
    """What an advantage source sees for one rollout batch.

    rewards:      ``[batch]`` outcome reward of each response.
    group_index:  ``[batch]`` long; responses with the same value were sampled from the same prompt.
    mask:         ``[batch, tokens]`` response mask (1 on response tokens).
    step_rewards: per response, the reward of each step (process verifiers), or ``None``.
    step_ends:    per response, the exclusive end token index (within the response) of each step, aligned
                  with ``step_rewards``; tokens after the last step belong to no step.
    token_rewards: ``[batch, tokens]`` the same rewards per token (verl's ``token_level_rewards``): each response's
                  outcome reward (verifier + shapers) at its last policy token, an environment's turn rewards at
                  their turn's last policy token, minus the KL-in-reward penalty where configured
                  (``algorithm.kl_in_reward``); 0 elsewhere. Built by the core for every batch.
    values:       ``[batch, tokens]`` the critic's value of the state before each response token (its prediction
                  at the position that predicts the token), for sources that declare ``needs_values``; else None.
    teacher_logprobs: ``[batch, tokens]`` the teacher's log-prob of each sampled response token (``teacher``), for
                  sources that declare ``needs_teacher``; else None.
    old_logprobs: ``[batch, tokens]`` the behaviour policy's log-prob of each sampled token (the loop's old
                  log-probs), for sources that declare ``needs_teacher`` or any ``needs_token_stats``; else None.
    reward_parts: part name -> ``[batch]``, the named parts of each response's reward (:attr:`Verdict.parts`; a
                  response whose verdict lacks a part has 0 there, as a verifier fault scores 0), plus ``shaping``
                  (the reward shapers' terms, when there are shapers) and ``turns`` (an environment's turn rewards,
                  when it gives them); None when no verdict of the batch carries parts.
    reward_baselines: ``[batch]`` each response's baseline reward: the reward (verifier, turn rewards and shapers'
                  terms) of one greedy response to the same prompt (ReMax), for sources that declare
                  ``needs_greedy_baseline``; else None.
    token_stats:  name -> ``[batch, tokens]``, each per-token statistic of the old policy's next-token distribution
                  the source declares in ``needs_token_stats`` (e.g. ``sum_pi_squared``: ``sum_v pi_old(v |
                  context_t)^2``), from no-grad passes of the training engine under the weights of the old pass
                  (:mod:`rlzoo.interfaces.token_stats`); empty for a source that declares none.
    rollout_is_weights: ``[batch, tokens]`` the train-inference correction's weights of each response token (the
                  ``algorithm.correction``'s, e.g. ``tis``: verl's ``rollout_is_weights``; no gradient), for sources
                  that read them (the optimal token baseline's ``rollout_is``); ``rlzoo train`` passes the step's
                  correction weights. Else None.
    """

    rewards: torch.Tensor
    group_index: torch.Tensor
    mask: torch.Tensor
    step_rewards: list[list[float]] | None = None
    step_ends: list[list[int]] | None = None
    token_rewards: torch.Tensor | None = None
    values: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    reward_parts: dict[str, torch.Tensor] | None = None
    reward_baselines: torch.Tensor | None = None
    token_stats: Mapping[str, torch.Tensor] = field(default_factory=dict)
    rollout_is_weights: torch.Tensor | None = None

    def require(self, source: str, what: str, *fields: str) -> None:
        """Raise a clear error naming the ``fields`` advantage ``source`` reads that this batch lacks (``what``: what
        they hold, for the message)."""
        missing = [name for name in fields if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"advantage {source!r} needs RewardBatch.{' and RewardBatch.'.join(missing)} ({what}); none was given"
            )

    def require_token_stats(self, source: str, *names: str) -> None:
        """Raise a clear error naming the token statistics advantage ``source`` reads that this batch lacks."""
        missing = [name for name in names if name not in self.token_stats]
        if missing:
            raise ValueError(
                f"advantage {source!r} needs RewardBatch.token_stats[{']['.join(map(repr, missing))}] (declare them in "
                "needs_token_stats; from a loop of your own, pass them); none was given"
            )


class AdvantageSource(Component):
    """Computes ``[batch, tokens]`` advantages (zero at masked positions) from a :class:`RewardBatch`.

    Outcome sources give every token of a response the same value; process sources may vary inside a response.
    Capabilities (class attributes, read by the run's assembly; never probed):

    - ``needs_step_rewards``: a process verifier must supply ``step_rewards``;
    - ``needs_values``: the source reads ``RewardBatch.values``, so the run needs a critic (``algorithm.critic``);
      such a source also gives the critic its regression targets (:meth:`advantages_and_returns`);
    - ``reads_token_rewards``: the source reads ``RewardBatch.token_rewards``, where the KL-in-reward penalty is
      (``algorithm.kl_in_reward`` needs such a source: the others would silently ignore it);
    - ``needs_teacher``: the source reads ``RewardBatch.teacher_logprobs`` and ``old_logprobs``, so the run needs a
      teacher (``teacher``, on-policy distillation); a run with a teacher needs such a source;
    - ``needs_reward_parts``: the source reads ``RewardBatch.reward_parts``, so the verifier must return named parts
      (checked before the run when the verifier declares its parts, :meth:`Verifier.reward_parts`);
    - ``needs_greedy_baseline``: the source reads ``RewardBatch.reward_baselines``, so each step also samples and
      scores one greedy response per prompt (ReMax);
    - ``needs_token_stats``: the names of the per-token statistics the source reads in ``RewardBatch.token_stats``
      (and ``old_logprobs``), each registered in :mod:`rlzoo.interfaces.token_stats`: each step runs one more no-grad
      pass of the training engine per name, which must declare ``computes_token_stats``; a router policy that
      replays experts is refused with them (those passes route afresh).
    - ``needs_groups``: the source compares each response with the others sampled from its prompt (a group baseline
      or normalisation), so a lone response gets advantage 0: ``rollout.group_size: 1`` is refused rather than run
      with zero advantages.
    """

    kind = "advantage"
    metric_namespace = "advantage"
    needs_step_rewards: ClassVar[bool] = False
    needs_values: ClassVar[bool] = False
    reads_token_rewards: ClassVar[bool] = False
    needs_teacher: ClassVar[bool] = False
    needs_reward_parts: ClassVar[bool] = False
    needs_greedy_baseline: ClassVar[bool] = False
    needs_token_stats: ClassVar[frozenset[str]] = frozenset()
    needs_groups: ClassVar[bool] = False

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        raise NotImplementedError

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        problems = []
        if self.needs_values and run.config.algorithm.critic is None:
            usable = run.names("advantage", lambda cls: not cls.needs_values)
            problems.append(
                (
                    "algorithm.critic",
                    f"null, but advantage {self.name!r} ({at}) reads a critic's values: add a critic (algorithm.critic: "
                    f"{{}}, or preset: ppo), or use an advantage that needs none ({', '.join(usable)})",
                )
            )
        if run.config.algorithm.kl_in_reward is not None and not self.reads_token_rewards:
            usable = run.names("advantage", lambda cls: cls.reads_token_rewards)
            problems.append(
                (
                    "algorithm.kl_in_reward",
                    f"advantage {self.name!r} ({at}) reads one reward per response, so a per-token KL penalty would be "
                    f"lost; use an advantage that reads token rewards ({', '.join(usable)}), or the KL as a loss term "
                    "(algorithm.kl_coef) with kl_in_reward: null",
                )
            )
        if self.needs_teacher and run.config.teacher is None:
            usable = run.names("advantage", lambda cls: not cls.needs_teacher)
            problems.append(
                (
                    "teacher",
                    f"null, but advantage {self.name!r} ({at}) reads a teacher's log-probs: add a teacher (teacher: "
                    "{model: <a model folder>} or {tiny: {...}}), or use an advantage that needs none "
                    f"({', '.join(usable)})",
                )
            )
        verifier = run.components.get("verifier")  # null: the task's default, which declares no parts
        if self.needs_reward_parts and verifier is not None and verifier.reward_parts() == ():
            usable = run.names("advantage", lambda cls: not cls.needs_reward_parts)
            problems.append(
                (
                    "verifier",
                    f"{verifier.name!r} returns no reward parts, but advantage {self.name!r} ({at}) normalises each part "
                    "on its own: use a verifier that returns named parts (weighted: one part per verifier it combines), "
                    f"or an advantage that reads the reward alone ({', '.join(usable)})",
                )
            )
        if self.needs_token_stats:
            problems += self._token_stats_problems(run, at)
        if self.needs_groups and run.config.rollout.group_size < 2:
            usable = run.names("advantage", lambda cls: not cls.needs_groups)
            problems.append(
                (
                    "rollout.group_size",
                    f"{run.config.rollout.group_size}, but advantage {self.name!r} ({at}) compares each response with "
                    "the others sampled from its prompt, so a lone response's advantage is 0 and nothing would be "
                    f"learnt: sample at least 2 per prompt, or use an advantage without a group baseline "
                    f"({', '.join(usable)})",
                )
            )
        return problems

    def _token_stats_problems(self, run: RunFacts, at: str) -> list[Problem]:
        usable = ", ".join(run.names("advantage", lambda cls: not cls.needs_token_stats))
        names = ", ".join(sorted(self.needs_token_stats))
        unknown = sorted(set(self.needs_token_stats) - set(token_statistic_names()))
        if unknown:
            return [
                (
                    "algorithm.advantage",
                    f"advantage {self.name!r} ({at}) reads the token statistic {unknown[0]!r}, which no provider computes "
                    f"(registered: {', '.join(token_statistic_names())}); install the plugin that registers it",
                )
            ]
        engine = run.training_engine
        if engine is not None and not type(engine).computes_token_stats:
            able = ", ".join(run.names("training_engine", lambda cls: cls.computes_token_stats))
            return [
                (
                    "trainer.engine.name",
                    f"{engine.name!r} does not compute token statistics ({names}), which advantage {self.name!r} ({at}) "
                    f"reads at every response position; use a training engine that does ({able}), or another advantage "
                    f"({usable})",
                )
            ]
        router = run.components.get("algorithm.router")
        if router is not None and router.replays_routing():
            return [
                (
                    "algorithm.router",
                    f"{router.name!r} replays expert routing, but the pass that computes the token statistics ({names}) "
                    f"for advantage {self.name!r} ({at}) routes afresh; use algorithm.router: null, or another advantage "
                    f"({usable})",
                )
            ]
        return []

    def advantages_and_returns(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The advantages and the critic's ``[batch, tokens]`` targets (returns); ``None`` targets for sources
        that use no critic. Sources with ``needs_values`` override this (one pass gives both)."""
        return self.compute(batch), None
