"""Reward shapers: terms added to the verifier's rewards before advantages are computed.

The loop applies the configured shapers (``algorithm.reward_shaping``, a list) in order after the verifier:
``reward <- reward + sum_k shaper_k.shape(reward, lengths, budget)``, with ``lengths`` the responses' token counts
and ``budget`` the rollout's ``max_new_tokens`` (multi-turn episodes: the policy's tokens over all turns, and
``max_new_tokens`` times ``episode.max_turns``). A shaper given a response longer than the length it is built
for raises :class:`ResponseTooLong` (:meth:`RewardShaper.check_within`) naming itself and the lengths;
:meth:`RewardShaper.budget_problems` lets the config check reject such a set-up before a run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlzoo.errors import RlzooError
from rlzoo.interfaces.base import Component

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import Problem, RunFacts


class ResponseTooLong(RlzooError):
    """A reward shaper was given a response longer than the length it is built for."""


class RewardShaper(Component):
    """``shape(rewards [B], lengths [B], budget) -> [B]``: the term added to each response's reward."""

    kind = "reward_shaper"
    metric_namespace = "shaping"

    def shape(self, rewards: torch.Tensor, lengths: torch.Tensor, budget: int) -> torch.Tensor:
        raise NotImplementedError

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """:meth:`budget_problems` for responses of up to ``rollout.max_new_tokens`` tokens (per turn of an episode:
        :meth:`rlzoo.config.schema.RunConfig.response_budget`)."""
        return [(at, problem) for problem in self.budget_problems(run.config.response_budget())]

    def budget_problems(self, budget: int) -> list[str]:
        """Why this shaper cannot shape responses of up to ``budget`` tokens (empty when it can)."""
        return []

    def check_within(self, lengths: torch.Tensor, limit: int, what: str) -> None:
        """Raise :class:`ResponseTooLong` naming this shaper if a response is longer than ``limit`` (``what``)."""
        if len(lengths) and int(lengths.max()) > limit:
            longest = int(lengths.max())
            raise ResponseTooLong(
                f"reward shaper {self.name!r}: a response of {longest} tokens exceeds {what} of {limit} tokens"
            )
