"""Batch filters: which scored groups of a generation batch are worth training on.

After the verifier (and the reward shapers) scored a generation batch, :meth:`BatchFilter.keep` says, per prompt
group, whether to keep it. The loop keeps sampling fresh prompts, one generation batch of
``rollout.prompts_per_step`` prompts at a time, until ``prompts_per_step`` groups are kept or
:meth:`BatchFilter.max_gen_batches` batches were generated; it then trains on the first ``prompts_per_step`` kept
groups, or on what it has (an under-filled batch, logged), or skips the update when no group was kept.
"""

from __future__ import annotations

import torch

from rlzoo.interfaces.base import Component


class BatchFilter(Component):
    """``keep(rewards [B], group_index [B]) -> [G]`` bool, one flag per prompt group of a generation batch."""

    kind = "batch_filter"
    metric_namespace = "filter"

    def max_gen_batches(self) -> int:
        """The most generation batches the loop samples in one step to fill it (1: never sample more)."""
        return 1

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        """``rewards`` are the final (shaped) rewards; ``group_index[i]`` is row ``i``'s group in ``0..G-1``.
        The base keeps every group."""
        return torch.ones(int(group_index.max()) + 1 if len(group_index) else 0, dtype=torch.bool)
