"""Advantage sources: turn verifier rewards into per-token advantages."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlzoo.interfaces.base import Component


@dataclass
class RewardBatch:
    """What an advantage source sees for one rollout batch.

    rewards:      ``[batch]`` outcome reward of each response.
    group_index:  ``[batch]`` long; responses with the same value were sampled from the same prompt.
    mask:         ``[batch, tokens]`` response mask (1 on response tokens).
    step_rewards: per response, the reward of each step (process verifiers), or ``None``.
    step_ends:    per response, the exclusive end token index (within the response) of each step, aligned
                  with ``step_rewards``; tokens after the last step belong to no step.
    """

    rewards: torch.Tensor
    group_index: torch.Tensor
    mask: torch.Tensor
    step_rewards: list[list[float]] | None = None
    step_ends: list[list[int]] | None = None


class AdvantageSource(Component):
    """Computes ``[batch, tokens]`` advantages (zero at masked positions) from a :class:`RewardBatch`.

    Outcome sources give every token of a response the same value; process sources may vary inside a response.
    ``needs_step_rewards`` tells the loop that a process verifier must supply ``step_rewards``.
    """

    kind = "advantage"
    metric_namespace = "advantage"
    needs_step_rewards: bool = False

    def compute(self, batch: RewardBatch) -> torch.Tensor:
        raise NotImplementedError
